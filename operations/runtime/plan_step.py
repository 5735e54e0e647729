"""The plan step of every deploy, once the host is locked: facts gathered, preflight and
resolver run, the plan printed; a host that fails is stopped before any change (refused as
operations/runtime/inventory.py refuses: failed in pyinfra's state, the run exits 1).
"""

from __future__ import annotations

from pyinfra.api.host import Host
from pyinfra.api.state import State
from rich.console import Console

from operations.cli.report import host_panel
from operations.plan.host_plan import HostReport
from operations.runtime.gather import plan_for_host
from operations.runtime.inventory import inventory_settings, refuse


def plan_or_refuse(state: State, host: Host) -> HostReport | None:
    """The host's plan when it may go on; otherwise refuse the host and return None."""
    everyone = inventory_settings(state)
    settings = dict(everyone)[host.name]
    report = plan_for_host(host, settings, everyone)
    # Compact; `python -m operations.plan INVENTORY --why` gives every reason and source.
    Console(stderr=True).print(host_panel(host.name, report, changes=False))
    if report.ok:
        return report
    refuse(state, host, refusal(report))
    return None


def refusal(report: HostReport) -> str:
    """What a refused host logs: every problem in full, one per line, as the panel does."""
    errors = report.errors
    return "\n".join([f"{len(errors)} problem(s), nothing changed:", *(f"- {e}" for e in errors)])
