"""The status command's pure parts: the fact's answer (captured on testbed containers, see
tests/facts/serve_status.ServingStatus) and the settings in, rows, summaries, exit status and
JSON out; then the whole command against pyinfra's @fake connector and a port where nothing
listens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from operations import layout
from operations.cli import status as st
from operations.facts.serve import Serving
from operations.facts.serve_status import ServingStatus, parse_status
from operations.facts.smoke import Probe, ProbeAnswer
from tests.unit.builders import make_settings

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "facts" / "serve_status.ServingStatus"
# The deploy's reading alone (no probes), which status reads the same way.
DEPLOY_FIXTURES = ROOT / "tests" / "facts" / "serve.ServingState"
GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
ROUTER = {"host": "ct200", "port": 8000, "bind": "127.0.0.10"}


def output(case: str) -> list[str]:
    path = FIXTURES / f"{case}.json"
    if not path.exists():
        path = DEPLOY_FIXTURES / f"{case}.json"
    lines: list[str] = json.loads(path.read_text())["output"]
    return lines


def fact(case: str, *extra: str, drop: str | None = None) -> Serving:
    lines = [line for line in output(case) if drop is None or not line.startswith(drop)]
    return parse_status([*lines, *extra])


def result(status: Serving, **settings: Any) -> st.HostResult:
    settings.setdefault("server_host", "127.0.0.10")
    return st.host_result("ct200", make_settings(**settings), status)


# -- rows -----------------------------------------------------------------------------------


def test_eight_healthy_ranks_and_the_router() -> None:
    status = fact("eight-ranks-and-the-router-healthy")
    r = result(status, router=ROUTER)
    assert r.healthy and st.exit_status([r]) == 0
    assert r.summary() == "ct200: 8/8 ranks healthy, router healthy"
    first = r.ranks[0]
    assert (first.state, first.health, first.healthy) == ("active (running)", "ok", True)
    assert (first.sglang_version, first.lane) == ("0.5.11", "cu128")
    assert first.engine == "0.5.11-cu128-fb8f6a42"
    assert (first.model, first.model_revision) == ("Qwen/Qwen3.6-27B", "21d5607c34a07d56")
    assert (first.port, first.gpu, first.gpu_name) == (30000, 0, GPU)
    assert (first.pid, first.uptime_s, first.restarts) == (360, 13, 0)
    assert first.model_path == "/dev/shm/models/.Qwen--Qwen3.6-27B@21d5607c34a07d56"
    assert [row.port for row in r.ranks] == list(range(30000, 30008))
    assert r.router is not None and r.router.healthy and r.router.pid == 512
    assert r.router.url == "http://127.0.0.10:8000/health"


def test_a_stopped_rank_is_unhealthy() -> None:
    r = result(fact("rank-2-stopped"), router=ROUTER)
    assert not r.healthy and st.exit_status([r]) == 1
    assert (
        r.summary() == "ct200: 7/8 ranks healthy (rank 2 inactive (dead), refused), router healthy"
    )
    two = r.ranks[2]
    assert (two.state, two.health, two.healthy) == ("inactive (dead)", "refused", False)
    assert two.pid is None and two.uptime_s is None


def test_a_configured_rank_without_a_unit_is_missing() -> None:
    r = result(fact("never-deployed"))
    assert [row.state for row in r.ranks] == ["missing"] * 8
    assert not any(row.healthy for row in r.ranks) and row_restarts(r) == [None] * 8
    assert r.summary() == (
        "ct200: 0/8 ranks healthy (rank 0 missing, refused; rank 1 missing, refused; 6 more)"
    )
    assert r.ranks[0].model_revision is None and r.ranks[0].sglang_version is None


def row_restarts(r: st.HostResult) -> list[int | None]:
    return [row.restarts for row in r.ranks]


def test_a_running_unit_that_does_not_answer_is_unhealthy() -> None:
    status = fact("eight-ranks-and-the-router-healthy", "health 5 503", drop="health 5 ")
    r = result(status)
    assert [row.rank for row in r.ranks if not row.healthy] == [5]
    assert r.ranks[5].health == "http 503" and r.ranks[5].state == "active (running)"


def test_units_beyond_dp_size_are_shown_but_do_not_count() -> None:
    r = result(fact("eight-ranks-and-the-router-healthy"), dp_size=4)
    assert [row.expected for row in r.ranks] == [True] * 4 + [False] * 4
    assert r.healthy and r.summary() == "ct200: 4/4 ranks healthy"
    assert r.ranks[6].health == "not probed (beyond dp_size)"


def test_no_python3_means_not_probed_and_not_healthy() -> None:
    lines = [line for line in output("eight-ranks-and-the-router-healthy")]
    lines = [line for line in lines if not line.startswith("health ")]
    lines.append("health_unavailable python3 not found on the host")
    r = result(parse_status(lines))
    assert not r.healthy
    assert r.ranks[0].health == "not probed (python3 not found on the host)"


def test_revision_uptime_restarts_and_gpu_memory() -> None:
    status = fact(
        "eight-ranks-and-the-router-healthy",
        "gpu 0, NVIDIA H200, 120512, 143771",
        "gpu_rc 0",
        drop="gpu",
    )
    lines = output("eight-ranks-and-the-router-healthy")
    assert "NRestarts=0" in lines
    r = result(status)
    first = r.ranks[0]
    # The copy its own unit names, not what the model link points at now.
    assert first.model_revision == "21d5607c34a07d56"
    assert (first.gpu_name, first.gpu_memory_used_mib, first.gpu_memory_total_mib) == (
        "NVIDIA H200",
        120512,
        143771,
    )
    assert r.ranks[1].gpu_name is None  # nvidia-smi listed only GPU 0


def test_in_the_middle_of_a_roll_each_rank_shows_what_its_own_unit_runs() -> None:
    """Rank 0 was rolled to a new engine and model copy; the others still name the old ones."""
    new_env, new_key = "0.5.19-cu129-0a1b2c3d", "hf-6a9e0b1"
    lines = []
    for line in output("eight-ranks-and-the-router-healthy"):
        if line.startswith("exec sglang@0.service "):
            line = line.replace("0.5.11-cu128-fb8f6a42", new_env).replace(
                "21d5607c34a07d56", new_key
            )
        lines.append(line)
    lines.append(f'env {new_env} {{"release": "0.5.19", "lane": "cu129"}}')
    r = result(parse_status(lines))
    rolled, old = r.ranks[0], r.ranks[1]
    assert (rolled.engine, rolled.sglang_version, rolled.lane) == (new_env, "0.5.19", "cu129")
    assert rolled.model_revision == new_key
    assert (old.engine, old.sglang_version, old.model_revision) == (
        "0.5.11-cu128-fb8f6a42",
        "0.5.11",
        "21d5607c34a07d56",
    )
    assert r.healthy  # both serve: what each runs is information, not a failure


def test_a_crash_looping_rank_ends_failed_and_is_shown() -> None:
    lines = output("eight-ranks-and-the-router-healthy")
    at = lines.index("Id=sglang@4.service")
    block_start = max(i for i in range(at) if lines[i] == "") + 1
    block = {
        "MainPID": "0",
        "NRestarts": "5",
        "ActiveState": "failed",
        "SubState": "failed",
        "LoadState": "loaded",
        "Id": "sglang@4.service",
    }
    lines = [*lines[:block_start], *(f"{k}={v}" for k, v in block.items()), *lines[at + 1 :]]
    lines = [("health 4 refused" if line == "health 4 200" else line) for line in lines]
    r = result(parse_status(lines))
    four = r.ranks[4]
    assert (four.state, four.healthy, four.restarts, four.pid) == (
        "failed (failed)",
        False,
        5,
        None,
    )
    assert "rank 4 failed (failed), refused" in r.summary() and st.exit_status([r]) == 1


def test_nvidia_smi_failures_are_kept_not_raised() -> None:
    assert fact("no-nvidia-smi").gpu_error == "nvidia-smi not found"
    hung = parse_status(["gpu_rc 124"])
    assert hung.gpu_error == "nvidia-smi did not answer within 10s" and hung.gpus == []
    odd = parse_status(["gpu what is this", "gpu_rc 0"])
    assert odd.gpus == [] and odd.gpu_error is not None and "unexpected" in odd.gpu_error


def test_the_fact_asks_for_every_configured_rank_and_the_router_in_one_command() -> None:
    settings = make_settings(dp_size=3, server_host="0.0.0.0", router=ROUTER)
    args = st.fact_args(settings, "ct200")
    assert args["ranks"] == [0, 1, 2] and args["router"] is True
    assert args["health_urls"] == {
        "0": "http://127.0.0.1:30000/health",
        "1": "http://127.0.0.1:30001/health",
        "2": "http://127.0.0.1:30002/health",
        "router": "http://127.0.0.10:8000/health",
    }
    command = ServingStatus().command(**args).get_raw_value()
    for unit in ("sglang@0.service", "sglang@2.service", "sglang-router.service"):
        assert unit in command
    # Another host's router is not this host's business.
    assert st.fact_args(settings, "ct201")["router"] is False
    assert layout.health_url("fd00::1", 30000) == "http://[fd00::1]:30000/health"


# -- exit status and JSON -------------------------------------------------------------------


def test_json_document_shape() -> None:
    good = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    gone = st.HostResult("ct201", reachable=False, error="Could not connect (refused)")
    doc = json.loads(json.dumps(st.to_json([good, gone])))
    assert set(doc) == {"hosts", "healthy"} and doc["healthy"] is False
    assert doc["hosts"]["ct201"] == {
        "reachable": False,
        "error": "Could not connect (refused)",
        "healthy": False,
        "probed": False,
        "ranks": [],
        "router": None,
        "toolkit": None,
    }
    host = doc["hosts"]["ct200"]
    assert host["reachable"] is True and host["error"] is None and host["healthy"] is True
    assert set(host["ranks"][0]) == {
        "rank", "unit", "port", "expected", "state", "health", "healthy", "sglang_version",
        "lane", "engine", "model", "model_revision", "gpu", "gpu_name", "gpu_memory_used_mib",
        "gpu_memory_total_mib", "pid", "uptime_s", "restarts", "model_path", "running_reqs",
        "queued_reqs", "metrics", "router_state", "router_stalled", "answered", "latency_s",
        "tokens", "answer", "startup",
    }  # fmt: skip
    assert host["router"]["healthy"] is True
    assert st.to_json([good])["healthy"] is True


def test_exit_status() -> None:
    good = result(fact("eight-ranks-and-the-router-healthy"))
    gone = st.HostResult("ct201", reachable=False, error="refused")
    broken = st.HostResult("ct202", reachable=True, error="status: boom")
    assert st.exit_status([good]) == 0
    assert st.exit_status([good, gone]) == 1
    assert st.exit_status([good, broken]) == 1
    assert st.exit_status([]) == 1  # nothing checked is not "healthy"


def test_the_table_and_the_summary_lines() -> None:
    console = Console(record=True, width=220)
    good = result(fact("rank-2-stopped"), router=ROUTER)
    gone = st.HostResult("ct201", reachable=False, error="Could not connect (refused)")
    st.print_results([good, gone], console=console)
    text = console.export_text()
    assert "0.5.11 cu128" in text and "Qwen/Qwen3.6-27B@21d5607c34a07d56" in text
    assert f"0 {GPU}, 0.0/96 GiB" in text and "inactive (dead)" in text
    assert "ct200: 7/8 ranks healthy (rank 2 inactive (dead), refused)" in text
    assert "ct201: unreachable: Could not connect (refused)" in text
    assert text.rstrip().endswith("NOT healthy: ct200, ct201")


@pytest.mark.parametrize("probed", [False, True])
def test_at_80_columns_every_rank_is_one_line_with_its_port_whole(probed: bool) -> None:
    """Issue 30: below WIDE_COLUMNS what the ranks share is said once, the columns are short,
    and no port is cut (`300…`); at WIDE_COLUMNS and more the wide table is kept."""
    r = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    r = st.with_probe(r, probe("3")) if probed else r
    console = Console(record=True, width=80)
    st.print_results([r], console=console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text
    assert "sglang 0.5.11 cu128, Qwen/Qwen3.6-27B@21d5607c34a07d56" in text
    for rank in range(8):
        (row,) = [ln for ln in lines if ln.split()[:1] == [str(rank)]]
        assert f" {30000 + rank} " in row and "running" in row and " ok " in row, row
        if probed:
            assert row.rstrip().endswith("no 4ms" if rank == 3 else "yes 12ms 12t"), row
    wide = Console(record=True, width=st.view.WIDE_COLUMNS)
    st.print_results([r], console=wide)
    assert "active (running)" in wide.export_text()


def test_a_width_the_user_gives_is_kept_when_the_output_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped with COLUMNS=80 (a pager, `make demo-day2` in an 80-column window): the narrow table;
    piped with no width said (a log file): the wide one, whose rows never wrap."""
    r = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    monkeypatch.setenv("COLUMNS", "80")
    st.print_results([r])
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
    monkeypatch.delenv("COLUMNS")
    st.print_results([r])
    assert "active (running)" in capsys.readouterr().out


