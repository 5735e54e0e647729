"""The throughput check's pure parts: the guard (programs/throughput_guard.py), the plan
(plan/throughput_plan.py), the knowledge of each release's client (knowledge/bench/) and the
settings; and, marked integration, the host program (programs/throughput.py, bundled as the host
runs it) against two SGLang server doubles with the client double, on this machine.
The deploy's step, on the testbed, is tests/e2e/test_throughput.py."""

from __future__ import annotations

import functools
import http.server
import ipaddress
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from operations import layout
from operations.kb.bench_client import BENCH_DIR, load_bench_client
from operations.plan import throughput_plan as tp
from operations.plan.resolver import Rank
from operations.programs import hostsafe
from operations.programs import throughput as program
from operations.programs import throughput_guard as guard
from operations.programs.throughput_guard import Record
from operations.render.host_scripts import script_text
from operations.settings import SettingsError
from tests.doubles import wheels
from tests.unit.builders import make_settings

ROOT = Path(__file__).resolve().parents[2]
KNOWLEDGE = ROOT / "operations" / "kb" / "knowledge"


def record(tok_s: float, ranks: dict[str, float], **workload: Any) -> Record:
    w: guard.Workload = {
        "input_len": 1024,
        "output_len": 512,
        "concurrency_per_rank": 32,
        "prompts_per_rank": 64,
        "model": "m",
        "model_digest": "d",
        "ranks": len(ranks),
        "through": "router",
    }
    w.update(workload)  # type: ignore[typeddict-item]
    return {
        "release": "0.5.11",
        "engine": "/opt/sglang/e",
        "model_digest": "d",
        "flags_digest": "f" * 64,
        "workload": w,
        "time": "t",
        "prompts": 64,
        "completed": 64,
        "errors": 0,
        "output_tok_s": tok_s,
        "total_tok_s": tok_s * 3,
        "per_rank": {
            n: {"generated": r * 60, "requests": 8.0, "output_tok_s": r} for n, r in ranks.items()
        },
    }


# -- the guard ---------------------------------------------------------------------------


def test_a_first_run_has_nothing_to_compare() -> None:
    verdict = guard.judge(record(1000, {"a": 500, "b": 500}), [], 0.1, "fail")
    assert verdict.ok and verdict.previous is None
    assert "first run of this workload on this host: nothing to compare" in verdict.line


def test_within_the_slowdown_passes_and_says_the_change() -> None:
    last = record(1000, {"a": 500, "b": 500})
    verdict = guard.judge(record(950, {"a": 470, "b": 480}), [last], 0.1, "fail")
    assert verdict.ok and verdict.ratio == pytest.approx(0.95)
    assert "-5.0% against the last record" in verdict.line


def test_a_slower_run_fails_by_name_with_both_records_the_ratio_and_the_ranks_that_fell() -> None:
    older = record(2000, {"a": 1000, "b": 1000})
    last = record(1000, {"a": 500, "b": 500})
    now = record(800, {"a": 500, "b": 300})
    verdict = guard.judge(now, [older, last], 0.1, "fail")
    assert not verdict.ok and verdict.previous is last and verdict.fell == ["b"]
    assert "ratio 0.800" in verdict.line and "ranks that fell: b" in verdict.line
    assert "last: t sglang 0.5.11" in verdict.line and "1000.0 output tok/s" in verdict.line
    assert "this run: t sglang 0.5.11" in verdict.line and "800.0 output tok/s" in verdict.line


def test_warn_passes_a_slower_run_with_a_warning() -> None:
    last = record(1000, {"a": 500, "b": 500})
    verdict = guard.judge(record(500, {"a": 250, "b": 250}), [last], 0.1, "warn")
    assert verdict.ok and verdict.warning and verdict.line.startswith("WARNING throughput:")


def test_only_the_same_workload_is_compared() -> None:
    other = record(5000, {"a": 2500, "b": 2500}, output_len=128)
    verdict = guard.judge(record(1000, {"a": 500, "b": 500}), [other], 0.1, "fail")
    assert verdict.ok and verdict.previous is None


def test_a_run_whose_requests_failed_is_never_the_one_compared_with() -> None:
    good = record(1000, {"a": 500, "b": 500})
    failed = record(0, {"a": 0, "b": 0})
    failed["errors"], failed["completed"] = 64, 0
    verdict = guard.judge(record(500, {"a": 250, "b": 250}), [good, failed], 0.1, "fail")
    assert not verdict.ok and verdict.previous is good


def test_failed_requests_fail_the_check() -> None:
    now = record(1000, {"a": 500, "b": 500})
    now["errors"], now["first_error"] = 3, "router: the client exited 1"
    verdict = guard.judge(now, [], 0.1, "warn")
    assert not verdict.ok and "3 of 64 requests failed (router: the client exited 1)" in (
        verdict.line
    )


