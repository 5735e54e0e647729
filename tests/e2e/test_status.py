"""`python -m operations.status` end to end: one testbed container serving 8 ranks of the SGLang
server double behind the real router, smg 1.13.0 (deployed with the real `pyinfra -y INVENTORY
deploy.py`), read over SSH as an operator (or cron) would, the router's own view of each rank
beside it. The router's health rule runs at small thresholds (a check every second, out after
one failure, back after one pass) so its verdicts come in seconds.

Tests that stop something start it again and wait until it is healthy, so no test depends on
another's order.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.cli.status import fact_args
from operations.facts.serve_status import ServingStatus, parse_status
from operations.plan import monitoring
from operations.settings import Layer, load
from operations.version import VERSION
from tests import testbed as tb
from tests.e2e.deploying import LANE, Indexes
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    RELEASE,
    ROUTER_PORT,
    base_data,
    deploy,
    health,
    http,
    ok,
    requests_served,
    run_status,
    serving_spec,
    status_inventory,
    unit_states,
)
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container

pytestmark = pytest.mark.e2e

GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"  # the container's nvidia-smi double
GONE = "ct-gone"
MODEL = "Qwen/Qwen3.6-27B"  # the served model name (settings model_name's default)
# The router's health rule, small so the test is short (settings router.*).
HEALTH_RULE = {
    "health_check_interval_s": 1,
    "health_failure_threshold": 1,
    "health_success_threshold": 1,
}


@pytest.fixture(scope="module")
def served(
    testbed: tb.Testbed, indexes: Indexes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Container, dict[str, Any]]]:
    """One container serving 8 ranks and the router; its settings as the inventory holds them."""
    (container,) = testbed.boot(serving_spec())
    try:
        data = base_data(
            container,
            indexes,
            router={
                "host": container.name,
                "port": ROUTER_PORT,
                "bind": container.address,
                **HEALTH_RULE,
            },
        )
        ok(deploy(tmp_path_factory.mktemp("status-deploy"), {container: data}))
        yield container, data
    finally:
        testbed.destroy(container)


def inventory(tmp_path: Path, served: tuple[Container, dict[str, Any]], gone: bool = False) -> Path:
    container, data = served
    hosts = {container.name: {**container.host_data(), **data}}
    if gone:
        # Nothing listens on port 1 of the container's address: the SSH connection is refused.
        own = {k: v for k, v in data.items() if k != "router"}
        hosts[GONE] = {**container.host_data(), "ssh_port": 1, **own}
    return status_inventory(tmp_path, hosts)


def status_json(path: Path) -> tuple[int, dict[str, Any]]:
    proc = run_status(path, "--json")
    document: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, document


def all_healthy(c: Container) -> bool:
    return all(health(c, 30000 + rank) == 200 for rank in range(8))


# -- tests -----------------------------------------------------------------------------------


def test_all_ranks_healthy(served: tuple[Container, dict[str, Any]], tmp_path: Path) -> None:
    c, _ = served
    path = inventory(tmp_path, served)
    proc = run_status(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"{c.name}: 8/8 ranks healthy, router healthy" in out, out
    assert "all healthy" in out
    assert f"{RELEASE} {LANE}" in out and "Qwen/Qwen3.6-27B@" in out and GPU_NAME in out
    # The deploy's last step recorded this toolkit version on the host, which status shows.
    deployed_by = rf"deployed by toolkit {re.escape(VERSION)} \(recorded \d{{4}}-\d\d-\d\d\)"
    assert re.search(deployed_by, out), out

    rc, doc = status_json(path)
    assert rc == 0 and doc["healthy"] is True, doc
    host = doc["hosts"][c.name]
    assert host["reachable"] is True and host["error"] is None
    toolkit = host["toolkit"]
    assert toolkit["version"] == VERSION and toolkit["problem"] is None, toolkit
    _, recorded, _ = c.ssh_run(f"cat {layout.TOOLKIT_RECORD}")
    assert json.loads(recorded) == {"recorded": toolkit["recorded"], "version": VERSION}
    pids = unit_states(c, range(8))
    ranks = host["ranks"]
    assert [r["rank"] for r in ranks] == list(range(8))
    for r in ranks:
        rank = r["rank"]
        assert r["healthy"] is True and r["state"] == "active (running)" and r["health"] == "ok"
        assert r["port"] == 30000 + rank and r["unit"] == f"sglang@{rank}.service"
        assert (r["sglang_version"], r["lane"]) == (RELEASE, LANE)
        assert r["engine"].startswith(f"{RELEASE}-{LANE}-")
        assert r["model"] == "Qwen/Qwen3.6-27B" and len(r["model_revision"]) == 16
        assert r["gpu"] == rank and r["gpu_name"] == GPU_NAME
        assert r["gpu_memory_total_mib"] == 97887
        assert r["pid"] == pids[rank][1]
        assert r["uptime_s"] >= 0 and r["restarts"] == 0
    router = host["router"]
    assert router["healthy"] is True and router["state"] == "active (running)"
    assert router["url"] == f"http://{c.address}:{ROUTER_PORT}/health"
    # smg's own view, read with the control-plane key on the host: every rank ready.
    assert router["workers"] == "ok"
    assert [(r["router_state"], r["router_stalled"]) for r in ranks] == [("ready", None)] * 8
    header = next(line for line in out.splitlines() if "restarts" in line)
    assert "router" in header, out


def test_the_fact_reads_every_rank_in_one_command(
    served: tuple[Container, dict[str, Any]],
) -> None:
    """The fact's one command, run over SSH as pyinfra runs it, answers for all ranks."""
    c, data = served
    settings = load(c.name, [Layer("test", data)])
    command = ServingStatus().command(**fact_args(settings, c.name))
    rc, out, err = c.ssh_run(command.get_raw_value())
    assert rc == 0, err
    parsed = parse_status(out.splitlines())
    assert sorted(parsed.ranks) == list(range(8))
    assert parsed.health == {**{str(r): "200" for r in range(8)}, "router": "200"}
    assert {m.release for m in parsed.envs.values()} == {RELEASE} and parsed.gpu_error is None
    # Every rank's unit names its own environment (not `current`) and its staged copy's key.
    for unit in parsed.ranks.values():
        env = unit.engine_env()
        assert env is not None and "/envs/" in env, unit.exec_start
        assert (unit.model_path() or "").startswith("/dev/shm/models/.Qwen--Qwen3.6-27B@")


