"""The tune's host command (`python -m operations.tune`, operations/tune_deploy.py): the script
shipped, then programs/tune.py run with the plan's command line (plan/tune_plan.py) and the
steps it runs around each candidate, written here as the serve step writes a roll batch's: out
of the router and drained, back in (router_workers.py, from the plan's DrainPlan; none without a
router), and the restart with the health wait and the chat question (the plan's `smoke`). What
runs, the plan decided."""

from __future__ import annotations

import json
import shlex

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State

from operations import layout
from operations.plan.host_plan import HostReport
from operations.plan.tune_plan import TunePlan
from operations.runtime.host_call import Commands, HostCall, run
from operations.runtime.host_lines import host_text
from operations.steps.health import wait_healthy
from operations.steps.host_files import put_planned
from operations.steps.serve import host_argv, restart_command, router_workers, workers_args
from operations.steps.smoke import smoke_requests


def _tuned(state: State, host: Host, arguments: ConnectorArguments, command: str) -> bool:
    """Run the tune, its lines streamed as they come (a tune takes hours: each candidate's line
    says how far it is and how much of the budget is left; then the table, the best and the
    group_data lines); an error when the rank could not be put back."""
    status, output = run(host, arguments, command, print_output=True)
    if not status:
        said = [x for x in output.stdout.splitlines() if x.startswith("tune")]
        last = (said or output.stderr.strip().splitlines() or ["tune: no output"])[-1]
        logger.error(host_text(host, f"the tune failed: {last}"))
    return bool(status)


@operation(is_idempotent=False)
def tune_run(argv: list[str]) -> Commands:
    """
    Run the tune (programs/tune.py) on one rank; fail when the rank is not back on its unit.

    + argv: the whole command line (no secret: the key is read from the secrets file)
    """
    yield HostCall(_tuned, (shlex.join(argv),), {})


Steps = list[tuple[str, list[str], list[str]]]


def tune_argv(report: HostReport, decided: TunePlan) -> list[str]:
    """The plan's command line with the router's and the restart's steps (the docstring)."""
    if decided.rank is None:
        raise OperationError("the tune step needs the plan's rank (tune_plan)")
    s, rank = report.settings, decided.rank
    unit = layout.unit_name(rank)
    drain = report.drain
    out: Steps = (
        []
        if drain is None
        else [("drain", host_argv(router_workers, **workers_args(drain, "out", [rank])), [])]
    )
    back: Steps = (
        []
        if drain is None
        else [("readmit", host_argv(router_workers, **workers_args(drain, "in", [rank])), [])]
    )
    health = host_argv(
        wait_healthy,
        checks=[(unit, layout.rank_health_url(s, rank))],
        timeout_s=s.health_timeout_s,
        service_user=s.service_user,
    )
    restart: Steps = [
        ("restart", ["/bin/sh", "-c", restart_command(unit)], []),
        ("health", health, []),
    ]
    if decided.smoke is not None:
        smoke = host_argv(
            smoke_requests,
            python=decided.smoke.python,
            model=s.model_name,
            timeout_s=s.smoke_timeout_s,
            targets=decided.smoke.targets,
            service_user=s.service_user,
        )
        restart.append(("smoke", smoke, []))
    words = [*decided.argv, "--out", json.dumps(out), "--in", json.dumps(back)]
    return [*words, "--restart", json.dumps(restart)]


def tune(report: HostReport, decided: TunePlan) -> None:
    """Ship the script; run the tune."""
    for file in decided.files:
        put_planned(file)
    tune_run(name=f"Tune | {layout.unit_name(decided.rank or 0)}", argv=tune_argv(report, decided))
