"""The first step of every deploy: settings checked for the whole inventory, facts gathered,
preflight and resolver run, the plan printed; a host that fails is stopped before any change.
"""

from __future__ import annotations

from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import operation
from rich.console import Console

from operations import settings as settings_mod
from operations.host_plan import HostReport, plan_for_host
from operations.report import host_panel

_checked_states: set[int] = set()


class SettingsInvalid(PyinfraError):
    """Raised while loading deploy.py: pyinfra prints it as one message, no traceback."""


def check_all_settings(state: Any) -> None:
    """Every host's settings at once, before the first fact is gathered from any host."""
    if id(state) in _checked_states:
        return
    _checked_states.add(id(state))
    problems: list[str] = []
    for host in state.inventory:
        try:
            settings_mod.load_for_host(host)
        except settings_mod.SettingsError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SettingsInvalid("invalid settings, nothing was changed:\n  " + "\n  ".join(problems))


def _refuse(state: Any, host: Any, summary: str) -> bool:
    logger.error(f"{host.print_prefix}refused: {summary}")
    return False


@operation(is_idempotent=False)
def refuse(summary: str) -> Any:
    """
    Fail this host here, before any change: preflight or the resolver refused it.

    + summary: one line saying why (the full table was printed with the plan)
    """
    yield FunctionCommand(_refuse, (summary,), {})


def plan_or_refuse(state: Any, host: Any) -> HostReport | None:
    """The host's plan when it may go on; otherwise queue a refusal and return None."""
    check_all_settings(state)
    settings = settings_mod.load_for_host(host)
    report = plan_for_host(host, settings)
    Console(stderr=True).print(host_panel(host.name, report))
    if report.ok:
        return report
    problems = [f.check for f in report.failures] + report.plan.errors
    refuse(
        name="Refuse: preflight or plan failed, no change made",
        summary=f"{len(problems)} problem(s): " + "; ".join(problems),
    )
    return None
