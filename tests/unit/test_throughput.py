"""The throughput check's pure parts: the guard (programs/throughput_guard.py), the plan
(plan/throughput_plan.py), the knowledge of each release's client (knowledge/bench/) and the
settings; and, marked integration, the host program (programs/throughput.py, bundled as the host
runs it) against two SGLang server doubles with the client double, on this machine.
The deploy's step, on the testbed, is tests/e2e/test_throughput.py."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from operations import layout
from operations.kb.bench_client import BENCH_DIR, load_bench_client
from operations.plan import throughput_plan as tp
from operations.plan.resolver import Rank
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