# -- --probe: a chat request per rank -------------------------------------------------------


def probe(*bad: str, error: str | None = None) -> Probe:
    """Every rank and the router answered, except `bad` (rank numbers as text, or "router")."""
    answers = {}
    for key in [*map(str, range(8)), "router"]:
        if key in bad:
            answers[key] = ProbeAnswer(False, 0.004, why="POST ...: 200 with an empty body")
        else:
            answers[key] = ProbeAnswer(True, 0.012, 12)
    return Probe({} if error else answers, error)


def test_probe_rows_say_answered_latency_and_tokens() -> None:
    r = st.with_probe(result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER), probe())
    assert r.probed and r.healthy and st.exit_status([r]) == 0
    first = r.ranks[0]
    assert (first.answered, first.latency_s, first.tokens, first.answer) == (True, 0.012, 12, "ok")
    assert r.router is not None and r.router.answered is True
    assert r.summary() == (
        "ct200: 8/8 ranks healthy, router healthy; 8/8 ranks answered a chat request, "
        "router answered"
    )
    console = Console(record=True, width=260)
    st.print_results([r], console=console)
    text = console.export_text()
    assert "answered" in text and "latency" in text and "tokens" in text
    assert "12 ms" in text and "router answered" in text


def test_a_rank_that_does_not_answer_is_exit_1_and_named() -> None:
    healthy = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    r = st.with_probe(healthy, probe("3"))
    assert not r.healthy and st.exit_status([r]) == 1
    assert r.ranks[3].answered is False and r.ranks[3].answer == "POST ...: 200 with an empty body"
    assert all(row.healthy for row in r.ranks), "healthy by /health, yet not answering"
    assert "7/8 ranks answered a chat request" in r.summary()
    assert "rank 3: POST ...: 200 with an empty body" in r.summary()
    doc = st.to_json([r])
    assert doc["healthy"] is False and doc["hosts"]["ct200"]["probed"] is True
    assert doc["hosts"]["ct200"]["ranks"][3]["answered"] is False
    router_down = st.with_probe(healthy, probe("router"))
    assert st.exit_status([router_down]) == 1 and "router did NOT" in router_down.summary()