@pytest.mark.parametrize(
    ("generated", "hungry"),
    [
        ({"a": 100.0, "b": 100.0, "c": 100.0}, []),
        ({"a": 150.0, "b": 100.0, "c": 50.0}, []),
        ({"a": 150.0, "b": 140.0, "c": 10.0}, ["c"]),
        ({"a": 300.0, "b": 0.0}, ["b"]),
        ({"a": 0.0, "b": 0.0}, ["a", "b"]),
    ],
)
def test_a_rank_under_half_an_even_share_is_starved(
    generated: dict[str, float], hungry: list[str]
) -> None:
    assert guard.starved(generated) == hungry


# -- the knowledge of each release's client ------------------------------------------------


def test_every_release_has_its_client_read_from_its_wheel_with_every_flag_and_field() -> None:
    releases = yaml.safe_load((KNOWLEDGE / "sglang.yaml").read_text())["releases"]
    assert sorted(p.name for p in BENCH_DIR.glob("*.json")) == sorted(
        f"sglang-{r}.json" for r in releases
    )
    for release in releases:
        client = load_bench_client(release)
        assert client is not None and client.missing(tp.CLIENT_FLAGS, tp.RESULT_FIELDS) == []
        raw = json.loads((BENCH_DIR / f"sglang-{release}.json").read_text())
        assert raw["release"] == release and raw["wheel"].startswith(f"sglang-{release}-")
        assert all(isinstance(line, int) for line in raw["choices"].values())
        assert raw["auth_env"]["OPENAI_API_KEY"] is not None
        # The move (read in the wheels): bench_serving.py up to 0.5.14, a stub after it.
        moved = tuple(int(p) for p in release.split(".")[:3]) >= (0, 5, 15)
        assert client.module == ("sglang.benchmark.serving" if moved else "sglang.bench_serving")
        assert client.file == client.module.replace(".", "/") + ".py"
        assert (raw["deprecated_stub"] is not None) == moved


# -- the plan ---------------------------------------------------------------------------------


def ranks(n: int = 2) -> list[Rank]:
    return [
        Rank(
            rank=r,
            gpu=r,
            port=30000 + r,
            argv=["--port", str(30000 + r)],
            env={},
            unit_name=layout.unit_name(r),
            unit="",
            engine_env="/opt/sglang/envs/e1",
            model_path="/dev/shm/models/m",
        )
        for r in range(n)
    ]


def plan(changed: bool = True, router_here: bool = False, **kw: Any) -> tp.ThroughputPlan:
    s = make_settings(**kw)
    return tp.throughput_plan(s, ranks(), changed, router_here, "digest1", {})


def test_off_runs_nothing_and_ships_nothing() -> None:
    decided = plan(throughput_check="off")
    assert decided.run is None and decided.files == [] and decided.skip == "throughput_check: off"


def test_after_change_without_a_change_ships_the_script_and_runs_nothing() -> None:
    decided = plan(changed=False)
    assert decided.run is None and [f.path for f in decided.files] == [layout.THROUGHPUT_SCRIPT]
    assert "no rank or router (re)started" in decided.skip
    assert plan(changed=False, throughput_check="always").run is not None


def _arg(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_per_rank_without_a_router_and_the_releases_own_module() -> None:
    run = plan(sglang_version="0.5.23").run
    assert run is not None and run.through == "ranks"
    assert _arg(run.argv, "--module") == ["sglang.benchmark.serving"]
    assert _arg(run.argv, "--target") == [
        "sglang@0.service=http://127.0.0.1:30000",
        "sglang@1.service=http://127.0.0.1:30001",
    ]
    meta = json.loads(_arg(run.argv, "--meta")[0])
    assert meta["workload"] == {
        "input_len": 1024,
        "output_len": 512,
        "concurrency_per_rank": 32,
        "prompts_per_rank": 64,
        "model": meta["workload"]["model"],
        "model_digest": "digest1",
        "ranks": 2,
        "through": "ranks",
    }
    assert _arg(run.argv, "--guard") == ["fail"] and _arg(run.argv, "--max-slowdown") == ["0.1"]


def test_through_the_router_on_its_host_and_no_key_on_the_command_line() -> None:
    router = {"host": "@local", "port": 8000}
    run = plan(router_here=True, router=router, api_key_file=str(ROOT / "README.md")).run
    assert run is not None and run.through == "router"
    assert _arg(run.argv, "--target") == ["router=http://127.0.0.1:8000"]
    assert len(_arg(run.argv, "--rank")) == 2
    assert _arg(run.argv, "--module") == ["sglang.bench_serving"]
    assert _arg(run.argv, "--key-file") == [layout.SECRETS_FILE]


def test_a_release_without_client_knowledge_is_refused_before_any_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tp, "load_bench_client", lambda release: None)
    decided = plan()
    assert decided.run is None and len(decided.errors) == 1
    assert "has no benchmark client in the knowledge base" in decided.errors[0]
    assert "throughput_check: off" in decided.errors[0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("throughput_check", "sometimes"),
        ("throughput_guard", "ignore"),
        ("throughput_max_slowdown", 0),
        ("throughput_max_slowdown", 1.5),
        ("throughput_input_len", 0),
        ("throughput_concurrency_per_rank", 5000),
        ("throughput_timeout_s", 5),
    ],
)
def test_out_of_range_settings_are_refused_with_one_line(key: str, value: object) -> None:
    with pytest.raises(SettingsError) as caught:
        make_settings(**{key: value})
    (line,) = caught.value.problems
    assert key in line and "accepted:" in line


