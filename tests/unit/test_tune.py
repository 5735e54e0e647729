"""The tune (issue 50): its plan (the rank, the candidates resolved and checked, the pair moved
together, the refusals), its table's decisions (noise, best, proposal), the host program's
crash safety (a cut-off tune's rank put back) and the server double's levers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from operations import kb as kbmod
from operations import layout
from operations.facts.serve import Serving, UnitState
from operations.kb.throughput import Together, TuneSpace, _tune_problems, load_throughput
from operations.plan import resolver
from operations.plan.resolver.types import ResolvedHost
from operations.plan.tune_plan import TUNE_REFUSAL, candidates, pick_rank, tune_plan
from operations.programs import tune_table
from operations.render.host_scripts import load
from operations.settings import Settings
from tests.doubles.rank_doubles import scheduler_module
from tests.unit.builders import facts, make_settings

DEMO = ("inventory/demo_day2.py", "--dry")


def _resolve(s: Settings) -> ResolvedHost:
    return resolver.resolve(s, facts(), kbmod.load())


def _serving(s: Settings, active: str = "active") -> Serving:
    return Serving(ranks={r: UnitState(active=active) for r in range(s.dp_size)})


def _plan(s: Settings, **kw: object) -> object:
    ranks = _resolve(s).ranks
    args: dict[str, object] = {
        "serving": _serving(s),
        "touched": (),
        "router_restarts": False,
        "router_here": True,
        "space": load_throughput().tune,
        "resolve": _resolve,
        "digests": {},
    }
    args.update(kw)
    return tune_plan(s, ranks, **args)  # type: ignore[arg-type]


# -- the knowledge ----------------------------------------------------------------------------


def test_the_knowledge_moves_max_running_requests_and_the_graph_size_together_with_sources() -> (
    None
):
    space = load_throughput().tune
    pair = space.together[0]
    assert (pair.lead, pair.follows) == ("max_running_requests", "cuda_graph_max_bs")
    assert {s.id for s in pair.source} >= {"sglang-pr-33900", "sglang-pr-21005"}


def test_a_tune_lever_the_plan_cannot_move_or_a_pair_without_values_is_named() -> None:
    raw = {
        "values": {"attention_backend": ["triton"], "max_running_requests": [64]},
        "together": [
            {
                "lead": "max_running_requests",
                "follows": "cuda_graph_max_bs",
                "why": "",
                "source": [],
            }
        ],
    }
    problems = list(_tune_problems(raw))  # type: ignore[arg-type]
    assert any("tune.values.attention_backend: not a lever the tune moves" in p for p in problems)
    assert any(
        "tune.together[0].follows: 'cuda_graph_max_bs' has no tune.values" in p for p in problems
    )


# -- the plan ---------------------------------------------------------------------------------


def test_the_highest_rank_is_picked_and_why_is_said() -> None:
    s = make_settings()
    rank, why = pick_rank(_resolve(s).ranks)
    assert rank.rank == s.dp_size - 1
    assert f"rank {s.dp_size - 1}" in why and "rank 0" in why


def test_candidates_one_lever_at_a_time_then_the_pair_each_a_resolved_unit() -> None:
    s = make_settings(max_running_requests=64)
    space = TuneSpace(
        values={"max_running_requests": (64, 128), "cuda_graph_max_bs": (128,)},
        together=(Together("max_running_requests", "cuda_graph_max_bs", "", ()),),
    )
    found = candidates(s, 1, space, _resolve)
    names = [c.name for c in found]
    # 64 is the current value: no candidate; the pair at 64 moves the graph size only.
    assert names == [
        "current",
        "max_running_requests=128",
        "cuda_graph_max_bs=128",
        "max_running_requests=64 + cuda_graph_max_bs=64",
        "max_running_requests=128 + cuda_graph_max_bs=128",
    ]
    pair = found[-2]
    assert pair.lines == ["max_running_requests: 64", "cuda_graph_max_bs: 64"]
    assert pair.unit is not None and "--cuda-graph-max-bs 64" in pair.unit
    assert "--max-running-requests 64" in pair.unit
    assert found[1].unit is not None and "--max-running-requests 128" in found[1].unit
    assert found[0].unit is None  # the current settings: measured as they serve


def test_a_candidate_the_resolver_refuses_is_failed_in_the_plan_and_never_started() -> None:
    s = make_settings(extra_server_args=["--max-running-requests", "32"])
    space = TuneSpace(values={"max_running_requests": (64,)}, together=())
    found = candidates(s, 0, space, _resolve)
    assert found[1].unit is None
    assert found[1].refused.startswith("refused by the plan: ")
    assert "max_running_requests" in found[1].refused


def test_the_plan_says_the_rank_out_of_service_without_a_router() -> None:
    s = make_settings()
    behind = _plan(s)
    alone = _plan(s, router_here=False)
    assert "leaves the router" in behind.service  # type: ignore[attr-defined]
    assert "OUT OF SERVICE" in alone.service  # type: ignore[attr-defined]
    assert "min" in alone.estimate and "candidates" in alone.estimate  # type: ignore[attr-defined]
    argv = alone.argv  # type: ignore[attr-defined]
    assert argv[:2] == ["python3", layout.TUNE_SCRIPT]
    assert argv[argv.index("--state") + 1] == layout.TUNE_STATE
    shipped = json.loads(argv[argv.index("--candidates") + 1])
    assert [c["name"] for c in shipped] == [c.name for c in alone.candidates]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"router_restarts": True}, TUNE_REFUSAL),
        ({"touched": (0,)}, TUNE_REFUSAL),
        ({"serving": Serving(ranks={})}, "is not serving (systemd: no unit)"),
    ],
)
def test_a_host_not_deployed_or_a_rank_not_serving_is_refused(
    change: dict[str, object], said: str
) -> None:
    plan = _plan(make_settings(), **change)
    assert any(said in e for e in plan.errors)  # type: ignore[attr-defined]
    assert plan.argv == []  # type: ignore[attr-defined]


def test_the_tune_s_own_rank_changed_is_planned_for_a_cut_off_tune_and_checked_on_the_host() -> (
    None
):
    s = make_settings()
    last = s.dp_size - 1
    plan = _plan(s, touched=(last,), serving=Serving(ranks={}))
    assert plan.errors == [], plan.errors  # type: ignore[attr-defined]
    assert "a tune cut off there is put back first" in plan.estimate  # type: ignore[attr-defined]
    argv = plan.argv  # type: ignore[attr-defined]
    unit = next(r.unit for r in _resolve(s).ranks if r.rank == last)
    assert argv[argv.index("--unit-sha256") + 1] == hashlib.sha256(unit.encode()).hexdigest()


def test_without_metrics_the_tune_is_refused_naming_the_setting() -> None:
    plan = _plan(make_settings(enable_metrics=False))
    assert "enable_metrics is false" in plan.errors[0]  # type: ignore[attr-defined]


# -- the table ---------------------------------------------------------------------------------


def _row(name: str, rounds: list[float]) -> tune_table.Row:
    return tune_table.measured_row(name, [f"{name}: 1"], rounds, 64, 100.0, 20.0)


def test_a_gain_within_the_noise_keeps_the_current_settings() -> None:
    rows = [_row("current", [100, 110, 90]), _row("a", [104, 106, 105])]
    chosen, said = tune_table.proposal(rows)
    assert chosen is not None and chosen["name"] == "current"
    assert "keep the current settings" in said


def test_a_gain_beyond_the_noise_is_proposed_with_its_lines_and_failures_are_shown() -> None:
    rows = [
        _row("current", [100, 101, 99]),
        _row("a", [150, 151, 149]),
        tune_table.failed_row("b", ["b: 1"], "failed", "never healthy: CUDA out of memory"),
    ]
    chosen, said = tune_table.proposal(rows)
    assert chosen is not None and chosen["name"] == "a" and "+50.0%" in said
    shown = tune_table.table(rows)
    assert any(
        line.startswith("b ") and "FAILED: never healthy: CUDA out of memory" in line
        for line in shown
    )
    row_a = next(line for line in shown if line.startswith("a "))
    assert "+50.0%" in row_a and row_a.endswith("yes")


def test_nothing_measured_proposes_nothing() -> None:
    rows = [tune_table.failed_row("current", [], "failed", "not measured: x")]
    assert tune_table.proposal(rows)[0] is None


# -- the host program: a cut-off tune's rank is put back ----------------------------------------


@pytest.fixture(scope="module")
def program() -> ModuleType:
    return load("tune.py")


def _args(tmp: Path, restart_log: Path) -> list[str]:
    restart = [["restart", ["/bin/sh", "-c", f"echo restarted >> {restart_log}"]]]
    back = [["readmit", ["/bin/sh", "-c", f"echo readmitted >> {restart_log}"]]]
    words = ["--unit", "sglang@1.service", "--unit-path", str(tmp / "unit"), "--url", "http://x"]
    words += ["--unit-sha256", "0" * 64]
    words += ["--state", str(tmp / "tune.state"), "--results", str(tmp / "tune.jsonl")]
    words += ["--key-file", str(tmp / "key"), "--service-user", "nobody", "--candidates", "[]"]
    words += ["--budget", "60", "--start-estimate", "1"]
    words += ["--restart", json.dumps(restart), "--in", json.dumps(back)]
    words += ["--input-len", "8", "--output-len", "8", "--start", "1", "--most", "1"]
    words += ["--rounds", "1", "--ramp-timeout", "1", "--window", "1", "--timeout", "5"]
    return [*words, "--model", "m"]


def _cut_off(program: ModuleType, tmp: Path, unit_now: bytes) -> Path:
    """A tune killed while a candidate ran: its state, the saved unit, the unit file now."""
    (tmp / "tune.state.unit").write_bytes(b"own unit\n")
    (tmp / "unit").write_bytes(unit_now)
    state = {
        "unit": "sglang@1.service",
        "unit_path": str(tmp / "unit"),
        "saved": str(tmp / "tune.state.unit"),
        "candidate_sha256": program.sha256(b"candidate unit\n"),
    }
    (tmp / "tune.state").write_text(json.dumps(state))
    return tmp / "log"


@pytest.mark.integration  # starts processes (the host program, pyinfra)
def test_a_cut_off_tune_is_restored_first_its_rank_restarted_and_readmitted(
    program: ModuleType, tmp_path: Path
) -> None:
    log = _cut_off(program, tmp_path, b"candidate unit\n")
    tune = program.Tune(program.parse(_args(tmp_path, log)), "tune.py")
    tune.leftover()
    assert (tmp_path / "unit").read_bytes() == b"own unit\n"
    assert log.read_text().split() == ["restarted", "readmitted"]
    assert not (tmp_path / "tune.state").exists() and not (tmp_path / "tune.state.unit").exists()
    assert oct(os.stat(tmp_path / "unit").st_mode & 0o777) == "0o644"


@pytest.mark.integration  # starts processes (the host program, pyinfra)
def test_a_unit_a_deploy_rewrote_since_is_left_as_it_is(
    program: ModuleType, tmp_path: Path
) -> None:
    log = _cut_off(program, tmp_path, b"the deploy's new unit\n")
    tune = program.Tune(program.parse(_args(tmp_path, log)), "tune.py")
    tune.leftover()
    assert (tmp_path / "unit").read_bytes() == b"the deploy's new unit\n"
    assert log.read_text().split() == ["readmitted"]
    assert not (tmp_path / "tune.state").exists()


def test_a_state_file_that_cannot_be_read_is_refused_naming_it(
    program: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "tune.state").write_text("{not json")
    tune = program.Tune(program.parse(_args(tmp_path, tmp_path / "log")), "tune.py")
    with pytest.raises(program.Refused, match=r"tune\.state cannot be read"):
        tune.leftover()


# -- the server double's levers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_module() -> ModuleType:
    return scheduler_module("generate_double_for_tune")


def test_the_double_decodes_a_batch_past_its_graph_size_slower(gen_module: ModuleType) -> None:
    gen = gen_module.Gen(max_running=128, graph_bs=64)
    assert gen.step_s(65) > 1.5 * gen.step_s(64)
    assert gen_module.Gen(max_running=128).graph_bs == gen_module.DEFAULT_GRAPH_BS


def test_the_double_refuses_a_memory_fraction_above_its_limit(
    gen_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gen_module.MEM_LIMIT_ENV, "0.9")
    assert gen_module.out_of_memory("0.9") is None
    said = gen_module.out_of_memory("0.95")
    assert said is not None and "CUDA out of memory" in said


def test_settings_replaced_keep_their_other_values() -> None:
    s = make_settings()
    assert replace(s, max_running_requests=64).mem_fraction_static == s.mem_fraction_static


# -- the demo (starts pyinfra: the slow part of this file) ------------------------------------


@pytest.mark.integration  # starts processes (the host program, pyinfra)
def test_make_demo_tune_previews_the_rank_the_candidates_and_the_time() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [str(root / ".venv" / "bin" / "python"), "-m", "operations.tune", *DEMO],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    prose = " ".join(out.split())
    assert "tune: rank 7 (sglang@7.service)" in prose, out
    assert "OUT OF SERVICE" in prose, out  # the demo's CT200 has no router
    assert "tune: candidate max_running_requests=64 + cuda_graph_max_bs=64" in prose, out
    assert "budget 180 min" in prose and "Traceback" not in out, out


class _Measured:
    """A Tune whose measurement is given (the load client is tested in test_throughput.py):
    each candidate's rate is read from the unit file the tune wrote."""

    @staticmethod
    def make(program: ModuleType) -> type:
        class Tune(program.Tune):  # type: ignore[misc,name-defined]
            def measure(self, key: object, deadline: float) -> tuple[dict[str, object], str]:
                text = Path(self.args.unit_path).read_text()
                rate = float(text.split("rate=")[1].split()[0])
                windows = [
                    {"output_tok_s": rate + d, "generated": 1, "own_generated": 1}
                    for d in (-1, 0, 1)
                ]
                ranks = {self.args.unit: {"windows": windows, "concurrency": 8, "errors": 0}}
                return {"ranks": ranks}, ""

        return Tune


