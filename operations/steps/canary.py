"""The canary's host commands, for the serve step (operations/steps/serve.py runs them): a canary
batch's unit files copied aside before they are rewritten, put back by a rollback, the
comparison (programs/canary_compare.py), and the deploy failed with the plan's line after a
rollback. What runs and when, the plan decided (operations/plan/canary_plan.py)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State

from operations import layout
from operations.runtime.host_call import Commands, HostCall, run
from operations.runtime.host_lines import host_block, host_text


def backup_command(backup: Mapping[str, str]) -> str:
    """A canary batch's unit files copied aside before they are rewritten (the rollback's
    source): into CANARY_BACKUP_DIR, root's and not writable by others, as the CanaryState fact
    trusts it (facts/canary.py). `cp --remove-destination` never writes through a link left
    there."""
    words = [f"install -d -m 0755 -o root -g root {shlex.quote(layout.CANARY_BACKUP_DIR)}"]
    for unit, copy in sorted(backup.items()):
        source, target = shlex.quote(unit), shlex.quote(copy)
        words.append(f"cp --remove-destination {source} {target}")
        words.append(f"chmod 0644 {target}")
    return " && ".join(words)


def restore_command(restore: Mapping[str, str]) -> str:
    """The canary ranks' unit files put back from their copies (a rollback)."""
    words = []
    for copy, unit in sorted(restore.items()):
        words.append(f"cp --remove-destination {shlex.quote(copy)} {shlex.quote(unit)}")
        words.append(f"chmod 0644 {shlex.quote(unit)}")
    return " && ".join(words)


@operation(is_idempotent=False)
def canary_compare(argv: list[str], rollback: str = "") -> Commands:
    """
    The canary against its baseline (programs/canary_compare.py): the verdict table, the
    record, and on a failed verdict the rollback's steps; a failed verdict fails the deploy.

    + argv: the plan's command line (canary_plan.compare_argv)
    + rollback: the roll batch steps (JSON) that put the canary ranks back on their old units
    """
    words = [*argv, "--rollback", rollback] if rollback else list(argv)
    yield HostCall(_compared, (shlex.join(words),), {})


def _compared(state: State, host: Host, arguments: ConnectorArguments, command: str) -> bool:
    """Run the comparison; its verdict table and last line are the deploy's (an error when
    the verdict failed), as the throughput check prints its line (steps/throughput.py)."""
    status, output = run(host, arguments, command)
    lines = [x for x in output.stdout.splitlines() if x.strip()]
    start = next((i for i, x in enumerate(lines) if x.startswith("check ")), len(lines))
    verdict = [x for x in lines[start:] if not x.startswith(("roll batch", "drained", "readmit"))]
    said = verdict or (output.stderr.strip().splitlines() or ["canary: no output"])[-1:]
    log = logger.info if status else logger.error
    table, last = (said[:-1], said[-1:]) if verdict and len(said) > 1 else ([], said)
    if table:
        log(host_block(host, "canary verdict:", table))
    for line in last:
        log(host_text(host, line))
    return bool(status)


@operation(is_idempotent=False)
def refused(line: str) -> Commands:
    """
    Fail the deploy here with the plan's line (after a canary's rollback).

    + line: what the deploy fails with
    """
    yield f"printf '%s\\n' {shlex.quote(line)} >&2; exit 1"
