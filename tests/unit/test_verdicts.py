"""Schema verdicts remembered (operations/settings/verdicts.py): a pass is taken from the record
only
for the very schema and document that passed, exact types included; failures are never
recorded; nothing is written where Python writes no bytecode."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from operations.settings import verdicts

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"dp_size": {"type": "integer"}, "ports": {"type": "array"}},
}


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "__pycache__" / "schema-verdicts.json"
    monkeypatch.setattr(verdicts, "RECORD", path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    verdicts._recorded.cache_clear()
    yield path
    verdicts._recorded.cache_clear()


def no_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("validated again")

    monkeypatch.setattr(jsonschema, "Draft202012Validator", refuse)


def test_a_pass_is_recorded_and_taken_from_the_record_in_the_next_run(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verdicts.errors(SCHEMA, {"dp_size": 8}) == []
    assert len(json.loads(record.read_text())) == 1
    verdicts._recorded.cache_clear()  # the next run reads the file
    no_validator(monkeypatch)
    assert verdicts.errors(SCHEMA, {"dp_size": 8}) == []


@pytest.mark.parametrize(
    ("passed", "other"),
    [
        ({"dp_size": 8}, {"dp_size": True}),  # a bool is no integer to a schema
        ({"dp_size": 8}, {"dp_size": 8.5}),
        ({"ports": [1, 2]}, {"ports": (1, 2)}),  # a tuple is no array; JSON would list it
        ({"dp_size": 8}, {"dp_size": "8"}),
    ],
    ids=["bool", "float", "tuple", "string"],
)
def test_a_document_that_differs_only_in_type_is_checked_again_and_fails(
    record: Path, passed: dict[str, Any], other: dict[str, Any]
) -> None:
    assert verdicts.errors(SCHEMA, passed) == []
    found = verdicts.errors(SCHEMA, other)
    assert [list(e.absolute_path) for e in found] == [[next(iter(other))]]


def test_a_failure_is_never_recorded(record: Path) -> None:
    for _ in range(2):
        (error,) = verdicts.errors(SCHEMA, {"dp_size": "eight"})
        assert error.message == "'eight' is not of type 'integer'"
    assert not record.exists()


def test_another_schema_checks_the_same_document_again(record: Path) -> None:
    assert verdicts.errors(SCHEMA, {"dp_size": 8}) == []
    stricter = {**SCHEMA, "required": ["ports"]}
    (error,) = verdicts.errors(stricter, {"dp_size": 8})
    assert error.validator == "required"


def test_a_value_of_a_type_it_cannot_tell_apart_is_checked_every_time(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {"dp_size": 8, "when": datetime.date(2026, 12, 1)}
    assert verdicts.errors(SCHEMA, document) == []
    assert not record.exists()
    no_validator(monkeypatch)
    with pytest.raises(AssertionError, match="validated again"):
        verdicts.errors(SCHEMA, document)


def test_nothing_is_written_where_python_writes_no_bytecode(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert verdicts.errors(SCHEMA, {"dp_size": 8}) == []
    assert not record.exists()


def test_only_the_newest_passes_are_kept(record: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdicts, "KEEP", 3)
    for size in range(5):
        verdicts.errors(SCHEMA, {"dp_size": size})
    kept = json.loads(record.read_text())
    assert len(kept) == 3
    newest = verdicts.digest("schema", verdicts._encoded(SCHEMA), verdicts._encoded({"dp_size": 4}))
    assert kept[-1] == newest
