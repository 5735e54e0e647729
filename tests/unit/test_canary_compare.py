"""The canary comparison (operations/programs/canary_compare.py, bundled as the host runs it):
its rows' rules (programs/canary_rows.py) pure, its refusals in-process, and, marked
integration, the program against a canary and a baseline server double with the benchmark
client double (the 0.5.11 wheel double: tests/doubles/rank_doubles.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operations.programs import canary_rows as rows
from operations.programs import hostsafe
from operations.render.host_scripts import load, script_text
from tests.doubles.rank_doubles import RankDoubles, RouterPage, engine_env, free_port, page

ME = pwd.getpwuid(os.getuid()).pw_name
OTHER = 65534 if os.getuid() != 65534 else 65533
KEY = "sk-canary-key-77e1a2"
program = load("canary_compare.py", "canary_compare_script")


# -- the rows' rules ---------------------------------------------------------------------------


def answer(text: str, tops: list[list[str]] | None = None) -> rows.Answer:
    tokens = text.split()
    return {"text": text, "tokens": tokens, "tops": tops}


def test_identical_answers_pass_and_a_late_divergence_is_batching_noise() -> None:
    same = " ".join(f"w{i}" for i in range(30))
    assert rows.compare(answer(same), answer(same)) == (True, "identical")
    late = " ".join(f"w{i}" for i in range(rows.AGREE_TOKENS)) + " x y"
    base = " ".join(f"w{i}" for i in range(rows.AGREE_TOKENS)) + " a b"
    ok, how = rows.compare(answer(base), answer(late))
    assert ok and how == f"diverges at word {rows.AGREE_TOKENS} (>= {rows.AGREE_TOKENS})"


def test_an_early_divergence_fails_unless_each_token_is_in_the_others_top_k() -> None:
    ok, how = rows.compare(answer("Paris is big"), answer("Lyon is big"))
    assert not ok and how == "diverges at word 0: 'Paris' vs 'Lyon'"
    tops_b = [["Paris", "Lyon"], ["is"], ["big"]]
    tops_c = [["Lyon", "Paris"], ["is"], ["big"]]
    ok, how = rows.compare(answer("Paris is big", tops_b), answer("Lyon is big", tops_c))
    assert ok and how == f"diverges at token 0 within each other's top-{rows.TOP_K}"
    # Only one side's top-k has the other's token: not a near-tie.
    ok, _ = rows.compare(answer("Paris is", tops_b), answer("Lyon is", [["Lyon"], ["is"]]))
    assert not ok
    # A shorter answer (stopped early) diverges where it ends.
    ok, how = rows.compare(answer("a b c"), answer("a b"))
    assert not ok and how == "diverges at word 2: 'c' vs '<end>'"


def test_an_answer_is_read_with_its_logprobs_tokens_or_its_words() -> None:
    entries = [
        {"token": "Par", "logprob": -0.1, "top_logprobs": [{"token": "Par"}, {"token": "Ly"}]},
        {"token": "is", "logprob": -0.2, "top_logprobs": [{"token": "is"}]},
    ]
    with_logprobs = {
        "choices": [{"message": {"content": "Paris"}, "logprobs": {"content": entries}}]
    }
    assert rows.answer_of(with_logprobs) == {
        "text": "Paris",
        "tokens": ["Par", "is"],
        "tops": [["Par", "Ly"], ["is"]],
    }
    plain = {"choices": [{"message": {"content": "Hello there, you"}, "logprobs": None}]}
    assert rows.answer_of(plain) == {
        "text": "Hello there, you",
        "tokens": ["Hello", " there,", " you"],
        "tops": None,
    }
    assert rows.answer_of({"choices": []}) is None


def speed(tok_s: float, rounds: list[float] | None = None, errors: int = 0) -> rows.RankSpeed:
    return {"tok_s": tok_s, "rounds": rounds or [tok_s] * 3, "errors": errors, "why": None}


def test_speed_passes_within_the_slowdown_and_fails_past_it_beyond_the_noise() -> None:
    bases = {"b1": speed(100), "b2": speed(100)}
    row, undecided = rows.speed_row(bases, {"c": speed(91)}, 0.1)
    assert row["pass"] and not undecided
    slow, _ = rows.speed_row(bases, {"c": speed(89)}, 0.1)
    assert not slow["pass"] and slow["canary"] == "c: 89.0 tok/s, x0.89"
    assert slow["threshold"] == ">= 0.90 x baseline beyond noise 0.0%"
    assert slow["baseline"] == "median of b1, b2: 100.0 tok/s"
    lost, _ = rows.speed_row(bases, {"c": speed(120, errors=2)}, 0.1)
    assert not lost["pass"] and lost["canary"] == "c: 2 requests failed"


def test_baselines_apart_are_the_noise_and_a_canary_within_it_is_undecided_then_passes() -> None:
    """Two identical baselines 10% apart (an A/A measure of this host): a canary 12% below
    their median is within that noise, so more rounds are asked, and a last verdict passes
    naming the noise; a canary 30% below fails at once."""
    bases = {"b1": speed(95), "b2": speed(105)}
    row, undecided = rows.speed_row(bases, {"c": speed(88)}, 0.1, final=False)
    assert undecided and row["threshold"] == ">= 0.90 x baseline beyond noise 5.0%"
    row, undecided = rows.speed_row(bases, {"c": speed(88)}, 0.1, final=True)
    assert row["pass"] and not undecided
    row, undecided = rows.speed_row(bases, {"c": speed(70)}, 0.1, final=False)
    assert not row["pass"] and not undecided


def test_the_fixture_names_the_outcomes_family_and_its_labels() -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "smg" / "metrics-1.13.0.json"
    families = json.loads(fixture.read_text())["families"]
    assert families[rows.OUTCOMES]["labels"] == ["outcome", "worker"]


@pytest.mark.parametrize(
    ("base", "canary", "passed"),
    [
        ((0, 100), (0, 100), True),
        ((0, 100), (3, 97), False),  # 3% against 0%: past the margin
        ((0, 1000), (3, 997), True),  # 0.3%, and no more than FAILS_ALONE
        ((0, 1000), (4, 996), False),  # the baseline has none: at most FAILS_ALONE
        ((20, 980), (25, 975), True),  # 2.5% against 2% + 1 point
        ((20, 980), (40, 960), False),
        ((0, 0), (0, 0), True),  # nothing served in the soak: nothing to judge
    ],
)
def test_errors_compare_the_canarys_failure_ratio_with_the_baselines(
    base: tuple[int, int], canary: tuple[int, int], passed: bool
) -> None:
    before = rows.outcomes(page({"http://b:1": (5, 5), "http://c:2": (0, 0)}))
    after = rows.outcomes(
        page(
            {
                "http://b:1": (5 + base[0], 5 + base[1] - base[0]),
                "http://c:2": (canary[0], canary[1] - canary[0]),
            }
        )
    )
    made = rows.errors_row(before, after, ("b", "http://b:1"), {"c": "http://c:2/"}, 5)
    assert made["pass"] is passed, made


def test_a_canary_with_no_series_yet_counts_none_and_no_router_is_skipped_and_said() -> None:
    # Seen on the testbed's smg 1.13.0: the canary, drained and re-added by its roll, has no
    # per-worker series until its first request through the router (tests/e2e/test_canary.py).
    made = rows.errors_row(
        {}, rows.outcomes(page({"http://b:1": (0, 1)})), ("b", "http://b:1"), {"c": "http://c:2"}, 5
    )
    assert made["pass"] and made["canary"] == "c: 0 failed of 0: nothing to judge"
    assert rows.no_router_row() == {
        "check": "errors",
        "baseline": "-",
        "canary": "skipped: no router",
        "threshold": "-",
        "pass": True,
    }


def test_the_table_aligns_its_columns_and_wraps_long_cells() -> None:
    made = [
        rows.row("speed", "1.0 tok/s", "x " * 40, "t", False),
        rows.row("a", "b", "c", "d", True),
    ]
    lines = rows.table(made)
    assert lines[0].split() == ["check", "baseline", "canary", "threshold", "pass"]
    starts = [lines[0].index(w) for w in ("baseline", "canary", "threshold", "pass")]
    assert lines[1][starts[0] :].startswith("1.0 tok/s") and lines[1][starts[3] :] == "NO"
    assert lines[2][: starts[1]].strip() == "" and lines[2][starts[1] :].startswith("x x")
    assert lines[-1].split() == ["a", "b", "c", "d", "yes"]
    assert rows.last_line(made) == "canary: FAILED (speed)"
    assert rows.last_line(made[1:]) == "canary: passed"


def _real_rows() -> list[dict[str, object]]:
    """Rows as the program writes them: a record it kept (tests/facts/canary.CanaryState/
    failed.json, made by scripts/capture_canary_records.py) and the longest cells the row
    builders make: two canaries, one whose client timed out, errors past the margin."""
    fixture = Path(__file__).parents[1] / "facts" / "canary.CanaryState" / "failed.json"
    (text,) = [line for line in json.loads(fixture.read_text())["output"] if line[:5] == "text "]
    kept: list[dict[str, object]] = json.loads(text[5:])["rows"]
    timed_out: rows.RankSpeed = {
        "tok_s": 0.0,
        "rounds": [],
        "errors": 0,
        "why": "the load client ran past the check's time budget (timed out)",
    }
    slow, _ = rows.speed_row(
        {"sglang@1.service": speed(15204.37), "sglang@2.service": speed(14890.12)},
        {"sglang@6.service": speed(11027.5), "sglang@7.service": timed_out},
        0.1,
    )
    before = rows.outcomes(page({"http://127.0.0.1:30001": (0, 0)}))
    after = rows.outcomes(page({"http://127.0.0.1:30001": (9, 123456)}))
    workers = {
        "sglang@6.service": "http://127.0.0.1:30006",
        "sglang@7.service": "http://127.0.0.1:30001",
    }
    failing = rows.errors_row(
        before, after, ("sglang@1.service", "http://127.0.0.1:30001"), workers, 60
    )
    return [*kept, slow, failing, rows.no_router_row()]


def test_the_table_keeps_real_rows_within_its_width_and_each_cell_in_its_column() -> None:
    made = _real_rows()
    # The checks the program writes, in its order (canary_compare.compare_ranks).
    assert [r["check"] for r in made[:4]] == [
        "answers: known sum",
        "answers: open prompts",
        "speed",
        "errors",
    ]
    for item in made:
        header, *lines = rows.table([item])
        names = header.split()
        assert names == ["check", "baseline", "canary", "threshold", "pass"]
        starts = [header.index(name) for name in names]
        assert all(len(line) <= rows.TABLE_WIDTH for line in [header, *lines]), lines
        for line in lines:
            # Nothing runs into the two blanks before a column.
            assert all(line[s - 2 : s].strip() == "" for s in starts[1:]), line
        for name, start, end in zip(names, starts, [*starts[1:], None], strict=True):
            shown = "".join(line[start:end] for line in lines)
            value = ("yes" if item[name] else "NO") if name == "pass" else str(item[name])
            # Every character of the cell, in order, in its own column (wrapped at blanks).
            assert "".join(shown.split()) == "".join(value.split()), (name, lines)


# -- refused before anything is sent -----------------------------------------------------------


def host(tmp: Path) -> dict[str, str]:
    """The files a host has for the program: the key, the record's directory (root's on the
    host: this user's here)."""
    (tmp / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    (tmp / "state").mkdir(mode=0o755, exist_ok=True)
    os.chmod(tmp / "state", 0o755)
    return {
        "--key-file": str(tmp / "secrets.yaml"),
        "--record": str(tmp / "state" / "canary.json"),
    }


def argv(tmp: Path, canary: str, baseline: str, /, *extra: str, **flags: str) -> list[str]:
    given = {
        **host(tmp),
        "--canary": f"sglang@1.service={canary}/v1",
        "--baseline": f"sglang@0.service={baseline}/v1",
        "--model": "m",
        "--service-user": ME,
        "--max-slowdown": "0.5",
        "--soak": "0",
        "--target": "ab12" * 16,
        "--meta": json.dumps(
            {
                "release": "0.5.11",
                "engine": "/opt/sglang/envs/e2",
                "canary_ranks": [1],
                "baseline_rank": 0,
                "other": "left out",
            }
        ),
        "--input-len": "8",
        "--output-len": "16",
        "--start": "8",
        "--most": "128",
        "--ramp-timeout": "30",
        "--rounds": "2",
        "--window": "1",
        "--timeout": "90",
    }
    given.update({"--" + k.replace("_", "-"): v for k, v in flags.items()})
    return [*(w for k, v in given.items() for w in (k, v)), *extra]


def run_inline(
    args: list[str], capsys: pytest.CaptureFixture[str], owners: dict[int, int]
) -> tuple[int, list[str]]:
    found = [
        hostsafe.Listener(ipaddress.ip_address("127.0.0.1"), port, uid)
        for port, uid in owners.items()
    ]
    code = program.main(args, lambda: found)
    out, err = capsys.readouterr()
    assert err == ""
    return code, out.splitlines()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"max_slowdown": "1.5"}, "--max-slowdown must be at least 0 and under 1"),
        ({"target": "not-hex"}, "--target 'not-hex' is not a hex digest"),
        ({"canary": "sglang@1.service"}, "--canary 'sglang@1.service' is not UNIT=URL"),
        ({"canary": "u=ftp://x"}, "--canary 'ftp://x' is not an http(s) URL with a host"),
        ({"meta": "{}"}, "--meta is not a JSON object with release, engine"),
        ({"rollback": '[["write", ["cat"]]]'}, "--rollback has no steps, or a `write` step"),
        ({"rollback": "{}"}, "--rollback is not a roll batch's steps"),
        ({"router_metrics": "http://127.0.0.1:29000"}, "--router-metrics without a --worker"),
        ({"rounds": "x"}, "the command line: argument --rounds"),
        ({"baseline": "sglang@1.service=http://127.0.0.1:3/v1"}, "is both a baseline and a canary"),
        ({"held": "sglang@0.service"}, "--held 'sglang@0.service' is not a unit apart"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], why: str
) -> None:
    code, out = run_inline(
        argv(tmp_path, "http://127.0.0.1:1", "http://127.0.0.1:2", **change), capsys, {}
    )
    assert code == 2 and len(out) == 1 and out[0].startswith("canary: refused: "), out
    assert why in out[0] and "Traceback" not in out[0]
    assert not (tmp_path / "state" / "canary.json").exists()


