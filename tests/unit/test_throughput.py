"""The throughput check's pure parts: the guard (programs/throughput_guard.py), the plan
(plan/throughput_plan.py) and the settings; and, marked integration, the host program
(programs/throughput.py, bundled as the host runs it, with its load client) against two SGLang
server doubles on this machine. The deploy's step, on the testbed, is
tests/e2e/test_throughput.py."""

from __future__ import annotations

import argparse
import functools
import hashlib
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
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.plan import throughput_plan as tp
from operations.plan.resolver import Rank
from operations.programs import hostsafe, load_client, load_runner
from operations.programs import throughput as program
from operations.programs import throughput_guard as guard
from operations.programs.throughput_guard import Record
from operations.render.host_scripts import script_text
from operations.settings import SettingsError
from tests.doubles import wheels
from tests.unit.builders import make_settings

ROOT = Path(__file__).resolve().parents[2]
CLIENT = load_client.CLIENT


def record(
    tok_s: float,
    ranks: dict[str, float],
    noise: float = 0.01,
    verdict: guard.Outcome | None = None,
    **workload: Any,
) -> Record:
    w: guard.Workload = {
        "input_len": 1024,
        "output_len": 512,
        "model": "m",
        "model_digest": "d",
        "ranks": len(ranks),
    }
    w.update(workload)  # type: ignore[typeddict-item]
    made: Record = {
        "release": "0.5.11",
        "engine": "/opt/sglang/e",
        "model_digest": "d",
        "flags_digest": "f" * 64,
        "workload": w,
        "gpu": "NVIDIA RTX PRO 6000",
        "driver": "570.172.08",
        "router": None,
        "server_args": ["--attention-backend flashinfer"],
        "time": "t",
        "client": CLIENT,
        "rounds": [tok_s * (1 - noise), tok_s, tok_s * (1 + noise)],
        "completed": 64,
        "errors": 0,
        "output_tok_s": tok_s,
        "noise": noise,
        "foreign_share": 0.0,
        "per_rank": {
            n: {
                "output_tok_s": r,
                "rounds": [r, r, r],
                "concurrency": 80,
                "found": "queue",
                "foreign_share": 0.0,
                "queued_share": 1.0,
            }
            for n, r in ranks.items()
        },
    }
    if verdict is not None:
        made["verdict"] = verdict
    return made


def passed(decided: str = "passed") -> guard.Outcome:
    return {"ok": True, "ratio": 1.0, "fell": [], "noise": 0.01, "decided": decided}


def failed() -> guard.Outcome:
    return {"ok": False, "ratio": 0.5, "fell": [], "noise": 0.01, "decided": "slower"}


# -- the guard ---------------------------------------------------------------------------


def test_a_first_run_has_nothing_to_compare_and_names_its_noise() -> None:
    verdict = guard.judge(record(1000, {"a": 500, "b": 500}, 0.02), [], 0.1, "fail")
    assert verdict.ok and verdict.previous is None and verdict.decided == "first"
    assert "noise 2.0%" in verdict.line and "nothing to compare" in verdict.line


def test_within_the_slowdown_passes_and_says_the_change_against_median_and_best() -> None:
    history = [record(1000, {"a": 500}), record(1040, {"a": 520}), record(980, {"a": 490})]
    verdict = guard.judge(record(950, {"a": 475}), history, 0.1, "fail")
    assert verdict.ok and verdict.ratio == pytest.approx(950 / 1000)
    assert "-5.0% against the median of the last 3 passed record(s) (1000.0)" in verdict.line
    assert "-8.7% against the best of the last 3 (1040.0)" in verdict.line


def test_slower_beyond_the_noise_fails_naming_the_noise_ranks_and_changed_arguments() -> None:
    last = record(1000, {"a": 500, "b": 500})
    now = record(800, {"a": 500, "b": 300})
    now["changed_args"] = ["+--cuda-graph-max-bs 8"]
    verdict = guard.judge(now, [last], 0.1, "fail")
    assert not verdict.ok and verdict.previous is last and verdict.fell == ["b"]
    assert verdict.decided == "slower" and "20.0% slower" in verdict.line
    assert "beyond the noise 1.0%" in verdict.line and "ranks that fell: b" in verdict.line
    assert "changed since the record before: +--cuda-graph-max-bs 8" in verdict.line


