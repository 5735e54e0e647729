"""scripts/fill_wheelhouse.py: exactly the lock's wheels, each checked against the lock's hash,
downloaded from an index served on loopback."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import fill_wheelhouse
from tests.doubles import wheels
from tests.e2e.index import LocalIndex


@pytest.fixture
def index(tmp_path: Path) -> Iterator[LocalIndex]:
    served = LocalIndex(tmp_path / "index")
    served.add(
        wheels.torch_wheel(tmp_path / "w", "2.11.0+cu128"),
        wheels.plain_wheel(tmp_path / "w", "cuda-python", "13.0.3"),
        sub="cu128",
    )
    served.start()
    yield served
    served.stop()


def lock_for(index: LocalIndex, tmp_path: Path, bad: str | None = None) -> Path:
    """A uv.lock in uv's own shape (version 1, [[package]] with wheels = [{url, hash}])."""
    lines = ["version = 1", "", "[[package]]", 'name = "sglang-engine"', 'version = "0"', ""]
    for name, file in (
        ("torch", "torch-2.11.0+cu128-py3-none-any.whl"),
        ("cuda-python", "cuda_python-13.0.3-py3-none-any.whl"),
    ):
        folder = index.root / "cu128" / name
        digest = hashlib.sha256((folder / file).read_bytes()).hexdigest()
        digest = "0" * 64 if name == bad else digest
        url = f"{index.base}/cu128/{name}/{file.replace('+', '%2B')}"
        lines += ["[[package]]", f'name = "{name}"', 'version = "1"']
        lines += [f'wheels = [{{ url = "{url}", hash = "sha256:{digest}" }}]', ""]
    lock = tmp_path / "engine.lock"
    lock.write_text("\n".join(lines))
    return lock


pytestmark = pytest.mark.integration  # runs the wheelhouse script with uv against a local index


def test_every_locked_wheel_lands_checked(index: LocalIndex, tmp_path: Path) -> None:
    dest = tmp_path / "wheelhouse"
    assert fill_wheelhouse.fill(lock_for(index, tmp_path), dest, "3.11", "2.36") == []
    assert sorted(p.name for p in dest.iterdir()) == [
        "cuda_python-13.0.3-py3-none-any.whl",
        "torch-2.11.0+cu128-py3-none-any.whl",
    ]


def test_a_wheel_whose_hash_differs_from_the_lock_is_not_kept(
    index: LocalIndex, tmp_path: Path
) -> None:
    dest = tmp_path / "wheelhouse"
    problems = fill_wheelhouse.fill(lock_for(index, tmp_path, bad="torch"), dest, "3.11", "2.36")
    assert problems == [
        "torch-2.11.0+cu128-py3-none-any.whl: sha256 differs from the lock's; not kept"
    ]
    assert [p.name for p in dest.iterdir()] == ["cuda_python-13.0.3-py3-none-any.whl"]