@pytest.mark.integration  # starts processes (the host program, pyinfra)
def test_a_search_measures_each_candidate_shows_one_that_never_starts_and_restores_the_unit(
    program: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "unit").write_text("rate=100 own\n")
    log = tmp_path / "log"
    args = _args(tmp_path, log)
    # The restart fails for a unit that says `bad` (a candidate that never gets healthy).
    restart = [
        ["restart", ["/bin/sh", "-c", f"echo restart >> {log}; ! grep -q bad {tmp_path / 'unit'}"]]
    ]
    args[args.index("--restart") + 1] = json.dumps(restart)
    found = [
        {"name": "current", "lines": [], "unit": None, "refused": ""},
        {"name": "a", "lines": ["a: 1"], "unit": "rate=150\n", "refused": ""},
        {"name": "b", "lines": ["b: 1"], "unit": "rate=500 bad\n", "refused": ""},
        {"name": "c", "lines": ["c: 1"], "unit": None, "refused": "refused by the plan: x"},
    ]
    args[args.index("--candidates") + 1] = json.dumps(found)
    tune = _Measured.make(program)(program.parse(args), "tune.py")
    rows, restored = tune.search(None)
    assert restored is True
    assert [r["status"] for r in rows] == ["measured", "measured", "failed", "failed", "measured"]
    assert rows[-1]["name"] == "current, again" and rows[-1]["output_tok_s"] == 100.0
    assert rows[1]["output_tok_s"] == 150.0 and rows[2]["why"].startswith("never healthy: ")
    assert rows[3]["why"] == "refused by the plan: x"
    # Back on its own unit (restarted on it to measure it again), back in the router; nothing
    # of the run left.
    assert (tmp_path / "unit").read_text() == "rate=100 own\n"
    assert log.read_text().split() == ["restart", "restart", "restart", "readmitted"]
    assert not (tmp_path / "tune.state").exists() and not (tmp_path / "tune.state.unit").exists()
    kept = [json.loads(x) for x in (tmp_path / "tune.jsonl").read_text().splitlines()]
    (start,) = [k for k in kept if k.get("event") == "start"]
    assert start["candidates"] == ["current", "a", "b", "c", "current, again"]
    assert start["resumes"] is None
    assert [k["name"] for k in kept if "name" in k] == ["current", "a", "b", "c", "current, again"]
    chosen, _ = tune_table.proposal(rows)
    assert chosen is not None and chosen["lines"] == ["a: 1"]