def test_slower_within_the_noise_is_undecided_then_passes_named_when_final() -> None:
    last = record(1000, {"a": 1000}, noise=0.01)
    now = record(880, {"a": 880}, noise=0.05)  # 12% slower: past 10%, within 5% of noise
    first = guard.judge(now, [last], 0.1, "fail", final=False)
    assert first.undecided and first.ok and "measuring more rounds" in first.line
    final = guard.judge(now, [last], 0.1, "fail", final=True)
    assert final.ok and not final.undecided and final.decided == "within noise"
    assert "within the noise 5.0%: not failed" in final.line
    # The same slowdown with a quiet host fails at once.
    assert not guard.judge(record(880, {"a": 880}, 0.01), [last], 0.1, "fail", False).ok


def test_a_chain_of_small_losses_is_caught_against_the_median_and_the_best() -> None:
    history: list[Record] = []
    oks: list[bool] = []
    rate = 1000.0
    for _ in range(6):  # 6% slower each time: each step alone is within 10%
        verdict = guard.judge(record(rate, {"a": rate}), history, 0.1, "fail")
        oks.append(verdict.ok)
        if not verdict.ok:
            break
        history.append(record(rate, {"a": rate}, verdict=verdict.outcome()))
        rate *= 0.94
    assert oks[:2] == [True, True] and oks[-1] is False


def test_drift_below_the_best_of_the_window_fails_as_drift() -> None:
    history = [record(r, {"a": r}) for r in (1000, 960, 925, 890)]
    verdict = guard.judge(record(870, {"a": 870}), history, 0.1, "fail")
    assert not verdict.ok and verdict.decided == "drift"
    assert "below the best recent record: a chain of smaller losses" in verdict.line


def test_warn_passes_a_slower_run_and_accepting_it_starts_a_new_baseline() -> None:
    old = [record(1000, {"a": 500}) for _ in range(3)]
    verdict = guard.judge(record(500, {"a": 250}), old, 0.1, "warn")
    assert verdict.ok and verdict.warning and verdict.line.startswith("WARNING throughput:")
    accepted = record(500, {"a": 250}, verdict=verdict.outcome())
    # The next run at the accepted rate passes: the records before the accepted one are gone.
    assert guard.judge(record(500, {"a": 250}), [*old, accepted], 0.1, "fail").ok


def test_only_the_same_workload_hardware_and_client_are_compared() -> None:
    now = record(1000, {"a": 500, "b": 500})
    other_shape = record(5000, {"a": 2500, "b": 2500}, output_len=128)
    other_card = record(5000, {"a": 2500, "b": 2500})
    other_card["gpu"] = "NVIDIA H200"
    other_ruler = record(5000, {"a": 2500, "b": 2500})
    other_ruler["client"] = "sglang.bench_serving 0.5.11"
    for other in (other_shape, other_card, other_ruler):
        verdict = guard.judge(now, [other], 0.1, "fail")
        assert verdict.ok and verdict.previous is None


def test_a_failed_or_inconclusive_record_is_never_a_baseline() -> None:
    good = record(1000, {"a": 500, "b": 500})
    bad = record(500, {"a": 250, "b": 250}, verdict=failed())
    busy = record(2000, {"a": 1000, "b": 1000}, verdict=passed("inconclusive"))
    errors = record(1, {"a": 1, "b": 0})
    errors["errors"] = 3
    verdict = guard.judge(record(500, {"a": 250, "b": 250}), [good, bad, busy, errors], 0.1, "fail")
    assert not verdict.ok and verdict.previous is good


def test_failed_requests_fail_the_check() -> None:
    now = record(1000, {"a": 500, "b": 500})
    now["errors"], now["first_error"] = 2, "OSError: HTTP 503"
    verdict = guard.judge(now, [], 0.1, "warn")
    assert not verdict.ok and verdict.line == "throughput: 2 requests failed (OSError: HTTP 503)"


def test_clients_traffic_past_half_is_said_and_neither_passes_nor_fails_the_host() -> None:
    last = record(1000, {"a": 1000})
    now = record(300, {"a": 300})
    now["foreign_share"] = 0.7
    verdict = guard.judge(now, [last], 0.1, "fail")
    assert verdict.ok and verdict.decided == "inconclusive"
    assert "70% of the tokens the ranks generated while measured were not the check's" in (
        verdict.line
    )


