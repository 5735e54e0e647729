"""What the deploy's operations do on the controller, not on the host: pyinfra FunctionCommands
(`function(state, host, *args) -> bool`, run in the operation's turn) and the reads an
operation makes of the controller's files.

- `fail`: end the host's run with a message (a wheel or an archive the controller lacks);
- the engine's uv lock (setting engine_lock_dir): a lock is uploaded only when it passes the
  lock check (operations/plan/engine_lock_check.py), and a lock downloaded from the host
  (engine.fetch_lock) is kept only when it passes it, else deleted.
"""

from __future__ import annotations

import os

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State

from operations.plan.engine_lock_check import LockSources, check_lock


def fail(state: State, host: Host, message: str) -> bool:
    """Fail the host's operation with `message` (a FunctionCommand)."""
    logger.error(f"{host.print_prefix}{message}")
    return False


def refused(lock: str, problems: list[str], deleted: bool) -> str:
    what = "deleted, not kept" if deleted else "not uploaded"
    return f"the lock {lock} fails the lock check ({what}):" + "".join(
        f"\n    {p}" for p in problems
    )


def upload_refusal(
    lock: str,
    registries: list[str],
    wheelhouse: str | None,
    wheelhouse_files: list[str] | None,
) -> str | None:
    """Why the controller's lock may not be uploaded (it fails the lock check); None: it may."""
    sources = LockSources.from_args(registries, wheelhouse, wheelhouse_files)
    with open(lock) as text:
        problems = check_lock(text.read(), sources)
    return refused(lock, problems, False) if problems else None


def keep_lock(
    state: State,
    host: Host,
    partial: str,
    dest: str,
    registries: list[str],
    wheelhouse: str | None,
    wheelhouse_files: list[str] | None,
) -> bool:
    """Keep the downloaded lock as DEST if it passes the lock check, else delete it."""
    sources = LockSources.from_args(registries, wheelhouse, wheelhouse_files)
    with open(partial) as lock:
        problems = check_lock(lock.read(), sources)
    if problems:
        os.remove(partial)
        return fail(state, host, refused(dest, problems, True))
    os.replace(partial, dest)
    return True


def local_dir(state: State, host: Host, path: str) -> bool:
    """Make a directory on the controller (a FunctionCommand)."""
    os.makedirs(path or ".", exist_ok=True)
    return True
