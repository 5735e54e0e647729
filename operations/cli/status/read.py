"""Reading the hosts: the inventory session (operations/runtime/inventory.py: loaded as pyinfra
does, settings checked, hosts connected), then one ServingStatus fact per host (and one SmokeProbe
with --probe); a host that cannot be read is its own result, never a traceback."""

from __future__ import annotations

from operations import kb as kbmod
from operations.cli.status.canary import CanaryView
from operations.cli.status.rows import HostResult, fact_args, host_result, probe_args, with_probe
from operations.cli.status.throughput import ThroughputView
from operations.cli.status.tune import TuneView
from operations.facts.canary import parse_canary
from operations.facts.serve_status import ServingStatus
from operations.facts.smoke import Probe, SmokeProbe
from operations.facts.throughput import parse_records
from operations.facts.tune import parse_tune
from operations.plan.drain import router_list_url
from operations.runtime.inventory import Session, one_line, open_session, quiet_pyinfra

# -- reading the hosts ----------------------------------------------------------------------


def run(inventory_path: str, override: dict[str, object], probe: bool = False) -> list[HostResult]:
    """One result per inventory host, in inventory order."""
    quiet_pyinfra()
    return read_hosts(open_session(inventory_path, override), probe)


def read_hosts(session: Session, probe: bool = False) -> list[HostResult]:
    """Settings of every host first, then connect to the good ones and read one fact each."""
    session.connect()
    knowledge = kbmod.load()
    results: list[HostResult] = []
    for visit in session.each():
        host, settings = visit.host, visit.settings
        if visit.problems:
            texts = [p.removeprefix(f"{visit.name}: ") for p in visit.problems]
            error = "settings: " + "; ".join(texts)
            results.append(HostResult(visit.name, False, error, invalid_settings=True))
            continue
        if settings is None:
            error = visit.unreachable or "could not connect"
            results.append(HostResult(visit.name, reachable=False, error=error))
            continue
        try:
            # The router's own view of the ranks, asked on their host with the control-plane
            # key (read there, never sent from here), as the deploy's fact asks it.
            listing = router_list_url(host.name, settings, session.everyone, knowledge)
            status = host.get_fact(ServingStatus, **fact_args(settings, host.name, listing))
        except Exception as exc:  # a failed read is this host's result, never a traceback
            error = f"status: {one_line(exc)}"
            results.append(HostResult(host.name, reachable=True, error=error))
            continue
        result = host_result(host.name, settings, status)
        result.throughput = ThroughputView.of(
            parse_records(status.throughput_lines), status.throughput_pending
        )
        result.canary = CanaryView.of(
            parse_canary(status.canary_lines), status.ranks, list(range(settings.dp_size))
        )
        result.tune = TuneView.of(parse_tune(status.tune_lines), settings)
        if probe:
            try:
                answers = host.get_fact(SmokeProbe, **probe_args(settings, host.name, status))
            except Exception as exc:  # as above: this host's result, never a traceback
                answers = Probe(error=f"probe: {one_line(exc)}")
            result = with_probe(result, answers)
        results.append(result)
    return results
