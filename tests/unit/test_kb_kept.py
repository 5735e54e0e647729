"""The checked knowledge remembered (operations/kb/loader.py `load`): built and checked the
first time its inputs are read, read back while none changed, built and checked again (and
refused when broken) as soon as one did; an unreadable record is built afresh; nothing is
written where Python writes no bytecode."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from operations.kb import KNOWLEDGE_DIR, Knowledge, KnowledgeError, loader


@pytest.fixture
def knowledge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of knowledge/ the loader reads, and a bytecode directory of its own."""
    copy = tmp_path / "knowledge"
    shutil.copytree(KNOWLEDGE_DIR, copy)
    monkeypatch.setattr(loader, "KNOWLEDGE_DIR", copy)
    monkeypatch.setattr(loader, "KEPT_DIR", tmp_path / "__pycache__")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    loader.load.cache_clear()
    yield copy
    loader.load.cache_clear()


def kept(directory: Path) -> list[Path]:
    return sorted(directory.parent.joinpath("__pycache__").glob("knowledge-*.pickle"))


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(data: object) -> None:
        raise AssertionError("built and checked again")

    monkeypatch.setattr(loader, "build", refuse)


def same(a: Knowledge, b: Knowledge) -> bool:
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a))


def test_the_checked_knowledge_is_read_back_in_the_next_run(
    knowledge: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = loader.load()
    assert len(kept(knowledge)) == 1
    loader.load.cache_clear()  # the next run
    no_build(monkeypatch)
    again = loader.load()
    assert again is not built and same(again, built)
    # Read-only mappings stay read-only.
    with pytest.raises(TypeError):
        again.releases["9.9.9"] = again.releases[next(iter(again.releases))]  # type: ignore[index]


def test_a_changed_input_is_built_and_checked_again_and_a_broken_one_refused(
    knowledge: Path,
) -> None:
    loader.load()
    loader.load.cache_clear()
    text = (knowledge / "sglang.yaml").read_text()
    # A backend no entry defines: only the cross-reference check finds it.
    broken = text.replace("backends: [triton, trtllm_mha]", "backends: [triton, no_such]", 1)
    assert broken != text
    (knowledge / "sglang.yaml").write_text(broken)
    with pytest.raises(KnowledgeError):
        loader.load()
    # The broken build is never kept; the good one's record stays the only one.
    assert len(kept(knowledge)) == 1


def test_a_changed_cli_table_is_another_record(knowledge: Path) -> None:
    loader.load()
    first = kept(knowledge)
    loader.load.cache_clear()
    table = sorted((knowledge / "cli").glob("sglang-*.json"))[0]
    table.write_text(table.read_text() + "\n")
    loader.load()
    assert kept(knowledge) != first and len(kept(knowledge)) == 1


def test_an_unreadable_record_is_built_afresh(
    knowledge: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader.load()
    (record,) = kept(knowledge)
    record.write_bytes(b"not a pickle")
    loader.load.cache_clear()
    calls: list[object] = []
    real = loader.build

    def counted(data: object) -> Knowledge:
        calls.append(data)
        return real(data)

    monkeypatch.setattr(loader, "build", counted)
    loader.load()
    assert len(calls) == 1
    assert record.read_bytes() != b"not a pickle"


def test_nothing_is_written_where_python_writes_no_bytecode(
    knowledge: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    loader.load()
    assert kept(knowledge) == []
