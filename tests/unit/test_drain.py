"""The roll's drain, decided in the plan (operations/drain.py), and what carries it out: the
router's reliability flags on its real command line, rank units that stop after the drain, the
drain script's reading of a rank's request gauges (the server double's real /metrics text)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from operations import drain, host_scripts, kb, resolver
from operations.settings import Settings
from tests.unit.builders import facts, make_settings

ROOT = Path(__file__).resolve().parents[2]
ROUTER = {"host": "ct200", "port": 8000, "bind": "0.0.0.0"}


def with_router(**router: object) -> Settings:
    return make_settings(router={**ROUTER, **router})


def test_without_a_router_the_plan_says_rolls_are_not_drain_protected() -> None:
    s = make_settings()
    plan, decision, warnings = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is None and warnings == []
    assert decision.value == "none: rolls are not drain-protected"
    assert "no router" in decision.why


def test_behind_the_router_each_rank_is_named_as_the_router_names_it() -> None:
    a = with_router()
    b = dataclasses.replace(with_router(), server_host="10.0.0.2", base_port=31000)
    everyone = [("ct200", a), ("ct201", b)]
    router = resolver.resolve_router(a, "ct200", everyone)
    for name, s in everyone:
        plan, decision, _ = drain.decide(name, s, everyone, kb.load())
        assert plan is not None
        # The worker URLs the drain removes and re-adds are the router's own --worker-urls.
        assert all(plan.worker(r) in router.workers for r in range(s.dp_size))
        assert plan.timeout_s == s.drain_timeout_s == 120
        assert "DELETE /workers/{id}" in decision.why and "POST /workers" in decision.why
        assert "pypi.org/project/sglang-router/0.3.2" in decision.why
    # On its own host the router is reached on loopback; from another, at its host's address.
    own, _, _ = drain.decide("ct200", a, everyone, kb.load())
    assert own is not None and own.router_url == "http://127.0.0.1:8000"
    other = dataclasses.replace(a, server_host="10.0.0.1")
    everyone = [("ct200", other), ("ct201", b)]
    plan, _, _ = drain.decide("ct201", b, everyone, kb.load())
    assert plan is not None and plan.router_url == "http://10.0.0.1:8000"


def test_a_router_release_without_a_known_worker_api_is_a_warning_not_a_drain() -> None:
    s = with_router()
    knowledge = dataclasses.replace(kb.load(), routers={})
    plan, decision, warnings = drain.decide("ct200", s, [("ct200", s)], knowledge)
    assert plan is None and "not drain-protected" in decision.value
    assert warnings and "0.3.2" in warnings[0]


def test_the_router_command_line_carries_its_reliability_settings() -> None:
    s = with_router(retry_max_retries=7, cb_timeout_s=12)
    router = resolver.resolve_router(s, "ct200", [("ct200", s)])
    assert router.errors == []  # checked against sglang-router 0.3.2's real option table
    line = " ".join(router.argv)
    for flag in (
        "--retry-max-retries 7",
        "--retry-initial-backoff-ms 100",
        "--health-check-interval-secs 5",
        "--health-failure-threshold 2",
        "--health-success-threshold 2",
        "--cb-failure-threshold 5",
        "--cb-timeout-duration-secs 12",
        "--worker-startup-timeout-secs 1800",
    ):
        assert flag in line, flag


def test_rank_units_stop_after_the_drain() -> None:
    for seconds in (120, 600):
        s = make_settings(drain_timeout_s=seconds)
        plan = resolver.resolve(s, dataclasses.replace(facts(), model_key="0123abcd"))
        for rank in plan.ranks:
            stop = re.search(r"^TimeoutStopSec=(\d+)$", rank.unit, re.M)
            assert stop is not None and int(stop.group(1)) > seconds


@pytest.mark.integration
def test_the_drain_script_reads_running_and_queued_requests_from_the_double(
    tmp_path: Path,
) -> None:
    script = host_scripts.load("router_workers.py")  # the text the host runs
    # The double's /metrics, written by its own code (tests/doubles/packages/sglang).
    code = (
        "import sys, types; sys.modules['sglang._double_build'] = types.SimpleNamespace("
        "VERSION='0.5.11'); sys.path.insert(0, 'tests/doubles/packages');"
        "import argparse; from sglang._server_double import _State, metrics_text;"
        "s = _State(argparse.Namespace(served_model_name='m', model_path='/m'), 0);"
        "s.running = 3; print(metrics_text(s))"
    )
    text = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    served = tmp_path / "metrics"
    served.write_text(text)
    assert script.in_flight(served.as_uri()) == 3
    served.write_text("# no gauges\n")
    assert script.in_flight(served.as_uri()) is None