_FOUR = [
    {"name": "current", "lines": [], "unit": None, "refused": ""},
    {"name": "a", "lines": ["a: 1"], "unit": "rate=150\n", "refused": ""},
    {"name": "b", "lines": ["b: 1"], "unit": "rate=120\n", "refused": ""},
    {"name": "c", "lines": ["c: 1"], "unit": "rate=90\n", "refused": ""},
]


def _search(program: ModuleType, tmp: Path, *extra: str, candidates: object = None) -> object:
    (tmp / "unit").write_text("rate=100 own\n")
    args = _args(tmp, tmp / "log")
    args[args.index("--candidates") + 1] = json.dumps(candidates or _FOUR)
    return _Measured.make(program)(program.parse([*args, *extra]), "tune.py")


def _records(tmp: Path) -> list[dict[str, Any]]:
    lines = (tmp / "tune.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.startswith("{")]


@pytest.mark.integration  # starts processes (the roll steps' shells)
def test_a_cut_off_tune_is_resumed_keeping_what_it_measured_and_measuring_current_again(
    program: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _search(program, tmp_path)
    first.search(None)  # type: ignore[attr-defined]
    # Cut off after `a` (its summary never written): only its start line and two rows stay.
    lines = (tmp_path / "tune.jsonl").read_text().splitlines()
    (tmp_path / "tune.jsonl").write_text("\n".join(lines[:3]) + "\nnot json\n")
    cut = _records(tmp_path)[0]["tune"]
    capsys.readouterr()
    again = _search(program, tmp_path)
    again.id = "later"  # type: ignore[attr-defined]
    rows, restored = again.search(None)  # type: ignore[attr-defined]
    assert restored is True
    assert [r.get("kept_from") for r in rows] == [None, cut, None, None, None]
    assert [r["output_tok_s"] for r in rows] == [100.0, 150.0, 120.0, 90.0, 100.0]
    (start,) = [r for r in _records(tmp_path) if r.get("tune") == "later" and "event" in r]
    assert start["resumes"] == cut
    said = capsys.readouterr().out
    assert f"resuming the tune of {cut} (cut off): 1 of its candidates" in said
    assert f"tune: [2/5] a: 150.0 output tok/s (kept from {cut})" in said
    assert "tune: [2/5] a ... " not in said  # not measured again
    shown = tune_table.table(rows)
    assert shown[2].startswith("a *") and shown[-2] == (
        f"* measured by the cut-off tune of {cut} (resumed)"
    )


@pytest.mark.integration  # starts processes (the roll steps' shells)
def test_a_finished_tune_another_plan_or_fresh_is_not_resumed(
    program: ModuleType, tmp_path: Path
) -> None:
    _search(program, tmp_path).search(None)  # type: ignore[attr-defined]
    lines = (tmp_path / "tune.jsonl").read_text().splitlines()
    (tmp_path / "tune.jsonl").write_text("\n".join(lines[:3]) + "\n")
    for extra, found in (((), _FOUR[:3]), (("--fresh",), None)):
        again = _search(program, tmp_path, *extra, candidates=found)
        rows, _ = again.search(None)  # type: ignore[attr-defined]
        assert all("kept_from" not in r for r in rows), (extra, rows)
    # A tune that wrote its summary is never resumed.
    records = [*_records(tmp_path), {"tune": "x", "unit": "sglang@1.service", "summary": "s"}]
    records.insert(-1, {"tune": "x", "unit": "sglang@1.service", "event": "start", "plan": "p"})
    assert tune_table.resumable(records, "sglang@1.service", "p") == (None, {})
    assert tune_table.resumable(records[:-1], "sglang@1.service", "p") == ("x", {})
    assert tune_table.resumable(records[:-1], "sglang@2.service", "p") == (None, {})


def test_the_summary_names_the_proposal_its_change_and_the_noise() -> None:
    rows = [_row("current", [99, 100, 101]), _row("fast", [148, 150, 152])]
    chosen, said = tune_table.proposal(rows)
    decided = tune_table.summary(rows, chosen, said)
    assert decided["best"] == "fast" and decided["change"] == 0.5
    assert decided["beyond_noise"] is True and decided["noise"] == pytest.approx(0.0133, abs=1e-3)
    assert tune_table.summary(rows, None, "none")["best"] is None


def test_the_reason_shown_is_the_rank_s_own_error_line_not_systemd_s(program: ModuleType) -> None:
    lines = [
        "[double] loading",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "sglang@1.service: Failed with result 'exit-code'.",
    ]
    assert program.failure_line(lines) == lines[1]
    assert program.failure_line(lines[::2]) == lines[2]
    assert program.failure_line(["a", "b"]) == "b"
    assert program.failure_line([]) == "(no journal line)"


@pytest.mark.integration  # starts processes (the host program, pyinfra)
def test_a_tune_still_running_is_not_restored_under_it(program: ModuleType, tmp_path: Path) -> None:
    log = _cut_off(program, tmp_path, b"candidate unit\n")
    running = tmp_path / "tune.py"
    # Says it runs, then holds until its stdin closes (its command line is read once it said so).
    running.write_text("import sys\nprint('ready', flush=True)\nsys.stdin.read()\n")
    proc = subprocess.Popen(
        [sys.executable, str(running)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        state = json.loads((tmp_path / "tune.state").read_text())
        (tmp_path / "tune.state").write_text(json.dumps({**state, "pid": str(proc.pid)}))
        tune = program.Tune(program.parse(_args(tmp_path, log)), "tune.py")
        with pytest.raises(
            program.Refused, match=rf"a tune is still running here \(pid {proc.pid}"
        ):
            tune.leftover()
        assert (tmp_path / "unit").read_bytes() == b"candidate unit\n" and not log.exists()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    # Gone: restored.
    program.Tune(program.parse(_args(tmp_path, log)), "tune.py").leftover()
    assert (tmp_path / "unit").read_bytes() == b"own unit\n"


def test_a_unit_that_is_not_the_plan_s_is_refused_before_anything_changes(
    program: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "unit").write_text("the inventory changed it\n")
    log = tmp_path / "log"
    with pytest.raises(program.Refused, match="is not the unit this inventory plans"):
        program.work(_args(tmp_path, log), "tune.py")
    assert not log.exists() and not (tmp_path / "tune.state").exists()


def test_latency_bounds_pick_the_fastest_within_them_even_slower_than_current_over_one() -> None:
    def row(name: str, rate: float, ttft: float) -> tune_table.Row:
        return tune_table.measured_row(name, [f"{name}: 1"], [rate] * 3, 8, ttft, 20.0)

    rows = [row("current", 300, 900), row("fast", 500, 1200), row("quick", 250, 200)]
    chosen, said = tune_table.proposal(rows, (1000.0, None))
    assert chosen is not None and chosen["name"] == "current", said  # fast is over the bound
    chosen, said = tune_table.proposal(rows, (500.0, None))
    assert chosen is not None and chosen["name"] == "quick" and "over a latency bound" in said
    assert tune_table.proposal(rows, (100.0, None))[0] is None
    shown = tune_table.table(rows, (1000.0, None))
    assert next(x for x in shown if x.startswith("fast ")).endswith("(TTFT p50 over 1000 ms)")
    assert tune_table.proposal(rows)[0]["name"] == "fast"  # type: ignore[index]


def test_the_plan_passes_the_bounds_to_the_host_and_says_them() -> None:
    plan = _plan(make_settings(), bounds=(1500.0, None))
    argv = plan.argv  # type: ignore[attr-defined]
    assert argv[argv.index("--max-ttft-ms") + 1] == "1500" and "--max-itl-ms" not in argv
    assert "the best within TTFT p50 at most 1500 ms" in plan.estimate  # type: ignore[attr-defined]


def test_fresh_is_passed_to_the_host_and_a_resume_is_the_default() -> None:
    assert "--fresh" not in _plan(make_settings()).argv  # type: ignore[attr-defined]
    assert "--fresh" in _plan(make_settings(), fresh=True).argv  # type: ignore[attr-defined]


def test_each_candidate_is_asked_a_chat_question_where_the_plan_asks_one() -> None:
    s = make_settings()
    plan = _plan(s)
    rank = plan.rank  # type: ignore[attr-defined]
    assert plan.smoke.targets == [  # type: ignore[attr-defined]
        f"{layout.unit_name(rank)}={layout.rank_api_base(s, rank)}"
    ]
    assert _plan(replace(s, smoke_requests=False)).smoke is None  # type: ignore[attr-defined]


@pytest.mark.integration  # starts processes (the roll steps' shells)
def test_a_candidate_that_answers_wrong_is_failed_and_never_measured(
    program: ModuleType, tmp_path: Path
) -> None:
    tune = _search(program, tmp_path, candidates=_FOUR[:2])
    # Healthy, but its chat question fails (the smoke step's exit status).
    tune.restart = [("restart", ["/bin/true"], []), (program.SMOKE, ["/bin/false"], [])]  # type: ignore[attr-defined]
    rows, restored = tune.search(None)  # type: ignore[attr-defined]
    assert restored is False  # its own unit's restart asks the question too: it fails as well
    assert rows[1]["status"] == "failed" and rows[1]["why"].startswith("answers wrong: ")
    assert "output_tok_s" not in rows[1]


def test_the_current_settings_measured_again_last_put_their_drift_into_the_noise() -> None:
    rows = [_row("current", [99, 100, 101]), _row("a", [107, 108, 109])]
    # Measured once, `a` is 8% faster beyond a 1% noise.
    assert tune_table.compared(rows)[1]["beyond_noise"] is True
    # The host sped up during the tune (the current settings 116 at the end): the baseline is
    # their mean (108) and its noise their drift (7.4%): `a` is no faster, and kept off.
    again = [*rows, _row("current, again", [115, 116, 117])]
    judged = tune_table.compared(again)
    assert judged[1]["change"] == 0.0 and judged[1]["beyond_noise"] is False
    chosen, said = tune_table.proposal(again)
    assert chosen is not None and chosen["name"] == "current" and "keep" in said
    assert tune_table.summary(again, chosen, said)["noise"] == pytest.approx(0.074, abs=1e-3)
    assert tune_table.table(again)[-1] == (
        "the current settings measured first and last: 100.0 and 116.0 output tok/s; every "
        "change is against their mean, beyond a noise of at least 7.4%"
    )