def test_a_probe_that_could_not_run_counts_as_no_answer() -> None:
    healthy = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    r = st.with_probe(healthy, probe(error="no engine environment or smoke script on the host"))
    assert st.exit_status([r]) == 1
    assert {row.answer for row in r.ranks} == {"no engine environment or smoke script on the host"}


def test_without_probe_no_columns_and_health_alone_decides() -> None:
    r = result(fact("eight-ranks-and-the-router-healthy"), router=ROUTER)
    assert not r.probed and r.ranks[0].answered is None and st.exit_status([r]) == 0
    console = Console(record=True, width=260)
    st.print_results([r], console=console)
    assert "latency" not in console.export_text()


def test_probe_args_ask_every_rank_and_the_router_with_a_units_python() -> None:
    status = fact("eight-ranks-and-the-router-healthy")
    settings = make_settings(server_host="127.0.0.10", router=ROUTER)
    args = st.probe_args(settings, "ct200", status)
    assert args["python"] == "/opt/sglang/envs/0.5.11-cu128-fb8f6a42/bin/python"
    assert args["model"] == "Qwen/Qwen3.6-27B" and args["timeout_s"] == 120.0
    assert args["targets"] == {
        **{str(r): f"http://127.0.0.10:{30000 + r}/v1" for r in range(8)},
        "router": "http://127.0.0.10:8000/v1",
    }
    elsewhere = st.probe_args(settings, "ct201", Serving())
    assert "router" not in elsewhere["targets"]
    assert elsewhere["python"] == "/opt/sglang/current/bin/python"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (7, "7s"), (75, "1m15s"), (3 * 3600 + 60, "3h01m"), (2 * 86400 + 7200, "2d02h")],
)
def test_uptime_is_short(seconds: int | None, shown: str) -> None:
    assert st._duration(seconds) == shown