def test_a_port_held_by_another_user_is_refused_before_the_key_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argv(tmp_path, "http://127.0.0.1:30001", "http://127.0.0.1:30000")
    # The key file, were it read, would be refused on its own: a directory.
    os.unlink(tmp_path / "secrets.yaml")
    (tmp_path / "secrets.yaml").mkdir()
    code, out = run_inline(args, capsys, {30000: os.getuid(), 30001: OTHER})
    assert code == 2 and len(out) == 1, out
    who = hostsafe.user_name(OTHER)
    assert out[0].startswith(
        f"canary: refused: sglang@1.service: 127.0.0.1:30001 is held by uid {OTHER} ({who}), "
        f"not by the service user {ME}"
    )
    assert "Who is sent the API key" in out[0]
    # Nothing listening on the baseline's port is no refusal: the baseline is down, its
    # fault, and with no baseline left there is no verdict (none kept, the canary not blamed).
    os.rmdir(tmp_path / "secrets.yaml")
    (tmp_path / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    code, out = run_inline(args, capsys, {30001: os.getuid()})
    assert code == 1 and out[-1].startswith("canary: NOT JUDGED: every baseline failed"), out
    assert "sglang@0.service: not serving: nothing listens on 127.0.0.1:30000" in out[-1]
    assert "the baselines' fault, not the canary's" in out[-1]
    assert not (tmp_path / "state" / "canary.json").exists()


def test_a_record_directory_others_may_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argv(tmp_path, "http://127.0.0.1:1", "http://127.0.0.1:2")
    os.chmod(tmp_path / "state", 0o777)
    code, out = run_inline(args, capsys, {})
    assert code == 2 and "is not this user's alone" in out[0] and "mode 777" in out[0]


# -- the program against two server doubles ------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the sglang double of 0.5.11 (server and benchmark client)."""
    return engine_env(tmp_path_factory.mktemp("engine"))


Start = Callable[..., str]


@pytest.fixture
def ranks(engine: Path, tmp_path: Path) -> Iterator[Start]:
    """start(rate, reply) -> a server double's URL (its root), stopped by PID at the end."""
    with RankDoubles(engine, tmp_path / "model", KEY) as doubles:
        yield doubles.start


def run_program(tmp: Path, engine: Path, args: list[str]) -> tuple[int, list[str]]:
    script = tmp / "canary_compare.py"
    script.write_text(script_text("canary_compare.py"))
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.stderr == "", proc.stderr
    assert KEY not in proc.stdout
    return proc.returncode, proc.stdout.splitlines()


def record_of(tmp: Path) -> dict[str, Any]:
    path = tmp / "state" / "canary.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["canary.json"]  # no temp file left
    kept: dict[str, Any] = json.loads(path.read_text())
    return kept


@pytest.mark.integration
def test_a_canary_like_its_baseline_passes_every_row_and_keeps_the_record(
    engine: Path, ranks: Start, tmp_path: Path
) -> None:
    base, canary = ranks(), ranks()
    router = RouterPage([base, canary], failing=[])
    try:
        args = argv(
            tmp_path,
            canary,
            base,
            "--worker",
            f"sglang@0.service={base}",
            "--worker",
            f"sglang@1.service={canary}",
            router_metrics=router.url,
            soak="0.5",
        )
        code, out = run_program(tmp_path, engine, args)
    finally:
        router.stop()
    assert code == 0 and out[-1] == "canary: passed", out
    assert out[0].split() == ["check", "baseline", "canary", "threshold", "pass"]
    kept = record_of(tmp_path)
    assert kept["version"] == 1 and kept["target"] == "ab12" * 16
    assert (kept["release"], kept["engine"]) == ("0.5.11", "/opt/sglang/envs/e2")
    assert (kept["canary_ranks"], kept["baseline_rank"]) == ([1], 0) and "other" not in kept
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", kept["at"])
    assert (kept["ok"], kept["paused"], kept["rolled_back"]) == (True, False, False)
    checks = [r["check"] for r in kept["rows"]]
    assert checks == ["answers: known sum", "answers: open prompts", "speed", "errors"]
    assert all(r["pass"] for r in kept["rows"])
    assert set(kept["rows"][0]) == {"check", "baseline", "canary", "threshold", "pass"}
    assert kept["rows"][1]["canary"] == "sglang@1.service: 3/3 identical"
    assert kept["rows"][3]["canary"] == "sglang@1.service: 0 failed of 10 (0.0%)"


@pytest.mark.integration
def test_a_slower_canary_fails_speed_and_is_rolled_back(
    engine: Path, ranks: Start, tmp_path: Path
) -> None:
    base, canary = ranks("40"), ranks("10")
    marker = tmp_path / "rolled"
    steps = [["drain", ["true"]], ["restore", ["touch", str(marker)]]]
    args = argv(tmp_path, canary, base, "--pause", rollback=json.dumps(steps))
    code, out = run_program(tmp_path, engine, args)
    assert code == 1 and out[-1] == "canary: FAILED (speed); the canary rolled back", out
    assert any(line.startswith("errors") and "skipped: no" in line for line in out)
    assert marker.exists()
    kept = record_of(tmp_path)
    assert kept["rows"][-1]["canary"] == "skipped: no router"
    assert (kept["ok"], kept["paused"], kept["rolled_back"]) == (False, True, True)
    assert [r["check"] for r in kept["rows"] if not r["pass"]] == ["speed"]


@pytest.mark.integration
def test_a_canary_whose_answers_differ_fails_answers_and_a_failed_rollback_says_so(
    engine: Path, ranks: Start, tmp_path: Path
) -> None:
    base, canary = ranks(), ranks(reply="wrong-sum")
    marker = tmp_path / "never"
    steps = [["drain", ["false"]], ["restore", ["touch", str(marker)]]]
    code, out = run_program(
        tmp_path, engine, argv(tmp_path, canary, base, rollback=json.dumps(steps))
    )
    assert code == 1, out
    assert out[-1] == (
        "canary: FAILED (answers: known sum); the rollback FAILED (exit 1): the canary is left "
        "as it is"
    )
    assert not marker.exists()
    kept = record_of(tmp_path)
    assert (kept["ok"], kept["rolled_back"]) == (False, False)
    assert "NOT " in kept["rows"][0]["canary"] and kept["rows"][0]["threshold"] == "exact"


@pytest.mark.integration
def test_a_failing_baseline_is_dropped_as_its_own_fault_and_the_others_judge(
    engine: Path, ranks: Start, tmp_path: Path
) -> None:
    # Baseline sglang@0 answers the sum wrong: its fault, named, dropped; sglang@2 judges the
    # canary, whose rows pass. The record names who was used and who was dropped, and why.
    broken, base, canary = ranks(reply="wrong-sum"), ranks(), ranks()
    args = argv(tmp_path, canary, broken, "--baseline", f"sglang@2.service={base}/v1")
    meta = json.loads(args[args.index("--meta") + 1])
    args[args.index("--meta") + 1] = json.dumps({**meta, "baseline_ranks": [0, 2]})
    code, out = run_program(tmp_path, engine, args)
    assert code == 0 and out[-1] == "canary: passed", out
    kept = record_of(tmp_path)
    assert kept["baselines"]["used"] == ["sglang@2.service"], kept
    assert kept["baselines"]["dropped"]["sglang@0.service"].startswith("known sum: ")
    assert kept["baseline_rank"] == 2 and set(kept["baselines"]["tok_s"]) == {"sglang@2.service"}
    first = kept["rows"][0]["baseline"]
    assert "sglang@0.service: NOT" in first and "(the baseline's fault: dropped)" in first
    assert kept["rows"][2]["baseline"].startswith("median of sglang@2.service: ")


@pytest.mark.integration
def test_a_canary_that_died_fails_and_rolls_back_naming_the_ranks_left_stopped(
    engine: Path, ranks: Start, tmp_path: Path
) -> None:
    base, other = ranks(), ranks()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: the canary died
    marker = tmp_path / "rolled"
    steps = [["restore", ["touch", str(marker)]]]
    args = argv(
        tmp_path,
        dead,
        base,
        "--baseline",
        f"sglang@2.service={other}/v1",
        "--held",
        "sglang@3.service",
        rollback=json.dumps(steps),
    )
    code, out = run_program(tmp_path, engine, args)
    assert code == 1 and marker.exists(), out
    assert out[-1].startswith("canary: FAILED (answers: known sum, answers: open prompts, speed)")
    assert out[-1].endswith(
        "the canary rolled back; sglang@3.service not started: stopped until a verdict passes"
    )
    kept = record_of(tmp_path)
    assert kept["ok"] is False and kept["rolled_back"] is True
    assert "sglang@1.service: not serving: nothing listens" in kept["rows"][0]["canary"]
    # Both baselines were measured at once and kept: their spread is recorded.
    assert kept["baselines"]["used"] == ["sglang@0.service", "sglang@2.service"]
    assert 0 <= kept["baselines"]["spread"] < 1
