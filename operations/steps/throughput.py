"""Step 6 of the deploy: how fast the host serves, each rank's capacity at saturation.

After the smoke step, when the plan says so (operations/plan/throughput_plan.py: throughput_check
after_change when this run (re)started a rank or the router, or the last check did not pass,
always, or off), the host runs programs/throughput.py: the toolkit's own load client against
every rank at once, each rank read by its own counters, several rounds, bounded by
throughput_timeout_s. It appends a record to layout.THROUGHPUT_RECORDS and prints it with one
short line; a check slower than throughput_max_slowdown beyond its noise, against the median of
the last passed records or the best recent one, fails the deploy (throughput_guard: fail) naming
the records, the ratio, the noise and the ranks that fell, or passes with a warning (warn). The
ranks are never touched: a failed or interrupted check leaves them serving, and the next run
checks again.
"""

from __future__ import annotations

import shlex

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from operations.plan.host_plan import HostReport
from operations.runtime.host_call import Commands, HostCall, run
from operations.runtime.host_lines import host_text
from operations.steps.host_files import put_planned


def _measure(state: State, host: Host, arguments: ConnectorArguments, command: str) -> bool:
    """Run the program; its last line is the deploy's one line (an error when it failed)."""
    status, output = run(host, arguments, command)
    lines = [x for x in output.stdout.splitlines() if x.strip()]
    said = next((x for x in reversed(lines) if x.startswith(("throughput", "WARNING"))), "")
    said = said or (output.stderr.strip().splitlines() or ["throughput: no output"])[-1]
    if not status:
        logger.error(host_text(host, f"{said} (the ranks keep serving, untouched)"))
        return False
    log = logger.warning if said.startswith("WARNING") else logger.info
    log(host_text(host, said))
    return True


@operation(is_idempotent=False)
def throughput_run(argv: list[str], skip: str = "") -> Commands:
    """
    Run the throughput check (programs/throughput.py); fail with its verdict.

    + argv: the program's command line (no secret: the key is read from the secrets file)
    + skip: why nothing runs (empty argv)
    """
    if not argv:
        host.noop(f"throughput: not measured: {skip}")
        return
    yield HostCall(_measure, (shlex.join(argv),), {})


def throughput(report: HostReport) -> None:
    """Ship the script; run what the plan says (HostReport.throughput)."""
    decided = report.throughput
    if decided is None:
        raise OperationError("the throughput step needs the plan's ThroughputPlan (host_plan)")
    for file in decided.files:
        put_planned(file)
    run = decided.run
    throughput_run(
        name="Throughput | load client",
        argv=run.argv if run is not None else [],
        skip=decided.skip,
    )
