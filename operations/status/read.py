"""Reading the hosts: the inventory loaded as pyinfra does, one ServingState fact per host
(and one SmokeProbe with --probe); a host that cannot be read is its own result, never a
traceback."""

from __future__ import annotations

import contextlib
from typing import Any

from pyinfra.api.host import Host
from pyinfra.api.state import State

from operations.facts.serve import ServingState
from operations.facts.smoke import Probe, SmokeProbe
from operations.status.rows import HostResult, fact_args, host_result, probe_args, with_probe

# -- reading the hosts ----------------------------------------------------------------------


def _quiet_pyinfra() -> None:
    """pyinfra logs connection failures itself; we print one line per host instead."""
    import logging

    logger = logging.getLogger("pyinfra")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


def _one_line(error: BaseException | str) -> str:
    text = error.args[0] if isinstance(error, BaseException) and error.args else error
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__


def run(inventory_path: str, override: dict[str, object], probe: bool = False) -> list[HostResult]:
    """One result per inventory host, in inventory order."""
    from operations.plan import build_state

    _quiet_pyinfra()
    return read_hosts(build_state(inventory_path, override), probe)


def read_hosts(state: State, probe: bool = False) -> list[HostResult]:
    """Settings of every host first, then connect to the good ones and read one fact each."""
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.state import BaseStateCallback
    from pyinfra.context import ctx_host

    from operations import reach
    from operations import settings as settings_mod

    hosts = list(state.inventory)
    loaded, problems = settings_mod.load_inventory(hosts)
    errors: dict[str, str] = {}
    for problem in problems:
        name, _, text = problem.partition(": ")
        errors[name] = f"{errors[name]}; {text}" if name in errors else f"settings: {text}"

    connect_errors: dict[str, str] = {}

    class Errors(BaseStateCallback):
        @staticmethod
        def host_connect_error(state: State, host: Host, error: Any) -> None:
            what = reach.hint(host.name)
            connect_errors[host.name] = _one_line(error) + (f"; {what}" if what else "")

    state.add_callback_handler(Errors())
    if any(h.name in loaded and h.name not in errors for h in hosts):
        # "No hosts remaining!" when none answers: each host's own line says why.
        with contextlib.suppress(PyinfraError):
            connect_all(state)

    results: list[HostResult] = []
    for host in hosts:
        if host.name in errors:
            error = errors[host.name]
            results.append(HostResult(host.name, False, error, invalid_settings=True))
            continue
        if host not in state.activated_hosts:
            error = connect_errors.get(host.name, "could not connect")
            results.append(HostResult(host.name, reachable=False, error=error))
            continue
        settings = loaded[host.name]
        try:
            with ctx_host.use(host):
                status = host.get_fact(ServingState, **fact_args(settings, host.name))
        except Exception as exc:  # a failed read is this host's result, never a traceback
            error = f"status: {_one_line(exc)}"
            results.append(HostResult(host.name, reachable=True, error=error))
            continue
        result = host_result(host.name, settings, status)
        if probe:
            try:
                with ctx_host.use(host):
                    answers = host.get_fact(SmokeProbe, **probe_args(settings, host.name, status))
            except Exception as exc:  # as above: this host's result, never a traceback
                answers = Probe(error=f"probe: {_one_line(exc)}")
            result = with_probe(result, answers)
        results.append(result)
    return results