# -- the command, against @fake and a closed port -------------------------------------------


def write_inventory(tmp_path: Path) -> Path:
    """@fake/ct200 answers with the captured healthy output; ct201's SSH port is closed."""
    # The router's control-plane key is made beside the engine locks: here, not in the project.
    settings = {
        "model_source": "/srv/models/qwen",
        "server_host": "127.0.0.10",
        "engine_lock_dir": str(tmp_path / "locks"),
    }
    fake = {
        **settings,
        "router": {**ROUTER, "host": "@fake/ct200"},
        "fake_responses": {"systemctl show": output("eight-ranks-and-the-router-healthy")},
        "fake_delay": 0,
        "fake_delay_jitter": 0,
    }
    closed = {**settings, "ssh_hostname": "127.0.0.1", "ssh_port": 1, "ssh_user": "root"}
    path = tmp_path / "inventory.py"
    path.write_text(f"hosts = [\n    ('@fake/ct200', {fake!r}),\n    ('ct201', {closed!r}),\n]\n")
    return path


def test_one_command_per_host(tmp_path: Path) -> None:
    from operations.runtime.inventory import open_session

    session = open_session(str(write_inventory(tmp_path)), {})
    state = session.state
    results = st.read_hosts(session)
    assert [(r.name, r.reachable) for r in results] == [("@fake/ct200", True), ("ct201", False)]
    from pyinfra.connectors.fake import FakeConnector

    fake = next(h for h in state.inventory if h.name == "@fake/ct200")
    assert isinstance(fake.connector, FakeConnector)
    assert len(fake.connector.executed_commands) == 1
    assert results[0].summary() == "@fake/ct200: 8/8 ranks healthy, router healthy"


