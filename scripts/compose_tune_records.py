"""The tune records of tests/facts/tune.TuneRecords/ and of the simulated CT200
(operations/simulated/captured/ct200/tune-state.txt), in the records' format
(operations/facts/tune.py's docstring):

    .venv/bin/python scripts/compose_tune_records.py

COMPOSED, not captured: each row is made by the tune's own row functions
(programs/tune_table.py measured_row, failed_row, compared, proposal) from the figures of the
e2e run docs/how-to/tune.md shows (tests/e2e/test_tune.py against the server double: each
row's median and spread, its rounds made [m(1-s), m, m(1+s)]); the start line and the
summary's best, change, noise and beyond_noise are written as the format says programs/tune.py
writes them. Replace with a capture of the real program's file once one is made.

Each fixture's `output` is TuneRecords' own command run here (its paths pointed at the case's
files; a running case's pid is a live `tune.py` process started for the run); its `fact` is
what the case was composed to say, written out here from the case's own lines, not by the
parser under test. Review the diff and commit the fixtures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyinfra.api.command import StringCommand  # noqa: E402
from pyinfra_testing.util import get_command_string  # noqa: E402

from operations.facts.tune import TuneRecords  # noqa: E402
from operations.programs.tune_table import (  # noqa: E402
    Row,
    compared,
    failed_row,
    measured_row,
    proposal,
)

FIXTURES = ROOT / "tests" / "facts" / "tune.TuneRecords"
SIMULATED = ROOT / "operations" / "simulated" / "captured" / "ct200" / "tune-state.txt"
UNIT = "sglang@7.service"
RUN, OLD = "2026-12-07T05:10:00Z", "2026-12-06T21:30:00Z"
OOM = (
    "never healthy: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
    "(the double: mem_fraction_static 0.95 is over its 0.92)"
)
# docs/how-to/tune.md's table: name, group_data lines, median, spread, TTFT and ITL p50 (ms).
TABLE: list[tuple[str, list[str], float | None, float, float, float]] = [
    ("current", [], 319.5, 0.001, 1402, 100),
    ("max_running_requests=64", ["max_running_requests: 64"], 277.0, 0.074, 1145, 215),
    ("max_running_requests=128", ["max_running_requests: 128"], 426.0, 0.12, 396, 272),
    ("cuda_graph_max_bs=64", ["cuda_graph_max_bs: 64"], 319.4, 0.016, 1411, 100),
    ("cuda_graph_max_bs=128", ["cuda_graph_max_bs: 128"], 319.5, 0.001, 1182, 100),
    ("mem_fraction_static=0.85", ["mem_fraction_static: 0.85"], 319.5, 0.001, 1742, 100),
    ("mem_fraction_static=0.95", ["mem_fraction_static: 0.95"], None, 0, 0, 0),
    (
        "max_running_requests=64 + cuda_graph_max_bs=64",
        ["max_running_requests: 64", "cuda_graph_max_bs: 64"],
        511.1,
        0.001,
        1205,
        126,
    ),
    (
        "max_running_requests=128 + cuda_graph_max_bs=128",
        ["max_running_requests: 128", "cuda_graph_max_bs: 128"],
        542.8,
        0.074,
        256,
        132,
    ),
]
NAMES = [name for name, *_ in TABLE]


def rows() -> list[Row]:
    made: list[Row] = []
    for name, lines, median, spread, ttft, itl in TABLE:
        if median is None:
            made.append(failed_row(name, lines, "failed", OOM))
            continue
        rounds = [round(median * (1 - spread), 2), median, round(median * (1 + spread), 2)]
        made.append(measured_row(name, lines, rounds, 64, ttft, itl))
    return made


def start(run: str, resumes: str | None = None) -> dict[str, Any]:
    return {
        "tune": run,
        "unit": UNIT,
        "event": "start",
        "candidates": NAMES,
        "budget_s": 7200,
        "plan": "5e" * 32,
        "resumes": resumes,
    }


def row(run: str, found: Row) -> dict[str, Any]:
    return {"tune": run, "unit": UNIT, **found}


def summary(run: str, measured: list[Row], old: bool = False) -> dict[str, Any]:
    chosen, said = proposal(measured)
    lines = chosen.get("lines") or [] if chosen is not None and chosen["name"] != "current" else []
    line: dict[str, Any] = {
        "tune": run,
        "unit": UNIT,
        "summary": said,
        "proposal": lines,
        "restored": True,
    }
    if old:  # 0.14.0's summary
        return line
    top = max(
        (r for r in compared(measured) if r.get("status") == "measured"),
        key=lambda r: float(r.get("output_tok_s") or 0),
    )
    base = measured[0]
    return {
        **line,
        "best": top["name"],
        "change": top.get("change"),
        "noise": max(float(top.get("noise") or 0), float(base.get("noise") or 0)),
        "beyond_noise": top.get("beyond_noise"),
    }


def fact_run(
    run: str,
    lines: list[dict[str, Any]],
    candidates: list[str],
    resumes: str | None = None,
    budget: float | None = 7200.0,
) -> dict[str, Any]:
    """The TuneRun the case's lines say, written out by hand from them."""
    read_rows = [
        {
            "name": x["name"],
            "status": x["status"],
            "output_tok_s": x.get("output_tok_s"),
            "noise": x.get("noise"),
            "why": x.get("why"),
            "kept_from": x.get("kept_from"),
        }
        for x in lines
        if "name" in x
    ]
    last = next((x for x in lines if "summary" in x), None)
    return {
        "id": run,
        "unit": UNIT,
        "candidates": candidates,
        "budget_s": budget if candidates else None,
        "resumes": resumes,
        "rows": read_rows,
        "summary": None
        if last is None
        else {
            "text": last["summary"],
            "proposal": last["proposal"],
            "restored": last["restored"],
            "best": last.get("best"),
            "change": last.get("change"),
            "noise": last.get("noise"),
            "beyond_noise": last.get("beyond_noise"),
        },
    }


