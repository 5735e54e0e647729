"""Lock an engine on the controller, with no host: the first step of an air-gapped deploy.

    python -m operations.lock INVENTORY --python 3.11 [--data KEY=VALUE ...] [--force]

A lock names its target (Linux x86_64, one CPython minor) and nothing of the host that makes
it, so the controller can resolve it from the indexes the settings name, exactly as the first
host of an engine would (the same project file, operations/plan/engine_spec.project_toml). It is
written where the engine step looks for it (`engine_lock_dir/<name>.lock`); then
`scripts/fill_wheelhouse.py` fetches exactly its wheels and the deploy installs them with no
index. `--python` is the hosts' python3 minor: it is part of the engine's name, so a lock made
for another Python is never used by a host (the plan shows the name it looks for).

uv resolves for that Python with an interpreter of it on this controller and never downloads
one (`--no-python-downloads`): locking for 3.12 needs a python3.12 on PATH (`apt-get install
python3.12`, or `uv python install 3.12` once, by hand). uv's own lines are shown as they come,
with a line every 15 seconds while it resolves. Every problem (an unknown release, a
lane the release lacks, an index that cannot be reached, named by its setting) is one line,
exit status 1, and no lock is written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from operations import kb as kbmod
from operations import layout
from operations.plan.engine_lock_check import check_lock, lock_sources
from operations.plan.engine_spec import (
    EngineError,
    EngineSpec,
    engine_spec,
    indexes,
    lock_path,
    project_toml,
)
from operations.redact import redact
from operations.runtime.inventory import (
    DATA_HELP,
    InventoryError,
    open_session,
    parse_data,
    said,
)
from operations.settings import Settings

LOCK_TIMEOUT_S = 1800
HEARTBEAT_S = 15


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
    `dest`. The project file may hold index credentials: it lives in a private temporary directory,
    is mode 600 before its first byte, and never reaches a command line. The lock passes the same
    check as a host's (operations/plan/engine_lock_check.py) before it is written: a lock that
    fails is not kept."""
    with tempfile.TemporaryDirectory(prefix="sglang-lock-") as work:
        project = Path(work) / "pyproject.toml"
        fd = os.open(project, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(project_toml(settings, spec, None))
        said = run_uv(
            [uv, "lock", "--no-progress", "--no-python-downloads", "--directory", work],
            spec.name,
        )
        if said is not None:
            raise LockError(uv_problem(said, settings, spec))
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


def run_uv(argv: list[str], name: str) -> str | None:
    """Run uv, echoing each line it prints (redacted) to stderr as it comes and a line every
    HEARTBEAT_S seconds while it is quiet; None when it succeeds, else what it said."""
    print(f"{name}: resolving with uv (minutes on a cold cache)", file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace"
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(redact(line.rstrip()))
            print(f"  uv: {lines[-1]}", file=sys.stderr, flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if elapsed > LOCK_TIMEOUT_S:
                proc.kill()
                proc.wait()
                reader.join()
                return f"uv lock did not end within {LOCK_TIMEOUT_S}s"
            print(f"{name}: still resolving ({elapsed:.0f}s)", file=sys.stderr, flush=True)
    reader.join()
    if proc.returncode == 0:
        print(f"{name}: resolved in {time.monotonic() - start:.0f}s", file=sys.stderr)
        return None
    return "\n".join(lines).strip()


def uv_problem(said: str, settings: Settings, spec: EngineSpec) -> str:
    """uv's failure in one line: the index it could not reach named by the setting that points
    there, a missing interpreter by what to install; else uv's last line."""
    lowered = said.lower()
    if "no interpreter found" in lowered or (
        "interpreter" in lowered and f"python{spec.python}" in lowered
    ):
        return (
            f"uv found no Python {spec.python} on this controller (it never downloads one): "
            f"install python{spec.python} (apt-get install python{spec.python}, or once "
            f"`uv python install {spec.python}`), or lock for the hosts' Python with --python"
        )
    settings_of = {
        "torch": "torch_index_url",
        "kernel": "kernel_index_url",
        "flashinfer": "flashinfer_index_url",
    }
    pins = {pin.index_name: pin.index for pin in spec.pins if pin.index_name}
    for index in indexes(settings, spec):
        shown = redact(index.url).rstrip("/")
        if shown and shown in said:
            key = settings_of.get(pins.get(index.name, ""), "an index setting")
            return f"uv could not read {shown} ({key}): {_last_line(said)}"
    if settings.package_index_url and redact(settings.package_index_url).rstrip("/") in said:
        shown = redact(settings.package_index_url).rstrip("/")
        return f"uv could not read {shown} (package_index_url): {_last_line(said)}"
    return f"uv could not lock {spec.name}: {_last_line(said)}"


def _last_line(said: str) -> str:
    """uv's cause: its last non-empty line, without its "Caused by:" or "error:" prefix."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    for prefix in ("Caused by:", "cause:", "error:", "×"):
        last = last.removeprefix(prefix).strip()
    return last


def refusals(settings: Settings, knowledge: kbmod.Knowledge) -> list[str]:
    """Why the resolver refuses this release and lane, host or no host (as the plan says)."""
    from operations.plan.resolver.context import Resolution
    from operations.plan.resolver.engine import check_lane, check_release
    from operations.plan.resolver.types import Facts

    ctx = Resolution(settings, Facts(), knowledge)
    check_release(ctx)
    if not ctx.plan.errors:
        check_lane(ctx)
    return ctx.plan.errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=layout.command("lock"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inventory", help="an inventory file, as pyinfra takes it")
    parser.add_argument("--python", required=True, help="the hosts' python3 minor, e.g. 3.11")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help=DATA_HELP)
    parser.add_argument("--force", action="store_true", help="lock again over an existing lock")
    args = parser.parse_args(argv)
    try:
        session = open_session(args.inventory, parse_data(args.data))
    except InventoryError as exc:  # the inventory or --data: one line
        print(said(exc), file=sys.stderr)
        return 1
    # No host is contacted: a lock is made from the settings alone, and only when every
    # host's settings pass (as a deploy).
    for problem in session.all_problems:
        print(f"error: {problem}", file=sys.stderr)
    if session.problems:
        return 1
    loaded = session.settings
    knowledge = kbmod.load()
    done: set[str] = set()
    failed = False
    for name, settings in loaded.items():
        refused = refusals(settings, knowledge)
        for why in refused:
            print(f"error: {name}: {why}", file=sys.stderr)
        release = knowledge.releases.get(settings.sglang_version)
        if refused or release is None:
            failed = True
            continue
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