PROBES = ROOT / "tests" / "facts" / "smoke.SmokeProbe"
REFUSED_0 = "GET /v1/models: no answer (connection failed ([Errno 111] Connection refused))"
GARBAGE_1 = (
    "POST /v1/chat/completions: 200 with a malformed body "
    """'{"id": "chatcmpl-double", "object": "chat.completion", "choi'"""
)
NOT_DEPLOYED = "no engine environment or smoke script on the host (run the deploy)"
WRONG_1 = (
    "POST /v1/chat/completions: not a truthful answer: asked 'What is 867 + 313? Reply with the "
    "number only.', answered '1181' (the sum is 1180)"
)
# One answer: (answered, latency_s, tokens, what the row says).
Answer = tuple[bool | None, float | None, int | None, str | None]


@pytest.mark.parametrize(
    ("case", "ranks", "router", "exit_status"),
    [
        (
            "all-answered",
            [(True, 0.012, 12, "ok"), (True, 0.009, 12, "ok")],
            (True, 0.031, 12, "ok"),
            0,
        ),
        (
            "one-rank-answers-garbage",
            [(False, None, None, REFUSED_0), (False, 0.004, None, GARBAGE_1)],
            (True, 0.02, 12, "ok"),
            1,
        ),
        (
            # Fluent but wrong: not answering truthfully is not answering (exit 1).
            "one-rank-answers-wrong-sums",
            [(True, 0.004, 12, "ok"), (False, 0.002, None, WRONG_1)],
            (True, 0.02, 12, "ok"),
            1,
        ),
        (
            "never-deployed",
            [(False, None, None, NOT_DEPLOYED)] * 2,
            (False, None, None, NOT_DEPLOYED),
            1,
        ),
    ],
)
def test_the_probe_is_one_round_trip_and_reports_what_each_rank_answered(
    tmp_path: Path, case: str, ranks: list[Answer], router: Answer, exit_status: int
) -> None:
    """The host answers the probe's command with the smoke script's output captured on the
    testbed (tests/facts/smoke.SmokeProbe: ranks 0 and 1 and the router, so dp_size 2)."""
    from pyinfra.connectors.fake import FakeConnector

    from operations.runtime.inventory import open_session

    captured = json.loads((PROBES / f"{case}.json").read_text())
    fake = {
        "model_source": "/srv/models/qwen",
        "server_host": "127.0.0.10",
        "dp_size": 2,
        "router": {**ROUTER, "host": "@fake/ct200"},
        "engine_lock_dir": str(tmp_path / "locks"),  # where the control-plane key is made
        "fake_responses": {
            "smoke.py --json": captured["output"],
            "systemctl show": output("eight-ranks-and-the-router-healthy"),
        },
        "fake_delay": 0,
        "fake_delay_jitter": 0,
    }
    path = tmp_path / "inventory.py"
    path.write_text(f"hosts = [('@fake/ct200', {fake!r})]\n")
    session = open_session(str(path), {})
    state = session.state

    (result,) = st.read_hosts(session, probe=True)

    host = next(iter(state.inventory))
    assert isinstance(host.connector, FakeConnector)
    # The status read, then the probe: the command the captured output answered.
    assert len(host.connector.executed_commands) == 2
    assert host.connector.executed_commands[1] == captured["command"]
    assert result.probed
    rows = [(r.answered, r.latency_s, r.tokens, r.answer) for r in result.ranks if r.expected]
    assert rows == ranks
    assert result.router is not None
    said = result.router
    assert (said.answered, said.latency_s, said.tokens, said.answer) == router
    assert st.exit_status([result]) == exit_status