def test_a_stopped_rank_is_unhealthy_and_fails_the_exit_status(
    served: tuple[Container, dict[str, Any]], tmp_path: Path
) -> None:
    c, _ = served
    path = inventory(tmp_path, served)
    assert c.ssh_run("systemctl stop sglang@2.service")[0] == 0
    try:
        proc = run_status(path)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"{c.name}: 7/8 ranks healthy (rank 2 inactive (dead), refused)" in proc.stdout
        assert "NOT healthy" in proc.stdout

        rc, doc = status_json(path)
        assert rc == 1 and doc["healthy"] is False
        ranks = {r["rank"]: r for r in doc["hosts"][c.name]["ranks"]}
        assert ranks[2]["healthy"] is False
        assert ranks[2]["state"] == "inactive (dead)" and ranks[2]["health"] == "refused"
        assert ranks[2]["pid"] is None and ranks[2]["uptime_s"] is None
        assert all(ranks[r]["healthy"] for r in range(8) if r != 2)
    finally:
        c.ssh_run("systemctl start sglang@2.service")
        wait_for(lambda: all_healthy(c), timeout=60, what="rank 2 serving again")


def test_an_unreachable_host_is_one_line_and_the_others_are_still_reported(
    served: tuple[Container, dict[str, Any]], tmp_path: Path
) -> None:
    c, _ = served
    path = inventory(tmp_path, served, gone=True)
    proc = run_status(path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "Traceback" not in output
    gone_lines = [line for line in output.splitlines() if GONE in line]
    assert len(gone_lines) == 2, output  # its line, and the final "NOT healthy: ct-gone"
    assert gone_lines[0].startswith(f"{GONE}: unreachable: "), output
    assert f"{c.name}: 8/8 ranks healthy" in output

    rc, doc = status_json(path)
    assert rc == 1 and doc["healthy"] is False
    gone = doc["hosts"][GONE]
    assert gone["reachable"] is False and gone["ranks"] == [] and gone["router"] is None
    assert isinstance(gone["error"], str) and gone["error"]
    here = doc["hosts"][c.name]
    assert here["reachable"] is True and here["healthy"] is True and len(here["ranks"]) == 8


def test_prometheus_targets_on_the_host_and_each_ranks_requests_in_status(
    served: tuple[Container, dict[str, Any]], tmp_path: Path
) -> None:
    """The deploy wrote the file_sd targets (every rank and the router, labelled) and the
    dashboard; every target answers Prometheus text from the host; status shows each rank's
    running and queued requests, read from its /metrics."""
    c, _ = served
    rc, out, err = c.ssh_run(f"cat {layout.TARGETS_FILE}")
    assert rc == 0, err
    groups = json.loads(out)
    assert [g["labels"] for g in groups] == [
        *({"host": c.name, "rank": str(r), "version": RELEASE} for r in range(8)),
        {"host": c.name, "rank": "router", "version": "1.13.0"},
    ]
    targets = [t for g in groups for t in g["targets"]]
    assert targets == [*(f"{c.address}:{30000 + r}" for r in range(8)), f"{c.address}:29000"]
    # Prometheus scrapes http://TARGET/metrics: the ranks' SGLang gauges, the real router's own.
    for target in targets:
        rc, page, err = c.ssh_run(f"curl -sf --noproxy '*' http://{target}/metrics")
        assert rc == 0, (target, err)
        wanted = "sglang:num_running_reqs" if not target.endswith(":29000") else "# TYPE "
        assert wanted in page, (target, page[:300])
    rc, out, _ = c.ssh_run(f"sha256sum {layout.DASHBOARD_FILE} {layout.TARGETS_FILE}")
    assert rc == 0
    dashboard = out.split()[0]
    assert dashboard == hashlib.sha256(monitoring.DASHBOARD_SOURCE.read_bytes()).hexdigest()

    path = inventory(tmp_path, served)
    rc, doc = status_json(path)
    assert rc == 0, doc
    ranks = doc["hosts"][c.name]["ranks"]
    assert [(r["running_reqs"], r["queued_reqs"], r["metrics"]) for r in ranks] == [
        (0, 0, "ok")
    ] * 8
    proc = run_status(path)
    header = next(line for line in proc.stdout.splitlines() if "restarts" in line)
    assert "running" in header and "queued" in header, proc.stdout


def router_states(path: Path, c: Container) -> dict[int, str | None]:
    _, doc = status_json(path)
    return {r["rank"]: r["router_state"] for r in doc["hosts"][c.name]["ranks"]}


def chat(c: Container) -> int:
    """One request through the router. Each prompt starts with its own random text: the
    router's cache_aware policy sends a prompt that shares most of its start with an earlier
    one to that one's rank, and a new one to the rank it has sent least."""
    prompt = f"{uuid.uuid4().hex} What is 2 + 3?"
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    return http(f"http://{c.address}:{ROUTER_PORT}/v1/chat/completions", body)[0]


def test_a_wedged_rank_is_taken_out_gets_no_requests_and_comes_back(
    served: tuple[Container, dict[str, Any]], tmp_path: Path
) -> None:
    """Rank 3 wedged (the double's SIGUSR1: its requests wait in the queue, its /health answers
    503, as SGLang's does when the scheduler produces nothing): the real smg marks it not_ready
    on its health rule, status shows that beside the rank's own `http 503`, requests through
    the router all reach the other ranks; unwedged, smg lists it ready again (a static worker
    is never dropped) and it serves again."""
    c, _ = served
    path = inventory(tmp_path, served)
    wedge = "systemctl kill -s SIGUSR1 --kill-whom=main sglang@3.service"
    wait_for(lambda: set(router_states(path, c).values()) == {"ready"}, 60, "all ranks ready")
    assert c.ssh_run(wedge)[0] == 0
    try:
        wait_for(lambda: router_states(path, c)[3] == "not_ready", 60, "rank 3 not_ready")
        rc, doc = status_json(path)
        three = doc["hosts"][c.name]["ranks"][3]
        assert rc == 1 and (three["health"], three["router_state"]) == ("http 503", "not_ready")
        served_before = requests_served(c, 30003)
        assert [chat(c) for _ in range(16)] == [200] * 16
        assert requests_served(c, 30003) == served_before
        # Nothing waits in its queue: the router sent it no request.
        _, page = http(f"http://{c.address}:30003/metrics")
        assert re.search(r"^sglang:num_queue_reqs\{[^}]*\} 0\.0$", str(page), re.M), page
    finally:
        assert c.ssh_run(wedge)[0] == 0  # unwedged
    wait_for(lambda: router_states(path, c)[3] == "ready", 60, "rank 3 ready again")
    before = requests_served(c, 30003)
    wait_for(lambda: chat(c) == 200 and requests_served(c, 30003) > before, 60, "rank 3 serves")