# -- the host program against the doubles (integration) -------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the sglang double of 0.5.11 (server and benchmark client)."""
    out = tmp_path_factory.mktemp("engine")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(out / "env")], check=True)
    (site,) = (out / "env" / "lib").glob("python3*/site-packages")
    with zipfile.ZipFile(wheels.sglang_wheel(out / "wheels", "0.5.11")) as zf:
        zf.extractall(site)
    return out / "env"


@pytest.fixture
def servers(engine: Path, tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """Two server doubles (rank 1 ten times slower), their URLs and the model copy."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    procs, urls = [], []
    for rank, rate in ((0, "4000"), (1, "400")):
        port = _free_port()
        env = {
            "PATH": os.environ["PATH"],
            "CUDA_VISIBLE_DEVICES": str(rank),
            "SGLANG_DOUBLE_LOAD_SECONDS": "0",
            "SGLANG_DOUBLE_TOKENS_PER_S": rate,
        }
        words = [str(engine / "bin" / "python"), "-m", "sglang.launch_server"]
        words += ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port)]
        words += ["--enable-metrics", "--api-key", "k3y"]
        procs.append(subprocess.Popen(words, env=env, stdout=subprocess.PIPE, text=True))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for proc in procs:  # the double prints this line once it is ready
            assert proc.stdout is not None
            for line in proc.stdout:
                if "ready: serving" in line:
                    break
        yield urls, model
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def run_program(
    engine: Path,
    tmp: Path,
    urls: list[str],
    model: Path,
    targets: list[str],
    through: str,
    module: str = "sglang.bench_serving",
) -> tuple[int, list[str]]:
    program = tmp / "throughput.py"
    program.write_text(script_text("throughput.py"))
    secrets = tmp / "secrets.yaml"
    secrets.write_text('api-key: "k3y"\n')
    workload = {"input_len": 8, "output_len": 16, "concurrency_per_rank": 2}
    workload.update(prompts_per_rank=4, ranks=2)
    meta: dict[str, object] = {
        "release": "0.5.11",
        "engine": str(engine),
        "model_digest": "d",
        "flags_digest": "f",
    }
    meta["workload"] = {**workload, "model": "m", "model_digest": "d", "through": through}
    words = [sys.executable, str(program), "--python", str(engine / "bin" / "python")]
    words += ["--module", module, "--module-file", module.replace(".", "/") + ".py"]
    words += ["--model", "m", "--tokenizer", str(model)]
    for target in targets:
        words += ["--target", target]
    words += ["--rank", f"r0={urls[0]}", "--rank", f"r1={urls[1]}"]
    words += ["--input-len", "8", "--output-len", "16", "--concurrency-per-rank", "2"]
    words += ["--prompts-per-rank", "4", "--timeout", "60", "--key-file", str(secrets)]
    words += ["--service-user", pwd.getpwuid(os.getuid()).pw_name]
    words += ["--records", str(tmp / "records" / "t.jsonl"), "--meta", json.dumps(meta)]
    words += ["--max-slowdown", "0.1", "--guard", "fail"]
    proc = subprocess.run(words, capture_output=True, text=True, timeout=120)
    assert proc.stderr == ""
    return proc.returncode, proc.stdout.splitlines()


@pytest.mark.integration
def test_the_program_measures_each_rank_with_the_engines_client_and_keeps_a_record(
    engine: Path, servers: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, model = servers
    code, out = run_program(
        engine, tmp_path, urls, model, [f"r0={urls[0]}", f"r1={urls[1]}"], "ranks"
    )
    assert code == 0, out
    assert out[-1].startswith("throughput: ") and "nothing to compare" in out[-1]
    rec = json.loads(out[0].removeprefix("throughput "))
    assert (rec["completed"], rec["errors"], rec["through"]) == (8, 0, "ranks")
    # Each rank generated its 4 requests' 16 tokens (its own counters, after minus before).
    assert {n: r["generated"] for n, r in rec["per_rank"].items()} == {"r0": 64.0, "r1": 64.0}
    assert rec["output_tok_s"] > 0 and rec["ttft_ms"]["p50"] is not None
    kept = (tmp_path / "records" / "t.jsonl").read_text().splitlines()
    assert [json.loads(line)["time"] for line in kept] == [rec["time"]]
    # A second run compares with the first.
    code, out = run_program(
        engine, tmp_path, urls, model, [f"r0={urls[0]}", f"r1={urls[1]}"], "ranks"
    )
    assert "against the last record" in out[-1]
    assert len((tmp_path / "records" / "t.jsonl").read_text().splitlines()) == 2


@pytest.mark.integration
def test_a_rank_the_router_sends_nothing_fails_by_name(
    engine: Path, servers: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, model = servers
    # A "router" that reaches rank 0 only.
    code, out = run_program(engine, tmp_path, urls, model, [f"router={urls[0]}"], "router")
    assert code == 1
    assert "rank(s) r1 took (almost) no load through the router" in out[-1]
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["per_rank"]["r1"]["generated"] == 0 and not rec["verdict"]["ok"]


@pytest.mark.integration
def test_no_tokenizer_is_refused_before_the_client_runs(
    engine: Path, servers: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, model = servers
    (model / "tokenizer.json").unlink()
    code, out = run_program(engine, tmp_path, urls, model, [f"r0={urls[0]}"], "ranks")
    assert code == 2 and out == [
        f"throughput: refused: the model copy {model} has no tokenizer (tokenizer.json or "
        "tokenizer_config.json or tokenizer.model): the benchmark client loads it from there, "
        "offline; stage a model with its tokenizer files (on the controller: model_source), or "
        "set throughput_check: off"
    ]
    assert not (tmp_path / "records").exists()


# -- status: the last record and the one before it -------------------------------------------


def test_status_shows_the_last_record_beside_the_one_before_it_of_its_workload() -> None:
    from operations.cli.status.throughput import ThroughputView
    from operations.facts.throughput import parse_records

    older = record(1000, {"sglang@0.service": 500, "sglang@1.service": 500})
    other = record(5000, {"sglang@0.service": 2500}, output_len=64)
    last = record(900, {"sglang@0.service": 450, "sglang@1.service": 450})
    lines = [json.dumps(older), '{"cut by a cra', json.dumps(other), json.dumps(last)]
    view = ThroughputView.of(parse_records(lines))
    assert view.last == last and view.before == older and view.ratio == pytest.approx(0.9)
    shown = view.lines()
    assert (
        "900.0 output tok/s" in shown[0]
        and "per rank (output tok/s): sglang@0.service 450, sglang@1.service 450" in shown[0]
    )
    assert shown[1].endswith("(-10.0% now)")
    assert view.to_json()["ratio"] == pytest.approx(0.9)
    assert ThroughputView.of([]).lines() == [
        "  throughput: no record on this host (the deploy's check has not run)"
    ]


def test_the_ceilings_hook_says_nothing_without_ceilings_and_the_share_with_them() -> None:
    now = record(1000, {"a": 500, "b": 500})  # total 3000 tok/s over 2 ranks
    now["ranks"] = 2
    assert guard.beside_ceilings(now, None) is None
    ceilings: guard.Ceilings = {
        "one_stream_tok_s": 33.0,
        "full_batch_tok_s": 9300.0,
        "source": "knowledge",
    }
    said = guard.beside_ceilings(now, ceilings)
    assert said is not None and said.startswith("per GPU 1500 tokens/s (input and output), 16%")


@pytest.mark.integration
def test_an_engine_without_the_client_module_is_refused_before_the_client_runs(
    engine: Path, servers: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, model = servers
    # 0.5.11's engine has no sglang.benchmark.serving (the double's wheel leaves it out, as
    # the real 0.5.11 wheel has none).
    module = "sglang.benchmark.serving"
    code, out = run_program(engine, tmp_path, urls, model, [f"r0={urls[0]}"], "ranks", module)
    assert code == 2 and len(out) == 1
    assert out[0].startswith(f"throughput: refused: the engine {engine} has no ")
    assert "sglang/benchmark/serving.py, SGLang's benchmark client for this release" in out[0]
    assert not (tmp_path / "records").exists()


def test_the_plan_passes_the_cards_ceilings_from_the_knowledge_base() -> None:
    card = tp.card_ceilings("NVIDIA RTX PRO 6000 Blackwell Server Edition", 54 * 10**9, None)
    assert card is not None
    # 1,792 GB/s over 54 GB of bf16 weights; ~504 dense TFLOPS over 2 x 27e9 FLOP a token.
    assert card["one_stream_tok_s"] == pytest.approx(33.2, abs=0.1)
    assert 9000 < card["full_batch_tok_s"] < 9600
    assert tp.card_ceilings("a card nobody listed", 54 * 10**9, None) is None
    assert tp.card_ceilings(None, 54 * 10**9, None) is None
    s = make_settings()
    decided = tp.throughput_plan(s, ranks(), True, False, "d", {}, card)
    assert decided.run is not None
    assert json.loads(_arg(decided.run.argv, "--ceilings")[0]) == card


def test_bench_runs_the_throughput_step_alone_always_and_refuses_a_locked_host_at_once() -> None:
    from operations.cli.bench import pyinfra_words

    words = pyinfra_words("inv.py", ["throughput_check=off", "model_name=x"])
    assert words[1:4] == ["-y", "inv.py", str(ROOT / "operations" / "bench_deploy.py")]
    # The user's --data first; the bench's own last, so they win (pyinfra keeps the last).
    assert words[4:] == [
        "--data",
        "throughput_check=off",
        "--data",
        "model_name=x",
        "--data",
        "throughput_check=always",
        "--data",
        "deploy_lock_wait_s=0",
    ]


# -- the guard's baseline: a failed check is not one -----------------------------------------


def test_a_record_whose_verdict_failed_is_never_the_baseline_and_a_warned_one_is() -> None:
    good = record(1000, {"a": 500, "b": 500})  # an older record: no verdict, it counts
    refused = record(500, {"a": 250, "b": 250})
    refused["verdict"] = {"ok": False, "ratio": 0.5, "fell": ["a", "b"]}
    # A second slower run is compared with the last good one, not with the refused one.
    verdict = guard.judge(record(500, {"a": 250, "b": 250}), [good, refused], 0.1, "fail")
    assert not verdict.ok and verdict.previous is good
    # Accepted once with throughput_guard: warn (ok true): the new rate is the baseline.
    warned = record(500, {"a": 250, "b": 250})
    warned["verdict"] = {"ok": True, "ratio": 0.5, "fell": ["a", "b"]}
    history = [good, refused, warned]
    verdict = guard.judge(record(500, {"a": 250, "b": 250}), history, 0.1, "fail")
    assert verdict.ok and verdict.previous is warned


def test_a_rank_whose_share_is_unknown_is_not_named_as_one_that_fell() -> None:
    last = record(1000, {"a": 500, "b": 500})
    now = record(500, {"a": 250, "b": 500})
    now["per_rank"]["b"] = {"generated": None, "requests": None, "output_tok_s": None}
    assert guard.judge(now, [last], 0.1, "fail").fell == ["a"]


# -- the host program's own guards, in this process -------------------------------------------
# The program's parts on this machine: a fake engine (its client module a file, its python
# never run: the client is a stand-in, `run_client` replaced), two ranks' /metrics pages served
# here, and the listeners the program reads given by the test (main's `listeners`).

KEY = "sk-throughput-key-4c1d9e"
ME = pwd.getpwuid(os.getuid()).pw_name
OTHER = 65534 if os.getuid() != 65534 else 65533
TIME = "2026-12-06T10:00:00Z"
WHO = (
    "(the key is sent only to the service user's listeners; docs/reference/troubleshooting.md "
    '"Who is sent the API key")'
)
RESULT = {
    "completed": 8,
    "duration": 2.0,
    "output_throughput": 64.0,
    "total_throughput": 96.0,
    "median_ttft_ms": 10.0,
    "p99_ttft_ms": 20.0,
}


class MetricsPage:
    """A rank's /metrics, served here: each read 100 more generated tokens and one more request
    than the one before; past `good_reads` reads, HTTP 500. Stopped by the fixture."""

    def __init__(self) -> None:
        self.reads = 0
        self.good_reads: int | None = None
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page.reads += 1
                if page.good_reads is not None and page.reads > page.good_reads:
                    self.send_error(500)
                    return
                body = (
                    f'sglang:generation_tokens_total{{model_name="m"}} {100 * page.reads}\n'
                    f'sglang:num_requests_total{{model_name="m"}} {page.reads}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        # A short poll: the fixture stops two pages a test (shutdown waits for one poll).
        serve = functools.partial(self.server.serve_forever, poll_interval=0.05)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()


@dataclass
class Bench:
    """One host for the program: its files, its two ranks' pages, the clients it started."""

    tmp: Path
    pages: list[MetricsPage]
    clients: list[dict[str, Any]] = field(default_factory=list)
    # What each stand-in client does: (exit status, output, result or None), or raises.
    client: Callable[[Bench, dict[str, Any]], tuple[int, str, dict[str, Any] | None]] = (
        lambda bench, seen: (0, "ok", RESULT)
    )

    @property
    def records(self) -> Path:
        return self.tmp / "state" / "throughput.jsonl"

    @property
    def pending(self) -> Path:
        return self.tmp / "state" / "throughput.pending"

    def argv(self, through: str = "ranks", *extra: str, **flags: str) -> list[str]:
        workload = {"input_len": 8, "output_len": 16, "concurrency_per_rank": 2}
        workload.update(prompts_per_rank=4, ranks=2)
        meta: dict[str, object] = {
            "release": "0.5.11",
            "engine": "e",
            "model_digest": "d",
            "flags_digest": "f",
        }
        meta["workload"] = {**workload, "model": "m", "model_digest": "d", "through": through}
        given = {
            "--python": str(self.tmp / "engine" / "bin" / "python"),
            "--module": "sglang.bench_serving",
            "--module-file": "sglang/bench_serving.py",
            "--model": "m",
            "--tokenizer": str(self.tmp / "model"),
            "--input-len": "8",
            "--output-len": "16",
            "--concurrency-per-rank": "2",
            "--prompts-per-rank": "4",
            "--timeout": "60",
            "--key-file": str(self.tmp / "secrets.yaml"),
            "--service-user": ME,
            "--records": str(self.records),
            "--pending": str(self.pending),
            "--meta": json.dumps(meta),
            "--max-slowdown": "0.1",
            "--guard": "fail",
            "--time": TIME,
        }
        given.update({"--" + k.replace("_", "-"): v for k, v in flags.items()})
        words = [w for k, v in given.items() for w in (k, v)]
        ranks = [f"r{i}={page.url}" for i, page in enumerate(self.pages)]
        targets = [f"router={self.router}"] if through == "router" else ranks
        words += [w for t in targets for w in ("--target", t)]
        words += [w for r in ranks for w in ("--rank", r)]
        return [*words, *extra]

    @property
    def router(self) -> str:
        return self.pages[0].url  # a "router" that is rank 0: only the listener check asks

    def run(
        self, argv: list[str], capsys: pytest.CaptureFixture[str], owners: dict[int, int] | None
    ) -> tuple[int, list[str]]:
        """main(argv) with these listeners (port: uid; None: each page's port, this user's)."""
        if owners is None:
            owners = {page.port: os.getuid() for page in self.pages}
        found = [
            hostsafe.Listener(ipaddress.ip_address("127.0.0.1"), port, uid)
            for port, uid in owners.items()
        ]
        code = program.main(argv, lambda: found)
        out, err = capsys.readouterr()
        assert err == ""
        return code, out.splitlines()


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bench]:
    site = tmp_path / "engine" / "lib" / "python3.11" / "site-packages" / "sglang"
    site.mkdir(parents=True)
    (site / "bench_serving.py").write_text("")
    (tmp_path / "engine" / "bin").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    pages = [MetricsPage(), MetricsPage()]
    made = Bench(tmp_path, pages)

    def client(
        args: Any, words: list[str], key: str | None, work: str, deadline: float, ids: Any
    ) -> tuple[int, str]:
        seen = {"words": words, "key": key, "work": work, "ids": ids}
        made.clients.append(seen)
        code, text, result = made.client(made, seen)
        if result is not None:
            out = words[words.index("--output-file") + 1]
            Path(out).write_text(json.dumps(result) + "\n")
        return code, text

    monkeypatch.setattr(program, "run_client", client)
    try:
        yield made
    finally:
        for page in pages:
            page.stop()


