"""`status`'s tune line and JSON (operations/cli/status/tune.py): the host's last tune from the
status fact's own command (one round trip), finished (its proposal and the lines that apply
it), running (how far), or cut off (what picks it up). The records are the TuneRecords
fixtures' (tests/facts/tune.TuneRecords/, scripts/compose_tune_records.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from operations.cli.status.tune import TuneView, settings_have
from operations.facts.serve_status import ServingStatus, parse_status
from operations.facts.tune import LastTune, TuneRun, TuneSummary, parse_run, parse_tune
from operations.settings import Settings

FIXTURES = Path(__file__).resolve().parents[1] / "facts" / "tune.TuneRecords"
RESUME = "`python -m operations.tune INVENTORY` resumes"


def output(fixture: str) -> list[str]:
    lines: list[str] = json.loads((FIXTURES / f"{fixture}.json").read_text())["output"]
    return lines


def fact(fixture: str) -> dict[str, Any]:
    """What the fixture says the fact reads (its "fact"): not the parser's word."""
    read: dict[str, Any] = json.loads((FIXTURES / f"{fixture}.json").read_text())["fact"]
    return read


def view(fixture: str, settings: Settings | None = None) -> TuneView:
    return TuneView.of(parse_tune(output(fixture)), settings)


def settings(**changes: float | None) -> Settings:
    from operations.simulated.converged import repository_settings

    return dataclasses.replace(repository_settings(), **changes)  # type: ignore[arg-type]


def test_a_host_never_tuned_says_nothing_and_its_json_is_null() -> None:
    shown = view("none")
    assert shown.lines() == []
    assert shown.to_json() is None


def test_a_finished_tune_says_its_best_the_change_the_noise_and_the_lines_to_apply() -> None:
    assert view("finished", settings(max_running_requests=None)).lines() == [
        "  tune: 2026-12-07T05:10:00Z on rank 7: best max_running_requests=128 + "
        "cuda_graph_max_bs=128, +69.9% against the current settings, beyond the noise (7.4%)",
        "  to apply, put in the host's group_data and deploy: max_running_requests: 128; "
        "cuda_graph_max_bs: 128",
    ]


def test_a_proposal_the_inventory_already_has_is_said_so() -> None:
    shown = view("finished", settings(max_running_requests=128, cuda_graph_max_bs=128))
    assert shown.applied is True
    assert shown.lines()[1] == (
        "  the inventory's settings already have them: max_running_requests: 128; "
        "cuda_graph_max_bs: 128"
    )
    half = view("finished", settings(max_running_requests=128, cuda_graph_max_bs=None))
    assert half.applied is False


def test_settings_have_reads_the_lines_as_the_plan_writes_them() -> None:
    s = settings(mem_fraction_static=0.95, max_running_requests=64)
    assert settings_have(("mem_fraction_static: 0.95",), s) is True
    assert settings_have(("mem_fraction_static: 0.85",), s) is False
    assert settings_have(("max_running_requests: 64",), s) is True
    assert settings_have(("no_such_setting: 1",), s) is None
    assert settings_have((), s) is None
    assert settings_have(("max_running_requests: 64",), None) is None


def test_keep_the_current_settings_has_no_lines_to_apply() -> None:
    shown = view("kept", settings())
    assert shown.lines() == [
        "  tune: 2026-12-07T05:10:00Z on rank 7: keep the current settings: no candidate was "
        "faster (noise 0.1%)"
    ]
    assert shown.applied is None
    summary = TuneSummary("tune: keep ...", (), True, "cuda_graph_max_bs=128", 0.003, 0.016, False)
    run = TuneRun("2026-12-07T05:10:00Z", "sglang@7.service", ("current",), summary=summary)
    assert TuneView.of(LastTune(run=run)).lines() == [
        "  tune: 2026-12-07T05:10:00Z on rank 7: keep the current settings (best "
        "cuda_graph_max_bs=128, +0.3%, within the noise (1.6%))"
    ]


def test_a_running_tune_says_since_when_how_far_and_its_pid() -> None:
    read = parse_tune(output("running"))
    assert read.phase == "running"
    assert read.state is not None and read.state.pid is not None
    assert TuneView.of(read).lines() == [
        f"  tune: running on rank 7 since 2026-12-07T05:10:00Z (pid {read.state.pid}): "
        "3 of 9 candidates done"
    ]


def test_a_resumed_run_counts_its_kept_rows_and_names_the_run_it_resumes() -> None:
    read = parse_tune(output("resumed-running"))
    assert read.run is not None and read.run.resumes == "2026-12-06T21:30:00Z"
    assert [r.kept_from for r in read.run.rows] == ["2026-12-06T21:30:00Z"] * 2
    assert "2 of 9 candidates done" in TuneView.of(read).lines()[0]
    assert TuneView.of(read).to_json()["resumes"] == "2026-12-06T21:30:00Z"  # type: ignore[index]


def test_a_cut_off_tune_says_what_puts_the_rank_back_and_how_to_resume() -> None:
    assert view("cut-off").lines() == [
        "  tune: cut off after 3 of 9 candidates (rank 7, started 2026-12-07T05:10:00Z); the "
        f"next tune or deploy puts the rank back; {RESUME}"
    ]
    assert view("state-only").lines() == [
        "  tune: cut off before its first candidate (rank 7); the next tune or deploy puts the "
        f"rank back; {RESUME}"
    ]


def test_0_14_0_records_are_read_by_their_rows_and_their_sentence() -> None:
    assert view("v0.14.0").lines() == [
        "  tune: 2026-12-06T21:30:00Z on rank 7: best max_running_requests=128: 426.0 output "
        "tok/s, +33.3% against the current settings, beyond the noise",
        "  to apply, put in the host's group_data and deploy: max_running_requests: 128",
    ]
    # Cut off with no start line and no state file: its rows counted, no total known.
    assert view("v0.14.0-cut-off").lines() == [
        f"  tune: cut off after 2 candidates (rank 7, started 2026-12-06T21:30:00Z); {RESUME}"
    ]