def test_the_record_of_a_result_takes_medians_noise_and_foreign_share() -> None:
    meta: guard.Meta = {
        "release": "0.5.11",
        "engine": "e",
        "model_digest": "d",
        "flags_digest": "f",
        "workload": {
            "input_len": 8,
            "output_len": 24,
            "model": "m",
            "model_digest": "d",
            "ranks": 2,
        },
        "gpu": "g",
        "driver": "570",
        "router": None,
        "server_args": [],
    }

    def rank(rates: list[float], own: int) -> dict[str, object]:
        windows = [
            {"output_tok_s": r, "generated": 10, "own_generated": own, "queued_share": 1.0}
            for r in rates
        ]
        return {"concurrency": 96, "found": "queue", "windows": windows, "completed": 30}

    result = {
        "client": CLIENT,
        "seed": 5,
        "ranks": {"a": rank([90, 100, 110], 10), "b": rank([100, 100, 100], 5)},
    }
    made = guard.measured(meta, result, ["a", "b"], "now")
    assert made["rounds"] == [190, 200, 210] and made["output_tok_s"] == 200
    assert made["noise"] == pytest.approx(0.05) and made["total_tok_s"] == pytest.approx(
        200 * 32 / 24, abs=0.01
    )
    assert made["per_rank"]["b"]["foreign_share"] == 0.5 and made["foreign_share"] == 0.25
    assert made["per_rank"]["a"]["concurrency"] == 96 and made["client"] == CLIENT


def test_the_search_starts_at_half_what_the_last_record_of_the_release_found() -> None:
    last = record(1000, {"a": 500, "b": 500})
    meta = {**last, "workload": last["workload"]}
    assert guard.start_concurrency([last], meta, 8) == 40  # type: ignore[arg-type]
    other = {**meta, "flags_digest": "another"}
    assert guard.start_concurrency([last], other, 8) == 8  # type: ignore[arg-type]


def test_the_load_client_is_pinned_by_its_name() -> None:
    """The ruler's name must change with the file: a change that keeps CLIENT would compare
    records measured by two rulers. Bump CLIENT and this digest together."""
    text = (ROOT / "operations" / "programs" / "load_client.py").read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    assert (CLIENT, digest) == (CLIENT, PINNED_DIGEST), f"bump CLIENT and PINNED_DIGEST: {digest}"


PINNED_DIGEST = "890b77b774b8eca5ca039386bbd3e05fb96b2621f6c857fbcd6601524d9b2daa"


# -- the plan ---------------------------------------------------------------------------------