def test_a_passing_check_keeps_its_record_and_hands_the_key_to_the_client(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 0, out
    assert [c["key"] for c in bench.clients] == [KEY, KEY]
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["per_rank"]["r0"] == {"generated": 100.0, "requests": 1.0, "output_tok_s": 50.0}
    assert rec["verdict"]["ok"] and len(bench.records.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("through", "owners", "why"),
    [
        # A rank's port is another user's (a squatter, while it restarted).
        ("ranks", {0: OTHER, 1: -1}, "r0: {at0} is held by uid {other} ({who}), not by {me}"),
        # Through the router: the router forwards the key to the ranks.
        (
            "router",
            {0: -1, 1: OTHER},
            "the router forwards to r1: {at1} is held by uid {other} ({who}), not by {me}",
        ),
        ("router", {0: -1}, "the router forwards to r1: nothing listens on {at1}"),
    ],
)
def test_the_key_goes_to_no_listener_but_the_service_users(
    bench: Bench,
    capsys: pytest.CaptureFixture[str],
    through: str,
    owners: dict[int, int],
    why: str,
) -> None:
    ports = [page.port for page in bench.pages]
    uids = {ports[i]: (os.getuid() if uid == -1 else uid) for i, uid in owners.items()}
    code, out = bench.run(bench.argv(through), capsys, uids)
    expected = why.format(
        at0=f"127.0.0.1:{ports[0]}",
        at1=f"127.0.0.1:{ports[1]}",
        other=OTHER,
        who=hostsafe.user_name(OTHER),
        me=f"the service user {ME} (uid {os.getuid()})",
    )
    assert (code, out) == (2, [f"throughput: refused: {expected} {WHO}"])
    # Nothing ran, nothing was asked (not even /metrics), no record; the check is still due.
    assert bench.clients == [] and [p.reads for p in bench.pages] == [0, 0]
    assert not bench.records.exists()
    assert json.loads(bench.pending.read_text()) == {"started": TIME}


def test_a_service_user_that_does_not_exist_is_refused_before_anything_runs(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = bench.run(bench.argv(service_user="no-such-user-x"), capsys, None)
    assert (code, out) == (
        2,
        [
            "throughput: refused: r0: the service user 'no-such-user-x' does not exist on this "
            f"host {WHO}"
        ],
    )
    assert bench.clients == [] and not bench.records.exists()


def test_a_rank_whose_metrics_cannot_be_read_before_the_run_is_refused(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.pages[1].good_reads = 0
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 2 and len(out) == 1, out
    assert out[0].startswith(
        f"throughput: refused: rank r1: its /metrics ({bench.pages[1].url}/metrics) cannot be "
        "read (HTTPError: HTTP Error 500: Internal Server Error): "
    )
    assert bench.clients == [] and not bench.records.exists()


def test_a_rank_refusing_connections_before_the_run_is_refused(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.pages[1].stop()  # its port closed: the connection is refused
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 2 and len(out) == 1, out
    assert out[0].startswith(f"throughput: refused: rank r1: its /metrics ({bench.pages[1].url}")
    assert "cannot be read (URLError: <urlopen error [Errno 111] Connection refused>)" in out[0]
    assert bench.clients == [] and not bench.records.exists()


def test_a_rank_whose_metrics_cannot_be_read_after_the_run_fails_the_check_by_name(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.pages[1].good_reads = 1  # read before the run, not after it
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 1, out
    assert out[-1].endswith(
        "; rank(s) r1: /metrics could not be read after the run (r1: HTTPError: HTTP Error 500: "
        "Internal Server Error): the share is unknown"
    )
    # What was measured is kept, r1's share unknown; not a baseline, and the check stays due.
    (kept,) = [json.loads(line) for line in bench.records.read_text().splitlines()]
    assert kept["completed"] == 8 and kept["per_rank"]["r0"]["generated"] == 100.0
    assert kept["per_rank"]["r1"] == {"generated": None, "requests": None, "output_tok_s": None}
    assert kept["verdict"]["ok"] is False and bench.pending.exists()


@pytest.mark.parametrize(
    ("flags", "extra", "said"),
    [
        ({"meta": "{not json"}, [], "--meta is not JSON (Expecting property name"),
        ({"meta": "[]"}, [], "--meta is not a JSON object with release, engine, model_digest"),
        ({"ceilings": '{"source": 1}'}, [], "--ceilings is not a JSON object with numbers"),
        ({}, ["--target", "r0"], "--target 'r0' is not NAME=URL"),
        ({"guard": "sometimes"}, [], "the command line: argument --guard: invalid choice"),
        ({"timeout": "soon"}, [], "the command line: argument --timeout: invalid float value"),
    ],
)
def test_a_command_line_the_plan_could_not_have_written_is_refused_in_one_line(
    bench: Bench,
    capsys: pytest.CaptureFixture[str],
    flags: dict[str, str],
    extra: list[str],
    said: str,
) -> None:
    code, out = bench.run(bench.argv("ranks", *extra, **flags), capsys, None)
    assert code == 2 and len(out) == 1 and out[0].startswith("throughput: refused: "), out
    assert said in out[0] and "operations/plan/throughput_plan.py" in out[0]
    assert bench.clients == [] and not bench.records.exists() and not bench.pending.exists()


def test_unreadable_records_and_key_are_refused_in_one_line(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.records.mkdir(parents=True)
    code, out = bench.run(bench.argv(), capsys, None)
    assert (code, out) == (
        2,
        [
            f"throughput: refused: the records {bench.records} cannot be read (IsADirectoryError: "
            "Is a directory): remove what is there, or make it the records file it was"
        ],
    )
    code, out = bench.run(
        bench.argv(records=str(bench.tmp / "r.jsonl"), key_file="/"), capsys, None
    )
    assert code == 2 and out[0].startswith(
        "throughput: refused: the API key cannot be read from / (IsADirectoryError): "
    )
    assert bench.clients == []


def test_a_record_that_cannot_be_kept_fails_the_check_in_one_line(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def client(bench: Bench, seen: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
        bench.records.mkdir(parents=True, exist_ok=True)  # the records' place taken meanwhile
        return 0, "", RESULT

    bench.client = client
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 1 and out[-1] == (
        f"throughput: failed: the record was not kept in {bench.records} (IsADirectoryError: "
        "Is a directory): make that a file root may append to, and deploy again"
    )
    assert out[0].startswith("throughput {") and bench.pending.exists()


def test_what_nothing_names_is_one_masked_line_and_the_work_directory_goes(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def client(bench: Bench, seen: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
        raise RuntimeError(f"the client broke with {seen['key']} in hand")

    bench.client = client
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert (code, out) == (
        1,
        ["throughput: failed: RuntimeError: the client broke with *** in hand"],
    )
    (seen,) = bench.clients
    assert not os.path.exists(seen["work"])


def test_the_clients_output_is_masked_wherever_it_is_shown_and_its_directory_removed(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def client(bench: Bench, seen: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
        assert os.path.isdir(seen["work"])
        said = f"Traceback (most recent call last):\nheaders: Authorization: Bearer {seen['key']}"
        return 1, said + f"\nopenai.AuthenticationError: {seen['key']} was refused", None

    bench.client = client
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 1
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["first_error"] == (
        "router: the client exited 1 (Traceback (most recent call last): | headers: "
        "Authorization: Bearer *** | openai.AuthenticationError: *** was refused)"
    )
    assert KEY not in "\n".join(out) + bench.records.read_text()
    assert not any(os.path.exists(seen["work"]) for seen in bench.clients)


def test_a_result_file_the_client_made_a_link_is_not_read(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = bench.tmp / "roots-own.json"
    elsewhere.write_text(json.dumps(RESULT) + "\n")

    def client(bench: Bench, seen: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
        words = seen["words"]
        os.symlink(elsewhere, words[words.index("--output-file") + 1])
        return 0, "done", None

    bench.client = client
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 1 and json.loads(out[0].removeprefix("throughput "))["completed"] == 0


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="starts the client as a user: needs root")
def test_the_real_client_start_hands_the_key_in_its_environment_only(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # the program's own run_client
    python = bench.tmp / "engine" / "bin" / "python"
    python.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "print('cwd', os.getcwd()); print('key', os.environ.get('OPENAI_API_KEY'))\n"
        "print('argv', ' '.join(sys.argv[1:3])); sys.exit(3)\n"
    )
    python.chmod(0o755)
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 1
    first = json.loads(out[0].removeprefix("throughput "))["first_error"]
    assert first.startswith("router: the client exited 3 (cwd ") and KEY not in first
    assert first.endswith(" | key *** | argv -m sglang.bench_serving)")
    work = first.split("(cwd ", 1)[1].split(" | ", 1)[0]
    assert os.path.basename(work).startswith("throughput-") and not os.path.exists(work)


# -- the pending marker ------------------------------------------------------------------------


def _marker_at_start(bench: Bench, seen: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
    mode = os.lstat(bench.pending).st_mode
    seen["pending"] = (stat.S_ISREG(mode), stat.S_IMODE(mode), bench.pending.read_text())
    return 0, "", RESULT


@pytest.mark.parametrize("before", ["absent", "link", "fifo"])
def test_the_marker_is_there_while_the_check_runs_and_goes_when_it_passes(
    bench: Bench, capsys: pytest.CaptureFixture[str], before: str
) -> None:
    victim = bench.tmp / "victim"
    victim.write_text("not the marker's\n")
    bench.pending.parent.mkdir()
    if before == "link":
        bench.pending.symlink_to(victim)
    elif before == "fifo":
        os.mkfifo(bench.pending)  # written through, it would hold the program
    bench.client = _marker_at_start
    code, out = bench.run(bench.argv("router"), capsys, None)
    assert code == 0, out
    (seen,) = bench.clients
    assert seen["pending"] == (True, 0o644, json.dumps({"started": TIME}) + "\n")
    assert not os.path.lexists(bench.pending) and victim.read_text() == "not the marker's\n"
    assert sorted(p.name for p in bench.pending.parent.iterdir()) == ["throughput.jsonl"]


@pytest.mark.parametrize(("guard_flag", "code", "left"), [("fail", 1, True), ("warn", 0, False)])
def test_a_failed_check_leaves_the_marker_and_a_warned_one_removes_it(
    bench: Bench,
    capsys: pytest.CaptureFixture[str],
    guard_flag: str,
    code: int,
    left: bool,
) -> None:
    bench.client = _marker_at_start
    assert bench.run(bench.argv("router"), capsys, None)[0] == 0
    faster = json.loads(bench.records.read_text())
    faster["output_tok_s"] *= 2  # the last record: twice this run's rate
    bench.records.write_text(json.dumps(faster) + "\n")
    got, out = bench.run(bench.argv("router", guard=guard_flag), capsys, None)
    assert got == code and "-50.0% against the last record" in out[-1], out
    assert bench.pending.exists() == left
