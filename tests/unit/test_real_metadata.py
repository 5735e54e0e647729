"""Every engine the knowledge base can plan locks against the REAL index metadata, offline.

The project is the one production writes (engine_spec + project_toml); the indexes are the
snapshot of what `uv lock` read from PyPI, PyTorch's and SGLang's indexes
(tests/fixtures/index-snapshot/, refreshed by scripts/capture_index_snapshot.py), replayed on
loopback. Doubles carry only the requirements someone thought mattered; this carries them all,
so a conflict like sgl-project/sglang#25069 fails here.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from operations import kb as kb_module
from operations.kb import intake
from operations.plan.engine_lock_check import LockSources, check_lock
from tests.needs import missing
from tests.snapshot_index import (
    NEGATIVE_CASES,
    SNAPSHOT,
    LockCase,
    SnapshotIndex,
    build_cases,
    find_python,
    lock,
    production_spec,
)

pytestmark = pytest.mark.integration  # resolves locks with uv against local indexes

KB = kb_module.load()
CASES = build_cases(KB)

# Builds that do not lock against the real metadata yet: (release, lane) -> why. Strict: each
# must start failing the day it is fixed, and then leave this table.
_NO_KERNEL = (
    "sglang-kernel {pin} is not on SGLang's {lane} kernel index as captured "
    "(github.com/sgl-project/whl at 2504c0ad, 2026-07-01: newest sglang-kernel 0.4.4+{lane}); "
    "uv: 'there is no version of "
    "sglang-kernel=={pin}'. Needs a newer whl snapshot (tests/fixtures/sglang-whl/) or another pin"
)
KNOWN_FAILURES: dict[tuple[str, str], str] = {}
# A kernel-index pin the captured kernel index does not list (tests/fixtures/sglang-whl/, the
# newest fetchable snapshot): the lock cannot find it.
for _release, _entry in KB.releases.items():
    for _build in _entry.builds:
        for _package in _build.packages:
            listed = intake.index_files(_package.index_lane, _package.name)
            if _package.index == "kernel" and _package.version not in listed:
                KNOWN_FAILURES[(_release, _build.lane.name)] = _NO_KERNEL.format(
                    pin=_package.version, lane=_package.index_lane
                )


def _param(case: LockCase) -> Any:
    reason = KNOWN_FAILURES.get((case.release, case.lane))
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotIndex]:
    log = tmp_path_factory.mktemp("snapshot-index") / "http.log"
    with SnapshotIndex(log=log) as served:
        yield served


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One cache for the module: every lock reads the same snapshot, and a warm cache keeps
    # each lock to a few seconds.
    return tmp_path_factory.mktemp("uv-cache")


def _lock(
    case: LockCase, index: SnapshotIndex, tmp_path: Path, uv_cache: Path
) -> subprocess.CompletedProcess[str]:
    if find_python(case.python) is None:
        missing(f"no Python {case.python} here: uv lock needs an interpreter of it")
    return lock(case, index.base, tmp_path / "project", uv_cache, KB)


def _explicit_indexes(case: LockCase, base: str) -> set[str]:
    """The explicit indexes production's project names (engine_spec's pins)."""
    _, spec = production_spec(case, base, KB)
    return {p.index_name for p in spec.pins if p.index_name is not None}


def _packages(project: Path) -> dict[str, dict[str, Any]]:
    document = tomllib.loads((project / "uv.lock").read_text())
    return {p["name"]: p for p in document["package"]}


def test_every_build_has_a_case() -> None:
    builds = {(r, b.lane.name) for r, e in KB.releases.items() for b in e.builds}
    assert {(c.release, c.lane) for c in CASES} == builds


def test_the_snapshot_holds_every_release_it_is_asked_about() -> None:
    """A release added after the snapshot was captured (`operations.kb intake`) has no sglang
    metadata in it: its locks would fail as "no version of sglang". Say what to do instead."""
    sglang = SNAPSHOT / "main" / "sglang"
    missing = [r for r in KB.releases if not any(sglang.glob(f"sglang-{r}-*.metadata"))]
    assert not missing, (
        f"sglang {', '.join(missing)}: not in the index snapshot ({sglang}); recapture it: "
        ".venv/bin/python scripts/capture_index_snapshot.py --whl-repo <sgl-project/whl clone> "
        f"--release {' --release '.join(missing)}"
    )


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_build_locks_against_the_real_metadata(
    case: LockCase, index: SnapshotIndex, tmp_path: Path, uv_cache: Path
) -> None:
    proc = _lock(case, index, tmp_path, uv_cache)
    assert proc.returncode == 0, proc.stderr
    packages = _packages(tmp_path / "project")
    build = KB.releases[case.release].build(case.lane)
    assert build is not None
    torch = next(p for p in build.packages if p.name == "torch")
    assert packages["torch"]["version"] == torch.version
    assert packages["torch"]["source"] == {"registry": f"{index.base}/pytorch-{torch.index_lane}/"}
    # FlashInfer's prebuilt JIT modules where the knowledge base lists them: from FlashInfer's
    # index, with the sha256 its page gives, and nothing else (no requirements).
    _, spec = production_spec(case, index.base, KB)
    jit = spec.pin("flashinfer-jit-cache")
    if jit is not None:
        locked = packages["flashinfer-jit-cache"]
        assert locked["version"] == jit.version
        assert locked["source"] == {"registry": f"{index.base}/flashinfer-{case.lane}/"}
        assert "dependencies" not in locked, locked
    else:
        assert "flashinfer-jit-cache" not in packages
    if KB.lanes[case.lane].cuda.startswith("12."):
        bindings = packages["cuda-bindings"]["version"]
        assert Version(bindings) < Version("13"), f"cuda-bindings {bindings} on {case.lane}"
    # The controller would keep this lock (operations/plan/engine_lock_check.py) but for the PyTorch
    # wheels, whose sha256 the snapshot does not know (tests/fixtures/index-snapshot/SOURCE.md):
    # download.pytorch.org's pages announce one, and a lock without it is refused.
    lanes = {f"{index.base}/{n}/" for n in _explicit_indexes(case, index.base)}
    sources = LockSources((f"{index.base}/main/", *sorted(lanes)))
    problems = check_lock((tmp_path / "project" / "uv.lock").read_text(), sources)
    unhashed = {p.split(" ", 1)[0] for p in problems if p.endswith("has no hash")}
    assert unhashed <= {"torch", "torchvision", "torchaudio"}, problems
    assert len(unhashed) == len(problems), problems


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in NEGATIVE_CASES])
def test_a_conflict_in_the_real_metadata_fails_the_lock(
    case: LockCase, index: SnapshotIndex, tmp_path: Path, uv_cache: Path
) -> None:
    proc = _lock(case, index, tmp_path, uv_cache)
    culprit = "cuda-bindings" if case.without_override == "cuda-python" else "outlines-core"
    assert proc.returncode != 0, f"{case.id} locked, but must fail on {culprit}"
    assert "No solution found" in proc.stderr
    assert culprit in proc.stderr, proc.stderr
