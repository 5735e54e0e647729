"""Lock an engine on the controller, with no host: the first step of an air-gapped deploy.

    python -m operations.lock INVENTORY --python 3.11 [--data KEY=VALUE ...] [--force]

A lock names its target (Linux x86_64, one CPython minor) and nothing of the host that makes
it, so the controller can resolve it from the indexes the settings name, exactly as the first
host of an engine would (the same project file, operations/engine_spec.project_toml). It is
written where the engine step looks for it (`engine_lock_dir/<name>.lock`); then
`scripts/fill_wheelhouse.py` fetches exactly its wheels and the deploy installs them with no
index. `--python` is the hosts' python3 minor: it is part of the engine's name, so a lock made
for another Python is never used by a host (the plan shows the name it looks for).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from operations import kb as kbmod
from operations import settings as settings_mod
from operations.engine_spec import EngineError, EngineSpec, engine_spec, lock_path, project_toml
from operations.lock_check import check_lock, lock_sources
from operations.plan import build_state, parse_data
from operations.redact import redact
from operations.settings import Settings

LOCK_TIMEOUT_S = 1800


class LockError(Exception):
    """A lock could not be made: the message says why and what to do."""


def uv_binary() -> str:
    """The controller's uv: the one beside this Python (make's venv), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        raise LockError("no uv on the controller: run `make` (it installs uv into .venv)")
    return found


def lock_engine(settings: Settings, spec: EngineSpec, dest: Path, uv: str) -> None:
    """Resolve `spec`'s project with uv against the settings' indexes and write its lock to
    `dest`. The project file may hold index credentials: it lives in a private temporary
    directory, is mode 600 before its first byte, and never reaches a command line. The lock
    passes the same check as a host's (operations/lock_check.py) before it is written: a lock
    that fails is not kept."""
    with tempfile.TemporaryDirectory(prefix="sglang-lock-") as work:
        project = Path(work) / "pyproject.toml"
        fd = os.open(project, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(project_toml(settings, spec, None))
        proc = subprocess.run(
            [uv, "lock", "--no-progress", "--no-python-downloads", "--directory", work],
            capture_output=True,
            text=True,
            timeout=LOCK_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            said = redact(proc.stderr.strip())[-2000:]
            raise LockError(f"uv could not lock {spec.name}:\n{said}")
        text = (Path(work) / "uv.lock").read_text()
        problems = check_lock(text, lock_sources(settings, spec))
        if problems:
            raise LockError(
                f"the lock of {spec.name} fails the lock check (not written):"
                + "".join(f"\n    {p}" for p in problems)
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        partial.write_text(text)
        os.replace(partial, dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operations.lock", description=__doc__)
    parser.add_argument("inventory")
    parser.add_argument("--python", required=True, help="the hosts' python3 minor, e.g. 3.11")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--force", action="store_true", help="lock again over an existing lock")
    args = parser.parse_args(argv)
    state = build_state(args.inventory, parse_data(args.data))
    loaded, problems = settings_mod.load_inventory(list(state.inventory))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    knowledge = kbmod.load()
    done: set[str] = set()
    failed = False
    for name, settings in loaded.items():
        release = knowledge.releases[settings.sglang_version]
        if args.python not in release.python.versions:
            print(
                f"error: {name}: sglang {settings.sglang_version} is not built for Python "
                f"{args.python}; it is for {', '.join(release.python.versions)} "
                f"({release.python.why})",
                file=sys.stderr,
            )
            failed = True
            continue
        try:
            spec = engine_spec(settings, knowledge, args.python)
        except EngineError as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            failed = True
            continue
        dest = Path(lock_path(settings, spec))
        if spec.name in done:
            continue
        done.add(spec.name)
        if dest.exists() and not args.force:
            print(f"{spec.name}: {dest} already holds its lock (--force to lock again)")
            continue
        try:
            lock_engine(settings, spec, dest, uv_binary())
        except (LockError, subprocess.TimeoutExpired, OSError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            failed = True
            continue
        print(f"{spec.name}: locked for Python {spec.python} into {dest}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