def ranks(n: int = 2) -> list[Rank]:
    return [
        Rank(
            rank=r,
            gpu=r,
            port=30000 + r,
            argv=["python", "-m", "sglang.launch_server", "--port", str(30000 + r), "--tp", "1"],
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


def _arg(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_off_runs_nothing_and_ships_nothing() -> None:
    decided = plan(throughput_check="off")
    assert decided.run is None and decided.files == [] and decided.skip == "throughput_check: off"


def test_after_change_without_a_change_ships_the_script_and_runs_nothing() -> None:
    decided = plan(changed=False)
    assert decided.run is None and [f.path for f in decided.files] == [layout.THROUGHPUT_SCRIPT]
    assert "no rank or router (re)started" in decided.skip
    assert plan(changed=False, throughput_check="always").run is not None


def test_every_rank_at_once_with_the_load_client_and_no_key_on_the_command_line() -> None:
    run = plan(sglang_version="0.5.23").run
    assert run is not None and run.argv[:2] == ["python3", layout.THROUGHPUT_SCRIPT]
    assert _arg(run.argv, "--rank") == [
        "sglang@0.service=http://127.0.0.1:30000",
        "sglang@1.service=http://127.0.0.1:30001",
    ]
    meta = json.loads(_arg(run.argv, "--meta")[0])
    assert meta["workload"] == {
        "input_len": 1024,
        "output_len": 512,
        "model": meta["workload"]["model"],
        "model_digest": "digest1",
        "ranks": 2,
    }
    assert meta["server_args"] == ["--tp 1"]  # the port left out: it differs between ranks
    assert _arg(run.argv, "--guard") == ["fail"] and _arg(run.argv, "--max-slowdown") == ["0.1"]
    assert _arg(run.argv, "--key-file") == [layout.SECRETS_FILE]


def test_the_hardware_and_router_are_named_in_the_meta() -> None:
    s = make_settings(router={"host": "@local", "port": 8000})
    decided = tp.throughput_plan(s, ranks(), True, True, "d", {}, hardware=("RTX", "570.1"))
    assert decided.run is not None
    meta = json.loads(_arg(decided.run.argv, "--meta")[0])
    assert (meta["gpu"], meta["driver"]) == ("RTX", "570.1")
    assert meta["router"] == "1.13.0 on @local"


def test_the_load_shape_is_searched_by_default_and_fixed_when_set() -> None:
    searched = plan().run
    assert searched is not None and "--fixed" not in searched.argv
    assert (_arg(searched.argv, "--start"), _arg(searched.argv, "--most")) == (["8"], ["1024"])
    assert _arg(searched.argv, "--rounds") == ["3"] and _arg(searched.argv, "--window") == ["20.0"]
    fixed = plan(throughput_concurrency_per_rank=32).run
    assert fixed is not None and "--fixed" in fixed.argv
    assert (_arg(fixed.argv, "--start"), _arg(fixed.argv, "--most")) == (["32"], ["32"])
    # The flags the plan writes are the ones the programs read.
    parser = argparse.ArgumentParser()
    load_runner.add_load_flags(parser)
    read = parser.parse_args(tp.load_flags(make_settings()))
    assert (read.most, read.rounds, read.window, read.fixed) == (1024, 3, 20.0, False)


def test_metrics_off_is_refused_before_any_change() -> None:
    decided = plan(enable_metrics=False)
    assert decided.run is None and len(decided.errors) == 1
    assert "enable_metrics is false" in decided.errors[0]


def test_a_removed_setting_says_what_instead() -> None:
    with pytest.raises(SettingsError) as caught:
        make_settings(throughput_prompts_per_rank=64)
    (line,) = caught.value.problems
    assert "removed in 0.14.0" in line and "throughput_window_s" in line


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("throughput_check", "sometimes"),
        ("throughput_guard", "ignore"),
        ("throughput_max_slowdown", 0),
        ("throughput_max_slowdown", 1.5),
        ("throughput_input_len", 0),
        ("throughput_concurrency_per_rank", 5000),
        ("throughput_rounds", 1),
        ("throughput_window_s", 0),
        ("throughput_timeout_s", 5),
    ],
)
def test_out_of_range_settings_are_refused_with_one_line(key: str, value: object) -> None:
    with pytest.raises(SettingsError) as caught:
        make_settings(**{key: value})
    (line,) = caught.value.problems
    assert key in line and "accepted:" in line


def test_the_plan_passes_the_cards_ceilings_from_the_knowledge_base() -> None:
    card = tp.card_ceilings("NVIDIA RTX PRO 6000 Blackwell Server Edition", 54 * 10**9, None)
    assert card is not None
    # 1,792 GB/s over 54 GB of bf16 weights; ~504 dense TFLOPS over 2 x 27e9 FLOP a token.
    assert card["one_stream_tok_s"] == pytest.approx(33.2, abs=0.1)
    assert 9000 < card["full_batch_tok_s"] < 9600
    assert tp.card_ceilings("a card nobody listed", 54 * 10**9, None) is None
    assert tp.card_ceilings(None, 54 * 10**9, None) is None
    decided = tp.throughput_plan(make_settings(), ranks(), True, False, "d", {}, card)
    assert decided.run is not None
    assert json.loads(_arg(decided.run.argv, "--ceilings")[0]) == card


def test_the_ceilings_hook_says_nothing_without_ceilings_and_the_share_with_them() -> None:
    now = record(1000, {"a": 500, "b": 500})
    now["total_tok_s"], now["ranks"] = 3000.0, 2
    assert guard.beside_ceilings(now, None) is None
    ceilings: guard.Ceilings = {
        "one_stream_tok_s": 33.0,
        "full_batch_tok_s": 9300.0,
        "source": "knowledge",
    }
    said = guard.beside_ceilings(now, ceilings)
    assert said is not None and said.startswith("per GPU 1500 tokens/s (input and output), 16%")


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
    assert "900.0 output tok/s (median of 3, noise 1.0%)" in shown[0]
    assert "per rank (output tok/s): sglang@0.service 450, sglang@1.service 450" in shown[0]
    assert shown[1].endswith("(-10.0% now)")
    assert view.to_json()["ratio"] == pytest.approx(0.9)
    assert ThroughputView.of([]).lines() == [
        "  throughput: no record on this host (the deploy's check has not run)"
    ]


# -- the host program against server doubles (integration) -----------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the sglang double of 0.5.11 (its server)."""
    out = tmp_path_factory.mktemp("engine")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(out / "env")], check=True)
    (site,) = (out / "env" / "lib").glob("python3*/site-packages")
    with zipfile.ZipFile(wheels.sglang_wheel(out / "wheels", "0.5.11")) as zf:
        zf.extractall(site)
    return out / "env"


