"""The health wait (programs/wait_healthy.py) as an operation, for the serve step's ranks and
batches and the router's (re)start."""

from __future__ import annotations

import shlex

from pyinfra.api.operation import operation

from operations import layout
from operations.runtime.host_call import Commands

WAIT_SCRIPT = layout.WAIT_SCRIPT


@operation(is_idempotent=False)
def wait_healthy(
    checks: list[tuple[str, str]],
    timeout_s: int,
    service_user: str,
    hint: str = "",
    phases: str = "",
    silence_s: int = 0,
) -> Commands:
    """
    Wait until every unit answers 200 on its /health URL; fail with the unit's journal.

    + checks: (unit, health URL) pairs
    + timeout_s: the deadline
    + service_user: a 200 counts only from its listener; another user's fails the wait
    + hint: printed on failure (how to go back)
    + phases: the release's start-up lines (the plan's JSON): each start read phase by phase
    + silence_s: with phases, a start silent in its journal this long fails
    """
    words = ["python3", WAIT_SCRIPT, "--timeout", str(timeout_s), "--service-user", service_user]
    if hint:
        words += ["--hint", hint]
    if phases:
        words += ["--phases", phases, "--silence", str(silence_s)]
    words += [f"{unit}={url}" for unit, url in checks]
    yield shlex.join(words)
