"""Monitoring: the Prometheus targets the plan decides (operations/plan/monitoring.py), the router's
metrics flags, the Grafana dashboard's queries against what SGLang exports, and the status
command's running/queued columns read by the real probe script from a real HTTP server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.cli import status as st
from operations.facts.serve import RankLoad, Serving
from operations.facts.serve_status import PROBE_SCRIPT, parse_status
from operations.plan import monitoring, resolver
from operations.render import host_scripts
from tests.unit.builders import make_settings
from tests.unit.test_plan_cli import plan_json

ROOT = Path(__file__).resolve().parents[2]
EXPORTED = ROOT / "tests" / "fixtures" / "sglang-metrics" / "0.5.11.txt"
SMG_METRICS = ROOT / "tests" / "fixtures" / "smg" / "metrics-1.13.0.json"
ROUTER = {"host": "ct200", "port": 8000, "bind": "0.0.0.0"}


# -- the targets file ------------------------------------------------------------------------


def test_one_target_per_rank_and_the_router_on_its_host() -> None:
    s = make_settings(server_host="10.0.0.200", dp_size=8, router=ROUTER)
    groups = monitoring.targets("ct200", s)
    assert [g["targets"] for g in groups] == [
        *([f"10.0.0.200:{30000 + r}"] for r in range(8)),
        ["10.0.0.200:29000"],  # bind 0.0.0.0: the host's own address, the router's metrics port
    ]
    assert [g["labels"] for g in groups] == [
        *({"host": "ct200", "rank": str(r), "version": "0.5.11"} for r in range(8)),
        {"host": "ct200", "rank": "router", "version": "1.13.0"},
    ]


def test_the_router_is_listed_only_on_its_own_host() -> None:
    s = make_settings(server_host="10.0.0.201", dp_size=2, router=ROUTER)
    groups = monitoring.targets("ct201", s)
    assert [g["labels"]["rank"] for g in groups] == ["0", "1"]
    assert {g["labels"]["host"] for g in groups} == {"ct201"}


def test_labels_follow_the_pin_ports_and_a_bound_router() -> None:
    s = make_settings(
        sglang_version="0.5.19",
        server_host="fd00::7",
        base_port=31000,
        dp_size=2,
        router={**ROUTER, "bind": "10.9.9.9", "metrics_port": 29500, "version": "0.3.2"},
    )
    groups = monitoring.targets("ct200", s)
    assert [g["targets"] for g in groups] == [
        ["[fd00::7]:31000"],
        ["[fd00::7]:31001"],
        ["10.9.9.9:29500"],
    ]
    assert {g["labels"]["version"] for g in groups[:2]} == {"0.5.19"}


def test_without_metrics_the_ranks_are_not_listed_and_the_plan_says_why() -> None:
    s = make_settings(enable_metrics=False, router=ROUTER)
    plan, decision = monitoring.decide("ct200", s)
    assert [g["labels"]["rank"] for g in plan.targets] == ["router"]
    assert decision.value == "0 rank target(s) and the router's"
    assert "enable_metrics is false" in decision.why


def test_the_file_is_file_sd_json_and_stable() -> None:
    s = make_settings(dp_size=3)
    plan, _ = monitoring.decide("ct200", s)
    text = plan.targets_text()
    assert text == monitoring.MonitoringPlan(monitoring.targets("ct200", s)).targets_text()
    document = json.loads(text)
    # file_sd_configs: a list of {targets: [HOST:PORT ...], labels: {NAME: VALUE}}, strings only.
    assert isinstance(document, list) and len(document) == 3
    for group in document:
        assert set(group) == {"targets", "labels"}
        assert all(isinstance(t, str) and re.fullmatch(r"[^/]+:\d+", t) for t in group["targets"])
        assert all(isinstance(v, str) for v in group["labels"].values())
    assert (
        plan.targets_file == layout.TARGETS_FILE == "/etc/sglang-monitoring/prometheus-targets.json"
    )
    assert plan.dashboard_file.rsplit("/", 1)[0] == plan.targets_file.rsplit("/", 1)[0]


@pytest.mark.integration
def test_the_plan_json_shows_the_targets() -> None:
    rc, doc = plan_json()
    assert rc == 0
    host = doc["hosts"]["@fake/ct200"]
    shown = host["monitoring"]
    assert shown["targets_file"] == layout.TARGETS_FILE
    assert [g["labels"]["rank"] for g in shown["targets"]] == [str(r) for r in range(8)]
    assert {g["labels"]["host"] for g in shown["targets"]} == {"@fake/ct200"}
    assert any(d["what"] == "monitoring" for d in host["decisions"])


# -- the router's metrics --------------------------------------------------------------------


def test_the_router_serves_its_metrics_where_the_file_says() -> None:
    s = make_settings(router={**ROUTER, "bind": "10.0.0.200", "metrics_port": 29100})
    plan = resolver.resolve_router(s, "ct200", [("ct200", s)])
    assert plan.errors == []
    line = " ".join(plan.argv)
    assert "--prometheus-host 10.0.0.200 --prometheus-port 29100" in line


@pytest.mark.parametrize("port", [8000, 30003])
def test_a_metrics_port_on_the_router_or_a_rank_is_refused(port: int) -> None:
    s = make_settings(router={**ROUTER, "metrics_port": port})
    errors = resolver.resolve_router(s, "ct200", [("ct200", s)]).errors
    assert len(errors) == 1 and f"metrics_port {port}" in errors[0], errors


# -- the dashboard ---------------------------------------------------------------------------


def exported() -> set[str]:
    lines = EXPORTED.read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def test_every_dashboard_query_names_a_metric_sglang_exports() -> None:
    dashboard = json.loads(monitoring.DASHBOARD_SOURCE.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"sglang:\w+", e)
    }
    assert used, exprs
    assert used <= exported(), used - exported()
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs"} <= used
    # Every query selects by the targets file's labels, and no panel names one Grafana's uid.
    assert all('host=~"$host"' in e for e in exprs)
    sources = {json.dumps(p["datasource"]) for p in dashboard["panels"]}
    assert sources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}


def test_each_ranks_throughput_gauges_have_a_panel_with_one_line_per_rank() -> None:
    """Generation throughput, running and queued requests and KV cache usage, from each rank's
    own gauges (0.5.11 observability/metrics_collector.py:200-245), one line per rank: the
    running and queued totals are the priority="" series (:891-903), so a rank with priority
    scheduling is not drawn once per priority; the host's sum of generation throughput too."""
    dashboard = json.loads(monitoring.DASHBOARD_SOURCE.read_text())
    per_rank = {
        re.findall(r"sglang:\w+", t["expr"])[0]: t
        for p in dashboard["panels"]
        for t in p["targets"]
        if t.get("legendFormat") == "{{host}} rank {{rank}}"
    }
    gauges = ("gen_throughput", "num_running_reqs", "num_queue_reqs", "token_usage")
    assert {f"sglang:{g}" for g in gauges} <= set(per_rank)
    for gauge in gauges:
        expr = per_rank[f"sglang:{gauge}"]["expr"]
        assert 'rank=~"$rank"' in expr and "sum" not in expr, expr
    for gauge in ("num_running_reqs", "num_queue_reqs"):
        assert 'priority=""' in per_rank[f"sglang:{gauge}"]["expr"]
    host = [
        t["expr"]
        for p in dashboard["panels"]
        for t in p["targets"]
        if t.get("legendFormat") == "{{host}}"
    ]
    assert host == ['sum by (host) (sglang:gen_throughput{host=~"$host", rank=~"$rank"})']
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # No two panels overlap on the grid.
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in dashboard["panels"]
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))