# Each rank double: one request decodes 20 tok/s alone, each more in its batch costs 2% of a
# step, at most MAX_RUNNING at once (tests/doubles/packages/sglang/_generate_double.py).
RATE, COST, MAX_RUNNING = 20.0, 0.02, 96


def capacity(rate: float = RATE, running: int = MAX_RUNNING) -> float:
    """What the double generates at its running cap, tokens/s."""
    return running * rate / (1 + COST * (running - 1))


@pytest.fixture
def servers(engine: Path, tmp_path: Path) -> Iterator[list[str]]:
    """Two server doubles whose running cap (96) is past 32."""
    model = tmp_path / "model"
    model.mkdir()
    procs, urls = [], []
    for rank in range(2):
        port = _free_port()
        env = {
            "PATH": os.environ["PATH"],
            "CUDA_VISIBLE_DEVICES": str(rank),
            "SGLANG_DOUBLE_LOAD_SECONDS": "0",
            "SGLANG_DOUBLE_TOKENS_PER_S": str(RATE),
            "SGLANG_DOUBLE_BATCH_COST": str(COST),
            "SGLANG_DOUBLE_MAX_RUNNING": str(MAX_RUNNING),
        }
        words = [str(engine / "bin" / "python"), "-m", "sglang.launch_server"]
        words += ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port)]
        words += ["--enable-metrics", "--api-key", "k3y"]
        procs.append(
            subprocess.Popen(
                words, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for proc in procs:  # the double prints this line once it is ready
            assert proc.stdout is not None
            for line in proc.stdout:
                if "ready: serving" in line:
                    break
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def run_program(tmp: Path, urls: list[str], *flags: str) -> tuple[int, list[str]]:
    program_file = tmp / "throughput.py"
    program_file.write_text(script_text("throughput.py"))
    secrets = tmp / "secrets.yaml"
    secrets.write_text('api-key: "k3y"\n')
    meta = {
        "release": "0.5.11",
        "engine": "e",
        "model_digest": "d",
        "flags_digest": "f",
        "server_args": ["--tp 1"],
        "workload": {
            "input_len": 8,
            "output_len": 24,
            "model": "m",
            "model_digest": "d",
            "ranks": 2,
        },
    }
    words = [sys.executable, str(program_file)]
    words += ["--rank", f"r0={urls[0]}", "--rank", f"r1={urls[1]}"]
    words += ["--input-len", "8", "--output-len", "24", "--start", "8", "--most", "512"]
    words += ["--ramp-timeout", "60", "--rounds", "3", "--window", "2", "--timeout", "150"]
    words += ["--model", "m", "--key-file", str(secrets)]
    words += ["--service-user", pwd.getpwuid(os.getuid()).pw_name]
    words += ["--records", str(tmp / "records" / "t.jsonl"), "--meta", json.dumps(meta)]
    words += ["--max-slowdown", "0.1", "--guard", "fail", *flags]
    proc = subprocess.run(words, capture_output=True, text=True, timeout=300)
    assert proc.stderr == ""
    return proc.returncode, proc.stdout.splitlines()


@pytest.mark.integration
def test_the_check_finds_each_ranks_capacity_past_32_and_keeps_a_record(
    servers: list[str], tmp_path: Path
) -> None:
    code, out = run_program(tmp_path, servers)
    assert code == 0, out
    assert out[-1].startswith("throughput: ") and "nothing to compare" in out[-1]
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["client"] == CLIENT and rec["errors"] == 0 and len(rec["rounds"]) == 3
    for name, rank in rec["per_rank"].items():
        # Searched past 32 until the rank queued work, and measured at its capacity (+-20%).
        assert rank["found"] == "queue" and rank["concurrency"] > MAX_RUNNING, (name, rank)
        assert rank["output_tok_s"] == pytest.approx(capacity(), rel=0.2), (name, rank)
        assert rank["foreign_share"] < 0.2 and rank["queued_share"] > 0.5
    # At 32 in flight the same double makes only ~60% of that: the old fixed 32 was no capacity.
    assert capacity(running=32) < 0.7 * capacity()
    kept = (tmp_path / "records" / "t.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in kept] == [rec["seed"]]
    # A second check compares with the first, and draws new prompts (a new seed).
    code, out = run_program(tmp_path, servers)
    assert code == 0 and "against the median of the last 1 passed record(s)" in out[-1], out
    seeds = [json.loads(line)["seed"] for line in (tmp_path / "records" / "t.jsonl").open()]
    assert len(seeds) == 2 and seeds[0] != seeds[1]


@pytest.mark.integration
def test_a_fixed_concurrency_measures_there_and_says_so(servers: list[str], tmp_path: Path) -> None:
    code, out = run_program(tmp_path, servers, "--fixed")
    assert code == 0, out
    rec = json.loads(out[0].removeprefix("throughput "))
    for rank in rec["per_rank"].values():
        assert (rank["found"], rank["concurrency"]) == ("fixed", 8)
        assert rank["output_tok_s"] == pytest.approx(capacity(running=8), rel=0.2)


# -- the host program's own guards, in this process -------------------------------------------
# The program's parts on this machine: the load client replaced by a stand-in (`run_load`), two
# ranks' /metrics pages served here, and the listeners the program reads given by the test.

KEY = "sk-throughput-key-4c1d9e"
ME = pwd.getpwuid(os.getuid()).pw_name
OTHER = 65534 if os.getuid() != 65534 else 65533
TIME = "2026-12-06T10:00:00Z"
WHO = (
    "(the key is sent only to the service user's listeners; docs/reference/troubleshooting.md "
    '"Who is sent the API key")'
)


def result(*rates: float) -> dict[str, Any]:
    """A load client's result: each rank three windows at its rate."""
    rates = rates or (500.0, 500.0)
    return {
        "client": CLIENT,
        "seed": 7,
        "ranks": {
            f"r{i}": {
                "concurrency": 64,
                "found": "queue",
                "windows": [
                    {"output_tok_s": r, "generated": 10, "own_generated": 10, "queued_share": 1.0}
                ]
                * 3,
                "completed": 30,
                "errors": 0,
                "first_error": None,
                "ttft_ms": 10.0,
                "itl_ms": 2.0,
            }
            for i, r in enumerate(rates)
        },
    }


class MetricsPage:
    """A rank's /metrics, served here; past `good_reads` reads, HTTP 500. Stopped by the
    fixture."""

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
                body = f'sglang:generation_tokens_total{{model_name="m"}} {page.reads}\n'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        serve = functools.partial(self.server.serve_forever, poll_interval=0.05)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()


Load = Callable[["Bench", dict[str, Any]], tuple[dict[str, Any] | None, str]]


@dataclass
class Bench:
    """One host for the program: its files, its two ranks' pages, the loads it started."""

    tmp: Path
    pages: list[MetricsPage]
    loads: list[dict[str, Any]] = field(default_factory=list)
    load: Load = lambda bench, seen: (result(), "")

    @property
    def records(self) -> Path:
        return self.tmp / "state" / "throughput.jsonl"

    @property
    def pending(self) -> Path:
        return self.tmp / "state" / "throughput.pending"

    def argv(self, *extra: str, **flags: str) -> list[str]:
        meta = {
            "release": "0.5.11",
            "engine": "e",
            "model_digest": "d",
            "flags_digest": "f",
            "server_args": [],
            "workload": {
                "input_len": 8,
                "output_len": 16,
                "model": "m",
                "model_digest": "d",
                "ranks": 2,
            },
        }
        given = {
            "--input-len": "8",
            "--output-len": "16",
            "--start": "8",
            "--most": "64",
            "--ramp-timeout": "10",
            "--rounds": "3",
            "--window": "1",
            "--timeout": "60",
            "--model": "m",
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
        words += [w for i, p in enumerate(self.pages) for w in ("--rank", f"r{i}={p.url}")]
        return [*words, *extra]

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
        code = program.main(argv, lambda: found, script=str(self.tmp / "throughput.py"))
        out, err = capsys.readouterr()
        assert err == ""
        return code, out.splitlines()


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bench]:
    (tmp_path / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    pages = [MetricsPage(), MetricsPage()]
    made = Bench(tmp_path, pages)

    def load(
        script: str,
        ranks: dict[str, str],
        args: Any,
        key: str | None,
        user: str,
        start: int,
        rounds: int,
        deadline: float,
    ) -> tuple[dict[str, Any] | None, str]:
        seen = {"script": script, "ranks": ranks, "key": key, "user": user, "start": start}
        made.loads.append(seen)
        return made.load(made, seen)

    monkeypatch.setattr(program, "run_load", load)
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
    assert [c["key"] for c in bench.loads] == [KEY]
    assert bench.loads[0]["script"] == str(bench.tmp / "throughput.py")
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["per_rank"]["r0"]["output_tok_s"] == 500.0 and rec["output_tok_s"] == 1000.0
    assert rec["verdict"]["ok"] and len(bench.records.read_text().splitlines()) == 1
    # The next check starts its search at half what this one found.
    bench.run(bench.argv(), capsys, None)
    assert bench.loads[1]["start"] == 32


@pytest.mark.parametrize(
    ("owners", "why"),
    [
        # A rank's port is another user's (a squatter, while it restarted).
        ({0: OTHER, 1: -1}, "r0: {at0} is held by uid {other} ({who}), not by {me}"),
        ({0: -1}, "r1: nothing listens on {at1}"),
    ],
)
def test_the_key_goes_to_no_listener_but_the_service_users(
    bench: Bench, capsys: pytest.CaptureFixture[str], owners: dict[int, int], why: str
) -> None:
    ports = [page.port for page in bench.pages]
    uids = {ports[i]: (os.getuid() if uid == -1 else uid) for i, uid in owners.items()}
    code, out = bench.run(bench.argv(), capsys, uids)
    expected = why.format(
        at0=f"127.0.0.1:{ports[0]}",
        at1=f"127.0.0.1:{ports[1]}",
        other=OTHER,
        who=hostsafe.user_name(OTHER),
        me=f"the service user {ME} (uid {os.getuid()})",
    )
    assert (code, out) == (2, [f"throughput: refused: {expected} {WHO}"])
    # Nothing ran, nothing was asked (not even /metrics), no record; the check is still due.
    assert bench.loads == [] and [p.reads for p in bench.pages] == [0, 0]
    assert not bench.records.exists()
    assert json.loads(bench.pending.read_text()) == {"started": TIME}


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
    assert bench.loads == [] and not bench.records.exists()


@pytest.mark.parametrize(
    ("flags", "extra", "said"),
    [
        ({"meta": "{not json"}, [], "--meta is not JSON (Expecting property name"),
        ({"meta": "[]"}, [], "--meta is not a JSON object with release, engine, model_digest"),
        ({"ceilings": '{"source": 1}'}, [], "--ceilings is not a JSON object with numbers"),
        ({}, ["--rank", "r0"], "--rank 'r0' is not UNIT=URL"),
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
    code, out = bench.run(bench.argv(*extra, **flags), capsys, None)
    assert code == 2 and len(out) == 1 and out[0].startswith("throughput: refused: "), out
    assert said in out[0] and "operations/plan/throughput_plan.py" in out[0]
    assert bench.loads == [] and not bench.records.exists() and not bench.pending.exists()


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
    assert bench.loads == []


def test_a_record_that_cannot_be_kept_fails_the_check_in_one_line(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(bench: Bench, seen: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        bench.records.mkdir(parents=True, exist_ok=True)  # the records' place taken meanwhile
        return result(), ""

    bench.load = load
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 1 and out[-1] == (
        f"throughput: failed: the record was not kept in {bench.records} (IsADirectoryError: "
        "Is a directory): make that a file root may append to, and deploy again"
    )
    assert out[0].startswith("throughput {") and bench.pending.exists()


def test_what_nothing_names_is_one_masked_line(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(bench: Bench, seen: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        raise RuntimeError(f"the client broke with {seen['key']} in hand")

    bench.load = load
    code, out = bench.run(bench.argv(), capsys, None)
    assert (code, out) == (
        1,
        ["throughput: failed: RuntimeError: the client broke with *** in hand"],
    )


def test_a_load_that_failed_fails_the_check_masked_and_is_no_baseline(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(bench: Bench, seen: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        return None, f"the load client exited 1 (Authorization: Bearer {seen['key']})"

    bench.load = load
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 1 and KEY not in "\n".join(out) + bench.records.read_text()
    rec = json.loads(out[0].removeprefix("throughput "))
    assert rec["first_error"] == "the load client exited 1 (Authorization: Bearer ***)"
    assert not rec["verdict"]["ok"] and bench.pending.exists()


def test_an_undecided_verdict_measures_more_rounds_then_decides(
    bench: Bench, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.records.parent.mkdir()
    last = record(1000, {"r0": 500, "r1": 500}, 0.01)
    last["workload"] = {
        "input_len": 8,
        "output_len": 16,
        "model": "m",
        "model_digest": "d",
        "ranks": 2,
    }
    last["client"], last["gpu"], last["driver"] = CLIENT, None, None
    bench.records.write_text(json.dumps(last) + "\n")
    noisy = result(440.0, 440.0)
    for rank in noisy["ranks"].values():  # 12% slower, 6% of noise: undecided at 10%
        rank["windows"] = [{**rank["windows"][0], "output_tok_s": r} for r in (410, 440, 465)]
    bench.load = lambda bench, seen: (noisy, "")
    code, out = bench.run(bench.argv(), capsys, None)
    assert len(bench.loads) >= 2, out  # more rounds were measured
    rec = json.loads(out[0].removeprefix("throughput "))
    assert len(rec["rounds"]) == 3 * len(bench.loads)
    assert code == 0 and rec["verdict"]["decided"] == "within noise" and "noise" in out[-1]


# -- the pending marker ------------------------------------------------------------------------


def _marker_at_start(bench: Bench, seen: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    mode = os.lstat(bench.pending).st_mode
    seen["pending"] = (stat.S_ISREG(mode), stat.S_IMODE(mode), bench.pending.read_text())
    return result(), ""


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
    bench.load = _marker_at_start
    code, out = bench.run(bench.argv(), capsys, None)
    assert code == 0, out
    (seen,) = bench.loads
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
    bench.load = _marker_at_start
    assert bench.run(bench.argv(), capsys, None)[0] == 0
    bench.load = lambda bench, seen: (result(250.0, 250.0), "")
    got, out = bench.run(bench.argv(guard=guard_flag), capsys, None)
    assert got == code and "50.0% slower" in out[-1], out
    assert bench.pending.exists() == left


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="starts the client as a user: needs root")
def test_the_real_load_start_hands_the_key_in_its_environment_only(tmp_path: Path) -> None:
    """run_load starts the script with `load` as the user, the key in its environment only."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'failed': 'key ' + os.environ.get('OPENAI_API_KEY', '') + ' cwd ' + "
        "os.getcwd() + ' argv ' + sys.argv[1]}, open(out, 'w'))\n"
    )
    parser = argparse.ArgumentParser()
    load_runner.add_load_flags(parser)
    args = parser.parse_args(tp.load_flags(make_settings()))
    got, why = load_runner.run_load(
        str(script), {"r0": "http://127.0.0.1:1"}, args, KEY, ME, 8, 3, time.monotonic() + 30
    )
    assert got is None and why.startswith("the load client exited 0 (key *** cwd ")
    assert why.endswith(" argv load)") and KEY not in why
    work = why.split(" cwd ", 1)[1].split(" argv ", 1)[0]
    assert os.path.basename(work).startswith("load-") and not os.path.exists(work)


def test_the_search_stays_within_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """One connection a request in flight: 8 ranks at 1,024 need 8,192 descriptors, past the
    common soft limit of 1,024; the soft limit is raised to the hard one, and what is left
    caps the search (said as found: most)."""
    import resource

    limits = {"now": (1024, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])

    def setrlimit(which: int, value: tuple[int, int]) -> None:
        limits["now"] = value

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert load_client.room_for(8, 1024) == (4096 - load_client.SPARE_FDS) // 8
    assert limits["now"] == (4096, 4096)
    limits["now"] = (1024, 1024)  # no room to raise it
    assert load_client.room_for(8, 1024) == (1024 - load_client.SPARE_FDS) // 8
    assert load_client.room_for(1, 64) == 64
