"""The first step of every deploy: settings checked for the whole inventory, facts gathered,
preflight and resolver run, the plan printed; a host that fails is stopped before any change.
"""

from __future__ import annotations

from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from rich.console import Console

from operations import settings as settings_mod
from operations.host_plan import HostReport, plan_for_host
from operations.report import host_panel

# Settings of the whole inventory, loaded once per pyinfra run (deploy.py runs once per host).
_inventory_settings: dict[int, list[tuple[str, settings_mod.Settings]]] = {}


class SettingsInvalid(PyinfraError):
    """Raised while loading deploy.py: pyinfra prints it as one message, no traceback."""


def inventory_settings(state: State) -> list[tuple[str, settings_mod.Settings]]:
    """Every host's settings, checked all at once before the first fact is gathered."""
    if id(state) not in _inventory_settings:
        loaded, problems = settings_mod.load_inventory(state.inventory)
        if problems:
            raise SettingsInvalid(
                "invalid settings, nothing was changed:\n  " + "\n  ".join(problems)
            )
        _inventory_settings[id(state)] = list(loaded.items())
    return _inventory_settings[id(state)]


def _refuse(state: State, host: Host, summary: str) -> bool:
    first, *rest = summary.splitlines() or [""]
    logger.error(f"{host.print_prefix}refused: {first}")
    for line in rest:
        logger.error(f"{host.print_prefix}  {line}")
    return False


@operation(is_idempotent=False)
def refuse(summary: str) -> Any:
    """
    Fail this host here, before any change: preflight or the resolver refused it.

    + summary: why; a first line, then any details, one per line
    """
    yield FunctionCommand(_refuse, (summary,), {})


def plan_or_refuse(state: State, host: Host) -> HostReport | None:
    """The host's plan when it may go on; otherwise queue a refusal and return None."""
    everyone = inventory_settings(state)
    settings = dict(everyone)[host.name]
    report = plan_for_host(host, settings, everyone)
    Console(stderr=True).print(host_panel(host.name, report))
    if report.ok:
        return report
    refuse(name="Refuse: preflight or plan failed, no change made", summary=refusal(report))
    return None


def refusal(report: HostReport) -> str:
    """What a refused host logs: every problem in full, one per line. The table printed with
    the plan is cut to the terminal's width (80 columns in a CI log); this text is not."""
    errors = report.errors
    return "\n".join([f"{len(errors)} problem(s), nothing changed:", *(f"- {e}" for e in errors)])