def state(pid: int) -> dict[str, str]:
    """programs/tune.py write_state's file."""
    return {
        "unit": UNIT,
        "unit_path": f"/etc/systemd/system/{UNIT}",
        "saved": "/var/lib/sglang-deploy/tune.state.unit",
        "candidate_sha256": "c4" * 32,
        "pid": str(pid),
    }


def run_command(records: list[str], state_text: str | None, live: bool) -> list[str]:
    """TuneRecords' command on the case's files; with `live`, the state names a running
    tune.py (started here) and the command sees it."""
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        (where / "tune.jsonl").write_text("".join(f"{x}\n" for x in records))
        program = where / "tune.py"
        program.write_text("import time\ntime.sleep(60)\n")
        proc = subprocess.Popen([sys.executable, str(program)]) if live else None
        try:
            if state_text is not None:
                pid = proc.pid if proc is not None else 999999
                (where / "tune.state").write_text(state_text.replace("PID", str(pid)) + "\n")
            command = TuneRecords().command(str(where / "tune.jsonl"), str(where / "tune.state"))
            out = subprocess.run(
                ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
            ).stdout
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    return out.splitlines()


def case(
    name: str,
    comment: str,
    lines: Sequence[dict[str, Any] | str],
    fact: dict[str, Any],
    state_file: bool = False,
    live: bool = False,
) -> list[str]:
    records = [x if isinstance(x, str) else json.dumps(x) for x in lines]
    state_text = json.dumps({**state(0), "pid": "PID"}) if state_file else None
    output = run_command(records, state_text, live)
    pid = next((int(x.split()[1]) for x in output if x.startswith("live ")), None)
    if state_file:
        fact["state"] = {"unit": UNIT, "pid": pid if live else 999999, "live": live}
    document = {
        "_comment": comment + " (composed: scripts/compose_tune_records.py; run it again)",
        "arg": {},
        "command": get_command_string(StringCommand(TuneRecords().command())),
        "output": output,
        "fact": {"run": None, "state": None, "notes": [], **fact},
    }
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
    return output


def main() -> int:
    made = rows()
    old_run = [row(OLD, r) for r in made[:3]]
    old_summary = summary(OLD, made[:3], old=True)
    finished = [start(RUN), *(row(RUN, r) for r in made), summary(RUN, made)]
    shown = case(
        "finished",
        "a finished tune after a 0.14.0 one: only the last run counts; its best beyond the noise",
        [*old_run, old_summary, *finished],
        {"run": fact_run(RUN, finished[1:], NAMES)},
    )
    SIMULATED.write_text("".join(f"{x}\n" for x in shown))
    keep = [start(RUN), *(row(RUN, r) for r in made[:1] + made[3:6])]
    keep_rows = made[:1] + made[3:6]
    keep_end = summary(RUN, keep_rows)
    keep[0]["candidates"] = [r["name"] for r in keep_rows]
    case(
        "kept",
        "a finished tune whose best (cuda_graph_max_bs=128, +0.0%) is within the noise: keep",
        [*keep, keep_end],
        {"run": fact_run(RUN, [*keep[1:], keep_end], keep[0]["candidates"])},
    )
    part = [start(RUN), *(row(RUN, r) for r in made[:3])]
    case(
        "running",
        "a tune running now: its state names a live tune.py; 3 of 9 candidates recorded",
        part,
        {"run": fact_run(RUN, part[1:], NAMES)},
        state_file=True,
        live=True,
    )
    case(
        "cut-off",
        "a tune killed (SIGKILL) while a candidate ran: its state is left, no pid is a tune",
        part,
        {"run": fact_run(RUN, part[1:], NAMES)},
        state_file=True,
    )
    resumed = [start(RUN, OLD), *({**row(RUN, r), "kept_from": OLD} for r in made[:2])]
    case(
        "resumed-running",
        "a rerun resuming a cut-off run: its first two rows reused (kept_from), none measured yet",
        [*old_run, *resumed],
        {"run": fact_run(RUN, resumed[1:], NAMES, resumes=OLD)},
        state_file=True,
        live=True,
    )
    case(
        "v0.14.0",
        "0.14.0's records: no start line, a summary of summary, proposal and restored only",
        [*old_run, old_summary],
        {"run": fact_run(OLD, [*old_run, old_summary], [])},
    )
    case(
        "v0.14.0-cut-off",
        "0.14.0's records of a run cut off after two rows (its state file already removed)",
        old_run[:2],
        {"run": fact_run(OLD, old_run[:2], [])},
    )
    torn = json.dumps(row(RUN, made[3]))[:70]
    case(
        "torn-line",
        "a tune killed while it wrote a row: the torn line is one note, the run still read",
        [*part, torn],
        {
            "run": fact_run(RUN, part[1:], NAMES),
            "notes": [
                "/var/lib/sglang-deploy/tune.jsonl: a line not read (not a tune record): "
                f"{torn[:60]!r}"
            ],
        },
        state_file=True,
    )
    case(
        "state-only",
        "a tune cut off before its first record: only its state file is there",
        [],
        {},
        state_file=True,
    )
    case("none", "a host never tuned", [], {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