@pytest.mark.integration
def test_the_cli_reports_an_unreachable_host_in_one_line(tmp_path: Path) -> None:
    path = write_inventory(tmp_path)
    run = [sys.executable, "-m", "operations.status", str(path)]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert "@fake/ct200: 8/8 ranks healthy, router healthy" in proc.stdout
    unreachable = [line for line in proc.stdout.splitlines() if line.startswith("ct201:")]
    assert len(unreachable) == 1 and "unreachable" in unreachable[0], proc.stdout
    assert proc.stderr == ""

    proc = subprocess.run([*run, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["healthy"] is False
    assert doc["hosts"]["ct201"]["reachable"] is False and doc["hosts"]["ct201"]["error"]
    assert doc["hosts"]["@fake/ct200"]["healthy"] is True


@pytest.mark.integration
def test_a_host_with_invalid_settings_is_not_contacted(tmp_path: Path) -> None:
    path = tmp_path / "inventory.py"
    bad = {"model_source": "/srv/models/qwen", "dp_size": "eight", "fake_delay": 0}
    path.write_text(f"hosts = [('@fake/ct200', {bad!r})]\n")
    run = [sys.executable, "-m", "operations.status", str(path), "--json"]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    host = json.loads(proc.stdout)["hosts"]["@fake/ct200"]
    assert host["reachable"] is False and host["error"].startswith("settings: dp_size = 'eight'")
    result = st.HostResult("ct200", False, "settings: dp_size ...", invalid_settings=True)
    assert result.summary() == "ct200: not checked: settings: dp_size ..."


@pytest.mark.integration
def test_a_missing_inventory_is_exit_2() -> None:
    run = [sys.executable, "-m", "operations.status", "no/such/inventory.py"]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_a_rank_that_does_not_run_its_unit_file_shows_pending_restart() -> None:
    """Issue 31: rank 1's file changed after its process started, rank 2's and systemd was not
    reloaded (a deploy killed between the write and the restart); rank 0 runs its file."""
    r = result(fact("killed-between-write-and-restart"), dp_size=3)
    states = [row.state for row in r.ranks]
    assert states == [
        "active (running)",
        "active (running), pending restart: its unit file changed after the process started",
        "active (running), pending restart: its unit file changed and systemd was not reloaded",
    ]
