"""The real index metadata, replayed offline: what `uv lock` of the production engine project
meets on PyPI, PyTorch's and SGLang's indexes, captured by scripts/capture_index_snapshot.py
into tests/fixtures/index-snapshot/ and served here on loopback by `python3 -m http.server`
(started and stopped by PID).

    with SnapshotIndex() as index:
        result = lock(LockCase("0.5.11", "cu128", "3.11"), index.base, workdir, cache)

The snapshot tree is what an index serves: `<index>/<project>/index.html` (PEP 503 with PEP 658
`data-core-metadata`) and `<file>.metadata` beside it; `<index>` is `main` (PyPI),
`pytorch-<lane>`, `sglang-<lane>` or `flashinfer-<lane>`, the names the engine project gives
its indexes.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from operations.kb import Knowledge
from operations.plan.engine_spec import EngineSpec, engine_spec, project_toml
from operations.settings import Settings
from tests.e2e.index import free_port, serve_directory, stop_process
from tests.unit.builders import make_settings

SNAPSHOT = Path(__file__).resolve().parent / "fixtures" / "index-snapshot"
# The Pythons a lock may be asked for: what the snapshot keeps wheels of.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
LOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class LockCase:
    """One `uv lock` of an engine project: a (release, lane) build for one Python, optionally
    without one of the knowledge base's overrides (the negative cases)."""

    release: str
    lane: str
    python: str
    without_override: str | None = None  # a project name: its override is dropped

    @property
    def id(self) -> str:
        base = f"{self.release}-{self.lane}-py{self.python}"
        return f"{base}-without-{self.without_override}-override" if self.without_override else base


def release_pythons(kb: Knowledge, release: str) -> tuple[str, ...]:
    """The Pythons the knowledge base claims for a release."""
    return kb.releases[release].python.versions


# Cases that must fail, to prove the test can: sgl-project/sglang#25069's conflict (torch's
# CUDA 12 build needs cuda-bindings<13, the release's cuda-python>=13.0 needs 13), and a Python
# the release has no wheels for (outlines-core 0.1.26 has no cp313 wheel).
NEGATIVE_CASES = (
    LockCase("0.5.11", "cu128", "3.11", without_override="cuda-python"),
    LockCase("0.5.11", "cu130", "3.13"),
)


def build_cases(kb: Knowledge) -> list[LockCase]:
    """Every (release, lane) build of the knowledge base for every Python it claims."""
    return [
        LockCase(release, build.lane.name, python)
        for release, entry in sorted(kb.releases.items())
        for build in entry.builds
        for python in release_pythons(kb, release)
    ]


def production_spec(case: LockCase, base_url: str, kb: Knowledge) -> tuple[str, EngineSpec]:
    """The engine project production writes for this case, its indexes on `base_url`."""
    settings = make_settings(
        sglang_version=case.release,
        cuda_lane=case.lane,
        package_index_url=f"{base_url}/main/",
        torch_index_url=f"{base_url}/pytorch-{{lane}}/",
        kernel_index_url=f"{base_url}/sglang-{{lane}}/",
        flashinfer_index_url=f"{base_url}/flashinfer-{{lane}}/",
    )
    spec = _engine_spec(settings, kb, case.python)
    if case.without_override is not None:
        dropped = tuple(o for o in spec.overrides if not _names(o, case.without_override))
        if dropped == spec.overrides:
            raise ValueError(
                f"{case.id}: the knowledge base has no {case.without_override} override"
            )
        spec = dataclasses.replace(spec, overrides=dropped)
    return project_toml(settings, spec, None), spec


def _engine_spec(settings: Settings, kb: Knowledge, python: str) -> EngineSpec:
    if python in kb.releases[settings.sglang_version].python.versions:
        return engine_spec(settings, kb, python)
    # A Python the release is not built for (a negative case): the project production would
    # write if it were.
    return dataclasses.replace(engine_spec(settings, kb), python=python)


def _names(requirement: str, project: str) -> bool:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name) == canonicalize_name(project)


def find_python(version: str) -> str | None:
    """An interpreter of `version` ("3.12") on this machine: `uv lock` needs one of the locked
    Python (it never downloads one here). PATH first, then pyenv's and uv's own installs."""
    candidates = [shutil.which(f"python{version}") or ""]
    home = Path.home()
    candidates += sorted(glob.glob(str(home / f".pyenv/versions/{version}.*/bin/python{version}")))
    candidates += sorted(
        glob.glob(str(home / f".local/share/uv/python/cpython-{version}.*/bin/python{version}"))
    )
    for candidate in candidates:
        if not candidate:
            continue
        proc = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return candidate
    return None


def uv_binary() -> str:
    return str(Path(sys.executable).with_name("uv"))


def run_lock(project_dir: Path, python: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """`uv lock` as the engine step runs it, with nothing from this machine's uv configuration
    or environment: only the project's own indexes are read. (UV_NO_CONFIG would also drop the
    project's own [tool.uv], indexes included: an empty XDG_CONFIG_HOME hides the user's.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    config_home = cache_dir.parent / "xdg-config-empty"
    config_home.mkdir(parents=True, exist_ok=True)
    env.update(
        XDG_CONFIG_HOME=str(config_home),
        UV_PYTHON_DOWNLOADS="never",
        UV_PYTHON=python,
        UV_CACHE_DIR=str(cache_dir),
        UV_NO_PROGRESS="1",
    )
    return subprocess.run(
        [uv_binary(), "lock"],
        cwd=project_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=LOCK_TIMEOUT_S,
        check=False,
    )


def lock(
    case: LockCase, base_url: str, workdir: Path, cache_dir: Path, kb: Knowledge
) -> subprocess.CompletedProcess[str]:
    """Write the case's production project under `workdir` and lock it against `base_url`."""
    python = find_python(case.python)
    if python is None:
        raise LookupError(f"no Python {case.python} on this machine")
    text, _ = production_spec(case, base_url, kb)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "pyproject.toml").write_text(text)
    return run_lock(workdir, python, cache_dir)


class SnapshotIndex:
    """The snapshot, served read-only on 127.0.0.1 by http.server in a child process."""

    def __init__(self, root: Path = SNAPSHOT, log: Path | None = None) -> None:
        self.root = root
        self.log = log
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        assert self.port is not None, "start() the index first"
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self.port = free_port()
        stderr = self.log.open("ab") if self.log is not None else subprocess.DEVNULL
        self._proc = serve_directory(self.root, self.port, stderr, "snapshot index")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)

    def __enter__(self) -> SnapshotIndex:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