def test_a_torn_line_is_one_note_and_the_run_is_still_read() -> None:
    lines = view("torn-line").lines()
    assert len(lines) == 2
    assert lines[0].startswith("  tune records not read: /var/lib/sglang-deploy/tune.jsonl: a line")
    assert lines[1].startswith("  tune: cut off after 3 of 9 candidates")


@pytest.mark.parametrize(
    "records",
    [
        ["not json at all"],
        ["[1, 2]", '{"no": "tune"}'],
        ['{"tune": "x", "unit": "sglang@1.service", "name": 3, "status": "measured"}'],
        ['{"tune": "x", "summary": "tune: ok", "proposal": "not a list", "restored": "?"}'],
    ],
)
def test_garbage_is_a_note_never_a_traceback(records: list[str]) -> None:
    read = parse_tune([*(f"record {x}" for x in records), "state {", "end"])
    shown = TuneView.of(read, settings())
    assert all(line.startswith("  tune") for line in shown.lines())
    assert read.notes or read.run is not None
    json.dumps(shown.to_json(), allow_nan=False)


def test_a_later_run_cut_off_before_its_first_record_is_not_the_finished_one() -> None:
    """The state file of a run that wrote nothing yet, beside an earlier run's summary that put
    the rank back: cut off, and the earlier run is not named."""
    lines = [x for x in output("finished") if x != "end"]
    read = parse_tune([*lines, 'state {"unit": "sglang@7.service", "pid": "1"}', "end"])
    assert read.phase == "cut_off" and read.current is None
    assert view_lines(read) == [
        "  tune: cut off before its first candidate (rank 7); the next tune or deploy puts the "
        f"rank back; {RESUME}"
    ]


def view_lines(read: LastTune) -> list[str]:
    return TuneView.of(read).lines()


def test_the_last_run_is_the_last_lines_run_and_a_names_last_row_wins() -> None:
    def line(run: str, **rest: object) -> str:
        return json.dumps({"tune": run, "unit": "sglang@7.service", **rest})

    run, bad = parse_run(
        [
            line("a", name="current", status="measured", output_tok_s=1.0),
            line("b", name="current", status="failed", why="x"),
            line("b", name="current", status="measured", output_tok_s=2.0),
        ]
    )
    assert bad == []
    assert run is not None and run.id == "b"
    assert [(r.name, r.status) for r in run.rows] == [("current", "measured")]


@pytest.mark.parametrize(
    "fixture",
    ["finished", "kept", "running", "cut-off", "v0.14.0", "v0.14.0-cut-off", "torn-line"],
)
def test_json_holds_the_run_as_the_fixture_says_it(fixture: str) -> None:
    """`status --json`'s tune, through JSON and back, against the fixture's own account."""
    said = fact(fixture)
    run, state = said["run"], said["state"]
    shown = json.loads(json.dumps(view(fixture).to_json(), allow_nan=False))
    summary = run["summary"]
    assert shown["id"] == run["id"]
    assert shown["unit"] == "sglang@7.service" and shown["rank"] == 7
    assert shown["done"] == len(run["rows"])
    assert shown["candidates"] == (
        len(run["candidates"]) or (len(run["rows"]) if summary is not None else None)
    )
    assert shown["state_file"] is (state is not None)
    assert shown["pid"] == (state["pid"] if state is not None and state["live"] else None)
    assert shown["proposal"] == (summary["proposal"] if summary is not None else [])
    assert shown["best"] == (summary["best"] if summary is not None else None)
    assert shown["notes"] == said["notes"]
    phase = "running" if state and state["live"] else "finished" if summary else "cut_off"
    assert shown["phase"] == phase


def test_the_status_fact_reads_the_tune_in_its_one_command() -> None:
    command = ServingStatus().command("/opt/sglang", "/dev/shm/m", tune=True).get_raw_value()
    assert "/var/lib/sglang-deploy/tune.jsonl" in command
    assert "/var/lib/sglang-deploy/tune.state" in command
    assert command.count("sed 's/^/tune /'") == 1
    assert "tune.jsonl" not in ServingStatus().command("/opt/sglang", "/dev/shm/m").get_raw_value()
    lines = output("finished")
    read = parse_status(["now 1", *(f"tune {line}" for line in lines)])
    assert read.tune_lines == lines
    assert parse_tune(read.tune_lines).phase == "finished"


def test_the_simulated_ct200_holds_the_finished_fixtures_records() -> None:
    """inventory/demo_measured.py's tune (docs/samples/status-measured.txt) is the finished
    fixture's output: one composer writes both (scripts/compose_tune_records.py)."""
    from operations.simulated import ct200

    assert ct200.captured("tune-state.txt") == output("finished")


def test_a_tune_the_real_program_wrote_is_read_as_finished_with_its_proposal() -> None:
    """tests/fixtures/tune/bench-trial.jsonl: programs/tune.py's own file (SOURCE.md)."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "tune" / "bench-trial.jsonl"
    records = path.read_text().splitlines()
    written = [json.loads(x) for x in records]
    (start,) = [r for r in written if r.get("event") == "start"]
    (summary,) = [r for r in written if "summary" in r]
    last = parse_tune([f"record {x}" for x in records] + ["end"])
    assert last.notes == () and last.phase == "finished", last
    run = last.current
    assert run is not None and run.summary is not None
    assert run.total == len(start["candidates"]) and run.done == len(start["candidates"])
    assert run.summary.best == summary["best"] and run.summary.proposal == tuple(
        summary["proposal"]
    )
