"""scripts/fill_wheelhouse.py: exactly the lock's wheels, each checked against the lock's hash,
downloaded from an index served on loopback."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import fill_wheelhouse
from tests.doubles import cuda_redist, wheels
from tests.e2e.index import LocalIndex

SCRIPT = Path(fill_wheelhouse.__file__)


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


def fill_main(*args: str) -> tuple[int, str]:
    """`scripts/fill_wheelhouse.py ARGS` as a user runs it: (exit status, stderr)."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result.returncode, result.stderr


def test_a_missing_lock_is_one_line(tmp_path: Path) -> None:
    rc, err = fill_main(str(tmp_path / "nope.lock"), str(tmp_path / "wh"), "--no-cuda")
    assert rc == 1
    (line,) = err.splitlines()
    assert "nope.lock: no such file" in line and "-m operations.lock" in line


def test_an_unreachable_wheel_names_its_package(index: LocalIndex, tmp_path: Path) -> None:
    lock = lock_for(index, tmp_path)
    (index.root / "cu128" / "torch" / "torch-2.11.0+cu128-py3-none-any.whl").unlink()
    rc, err = fill_main(str(lock), str(tmp_path / "wh"), "--no-cuda")
    assert rc == 1
    problems = [ln for ln in err.splitlines() if "cannot download" in ln]
    assert len(problems) == 1 and problems[0].startswith("fill_wheelhouse: torch 1: "), err
    # Streamed and counted: the other wheel landed, each file a line (stderr is no terminal).
    assert "[2/2] cuda_python-13.0.3-py3-none-any.whl" in err, err
    assert "1 of 2 file(s) in place" in err
    assert not list((tmp_path / "wh").glob("*.partial"))


def test_the_lanes_compiler_archives_land_beside_the_wheelhouse_checked(
    index: LocalIndex, tmp_path: Path
) -> None:
    """The offline deploy takes them from cuda-redist/ beside the wheelhouse
    (operations/plan/engine_plan.redist_dir), each checked against the manifest's sha256."""
    redist = cuda_redist.build(index.root / "redist", "cu128")
    lock = lock_for(index, tmp_path)
    named = lock.rename(tmp_path / "0.5.11-cu128-cp311-00000000.lock")
    args = [str(named), str(tmp_path / "wh"), "--cuda-url", f"{index.base}/redist"]
    rc, err = fill_main(*args, "--cuda-manifest", str(redist.manifest))
    assert rc == 0, err
    landed = sorted(p.name for p in (tmp_path / "cuda-redist").iterdir())
    assert landed == sorted(p.name for p in redist.archives)
    # Against the knowledge base's own sha256 (NVIDIA's real archives), the doubles differ.
    (tmp_path / "cuda-redist" / redist.archives[0].name).unlink()
    rc, err = fill_main(*args)
    assert rc == 1 and f"{redist.archives[0].name}: sha256 differs" in err, err