def test_every_router_metric_the_dashboard_names_is_one_the_real_smg_serves() -> None:
    """The router's panels name only metric families the real smg 1.13.0 served on its
    Prometheus listener (tests/fixtures/smg/metrics-1.13.0.json, written by
    scripts/capture_smg_metrics.py), with the labels they group by, and select the router's
    target by the targets file's labels (rank="router")."""
    dashboard = json.loads(monitoring.DASHBOARD_SOURCE.read_text())
    captured = json.loads(SMG_METRICS.read_text())["families"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"] if "smg_" in t["expr"]]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"smg_\w+", e)
    }
    assert {"smg_router_requests_total", "smg_router_request_errors_total"} <= used
    assert "smg_worker_requests_active" in used  # per-rank load as the router sees it
    assert used <= set(captured), used - set(captured)
    for expr in exprs:
        assert 'rank="router"' in expr, expr
        for by in re.findall(r"by \(([^)]*)\)", expr):
            metric = re.findall(r"smg_\w+", expr)[0]
            labels = {"host", "rank", "version", *captured[metric]["labels"]}
            assert {w.strip() for w in by.split(",")} <= labels, (expr, captured[metric])


# -- status: running and queued from /metrics ------------------------------------------------

PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",priority="0"} 3.0
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",priority="1"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3.6-27B",priority="0"} 5.0
sglang:num_requests_total{model_name="Qwen/Qwen3.6-27B"} 42.0
"""


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code, body = {
            "/good/metrics": (200, PAGE),
            "/off/metrics": (404, "not found"),
            "/bare/metrics": (200, "# nothing of SGLang's\nprocess_cpu_seconds_total 1.0\n"),
        }.get(self.path, (200, ""))
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def pages() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.integration
def test_the_probe_script_reads_the_request_gauges(pages: str) -> None:
    """The fact's own script, run as the host runs it, against a real HTTP server."""
    refused = f"http://127.0.0.1:{_free_port()}/metrics"
    probe = host_scripts.script_text(PROBE_SCRIPT)  # what the fact sends
    argv = [sys.executable, "-c", probe, "2.0", f"0={pages}/health", "--metrics"]
    argv += [f"0={pages}/good/metrics", f"1={pages}/off/metrics", f"2={pages}/bare/metrics"]
    argv += [f"3={refused}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    status = parse_status(out.splitlines())
    assert status.health == {"0": "200"}
    assert status.load == {
        "0": RankLoad(running=4.0, queued=5.0),  # series summed (real SGLang labels priority)
        "1": RankLoad(error="http 404"),
        "2": RankLoad(),
        "3": RankLoad(error="refused"),
    }


def test_status_rows_show_running_and_queued() -> None:
    s = make_settings(dp_size=4)
    status = Serving(
        load={"0": RankLoad(4.0, 5.0), "1": RankLoad(error="refused"), "2": RankLoad(0.0, None)}
    )
    rows = st.host_result("ct200", s, status).ranks
    got = [(r.running_reqs, r.queued_reqs, r.metrics) for r in rows]
    assert got == [
        (4, 5, "ok"),
        (None, None, "refused"),
        (0, None, "no request gauges on /metrics"),
        (None, None, "not read"),
    ]
    doc = st.to_json([st.host_result("ct200", s, status)])
    first = doc["hosts"]["ct200"]["ranks"][0]
    assert (first["running_reqs"], first["queued_reqs"], first["metrics"]) == (4, 5, "ok")


def test_status_asks_for_metrics_only_when_the_ranks_serve_them() -> None:
    on = st.fact_args(make_settings(server_host="10.0.0.200", dp_size=2), "ct200")
    assert on["metrics_urls"] == {
        "0": "http://10.0.0.200:30000/metrics",
        "1": "http://10.0.0.200:30001/metrics",
    }
    off_settings = make_settings(enable_metrics=False, dp_size=2)
    assert st.fact_args(off_settings, "ct200")["metrics_urls"] is None
    rows = st.host_result("ct200", off_settings, Serving()).ranks
    assert {r.metrics for r in rows} == {"off (enable_metrics is false)"}


def test_the_table_has_running_and_queued_columns() -> None:
    from rich.console import Console

    s = make_settings(dp_size=2)
    result = st.host_result("ct200", s, Serving(load={"0": RankLoad(7.0, 2.0)}))
    console = Console(width=250, record=True)
    console.print(st.host_table(result))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "rank" in line and "running" in line)
    assert "queued" in header
    row = next(line for line in text.splitlines() if line.startswith("│    0 "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[-2:] == ["7", "2"]
