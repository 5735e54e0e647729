"""The last tune on a host (`python -m operations.tune`, programs/tune.py, docs/how-to/tune.md):
its records (layout.TUNE_RECORDS, one JSON line each, the file's last RECORDS_READ lines) and
its state file while a candidate runs (layout.TUNE_STATE), with whether the pid it names is
still a tune. `status` reads them in its one round trip (facts/serve_status.py, each line
prefixed "tune "); `parse_tune` judges them (pure, pinned by tests/facts/tune.TuneRecords/).

The records, each naming its run (`"tune"`: the run's UTC start time) and the rank's unit:

    {"tune": ID, "unit": U, "event": "start", "candidates": [NAME, ...], "budget_s": S,
     "plan": HEX, "resumes": null | OLD_ID}                       # first, since 0.15.0
    {"tune": ID, "unit": U, "name": NAME, "lines": [...], "status": "measured" | "failed"
     | "skipped", "why": ..., "output_tok_s": F, "noise": F, ..., "kept_from": OLD_ID}
    {"tune": ID, "unit": U, "summary": SENTENCE, "proposal": [LINE, ...], "restored": B,
     "best": NAME | null, "change": F | null, "noise": F | null, "beyond_noise": B | null}

A row per candidate as it is known (programs/tune_table.py Row), the summary last. 0.14.0
wrote no start line and a summary of summary, proposal and restored only: its candidates are
counted from its rows. The state file (programs/tune.py write_state): {"unit", "unit_path",
"saved", "candidate_sha256", "pid"}; it exists from before the rank leaves the router until
the rank is back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout

# A tune writes a start line, a row per candidate (16 by default: 15 candidates and the
# current settings measured again) and a summary: the last run's lines, and the end of the one
# before it, fit.
RECORDS_READ = 48
# A row is well under 2 KiB (a failure's journal line is the longest part); a longer line is
# cut, then read as unreadable: at most RECORDS_READ x LINE_BYTES travel.
LINE_BYTES = 8192
STATE_BYTES = 4096

RowStatus = Literal["measured", "failed", "skipped"]
Phase = Literal["finished", "running", "cut_off"]
_STATUSES: tuple[RowStatus, ...] = ("measured", "failed", "skipped")


@dataclass(frozen=True)
class TuneRow:
    """One candidate's outcome as the run recorded it."""

    name: str
    status: RowStatus
    output_tok_s: float | None = None
    noise: float | None = None
    why: str | None = None
    # The cut-off run it was measured in, when this run reused it (a resumed tune).
    kept_from: str | None = None


@dataclass(frozen=True)
class TuneSummary:
    """The run's last line: its sentence, the group_data lines it proposes ([] to keep the
    current settings, or no proposal), whether the rank is back on its own unit, and (since
    0.15.0) the best candidate, its change against the current settings and the noise."""

    text: str
    proposal: tuple[str, ...] = ()
    restored: bool = True
    best: str | None = None
    change: float | None = None
    noise: float | None = None
    beyond_noise: bool | None = None


@dataclass(frozen=True)
class TuneRun:
    """The last run in the records: `candidates` from its start line (() when it has none, as
    0.14.0 wrote), its rows in order (one per candidate name: the last line of a name wins), its
    summary (None: it did not finish)."""

    id: str
    unit: str
    candidates: tuple[str, ...] = ()
    budget_s: float | None = None
    resumes: str | None = None
    rows: tuple[TuneRow, ...] = ()
    summary: TuneSummary | None = None

    @property
    def rank(self) -> int | None:
        return layout.rank_of(self.unit)

    @property
    def done(self) -> int:
        return len(self.rows)

    @property
    def total(self) -> int | None:
        """How many candidates the run has: its start line's, else (0.14.0) the rows of a
        finished run; None: not known."""
        if self.candidates:
            return len(self.candidates)
        return len(self.rows) if self.summary is not None else None


@dataclass(frozen=True)
class TuneState:
    """The state file: the rank's unit under test, the tune's pid, and whether that pid is a
    live tune now (its /proc/PID/cmdline names tune.py)."""

    unit: str | None
    pid: int | None
    live: bool


@dataclass(frozen=True)
class LastTune:
    """The last run (None: no record), the state file (None: none), and what could not be read,
    one short line each."""

    run: TuneRun | None = None
    state: TuneState | None = None
    notes: tuple[str, ...] = ()

    @property
    def phase(self) -> Phase | None:
        """running: the state's pid is a tune; cut off: a state no tune holds, or a last run
        without its summary; finished: its summary is there (a summary that says the rank was
        not put back leaves the state file); None: no tune ever."""
        state, run = self.state, self.run
        if state is not None and state.live:
            return "running"
        # A state file beside a summary that says the rank is back is a later run's, cut off
        # before its first record.
        summary = run.summary if run is not None else None
        if summary is not None and (state is None or not summary.restored):
            return "finished"
        if run is not None or state is not None:
            return "cut_off"
        return None

    @property
    def current(self) -> TuneRun | None:
        """The run the phase is about: None when a running or cut-off tune has no record yet
        (the last run in the records is an earlier, finished one)."""
        run = self.run
        if run is None or (run.summary is not None and self.phase != "finished"):
            return None
        return run


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in value) if isinstance(value, list) else ()


def _row(found: dict[str, Any]) -> TuneRow | None:
    name, status = found.get("name"), found.get("status")
    if not isinstance(name, str) or status not in _STATUSES:
        return None
    return TuneRow(
        name=name,
        status=status,
        output_tok_s=_float(found.get("output_tok_s")),
        noise=_float(found.get("noise")),
        why=_str(found.get("why")),
        kept_from=_str(found.get("kept_from")),
    )


def _summary(found: dict[str, Any]) -> TuneSummary:
    beyond = found.get("beyond_noise")
    return TuneSummary(
        text=str(found["summary"]),
        proposal=_strings(found.get("proposal")),
        restored=found.get("restored") is not False,
        best=_str(found.get("best")),
        change=_float(found.get("change")),
        noise=_float(found.get("noise")),
        beyond_noise=beyond if isinstance(beyond, bool) else None,
    )


def parse_run(records: list[str]) -> tuple[TuneRun | None, list[str]]:
    """The last run among the records' lines (the run of the last line that names one), and
    the lines that were not a record (each quoted short)."""
    read: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in records:
        try:
            found = json.loads(line)
        except ValueError:
            found = None
        if isinstance(found, dict) and isinstance(found.get("tune"), str):
            read.append(found)
        elif line.strip():
            bad.append(line)
    if not read:
        return None, bad
    last = read[-1]["tune"]
    mine = [r for r in read if r["tune"] == last]
    start = next((r for r in mine if r.get("event") == "start"), None)
    rows: dict[str, TuneRow] = {}
    summary: TuneSummary | None = None
    for found in mine:
        if isinstance(found.get("summary"), str):
            summary = _summary(found)
        elif found.get("event") is None:
            row = _row(found)
            if row is None:
                bad.append(json.dumps(found)[:80])
            else:
                rows.pop(row.name, None)
                rows[row.name] = row
    unit = next((u for r in mine if isinstance(u := r.get("unit"), str)), "")
    return (
        TuneRun(
            id=last,
            unit=unit,
            candidates=_strings(start.get("candidates")) if start else (),
            budget_s=_float(start.get("budget_s")) if start else None,
            resumes=_str(start.get("resumes")) if start else None,
            rows=tuple(rows.values()),
            summary=summary,
        ),
        bad,
    )


def parse_state(text: str, live: bool) -> TuneState | str:
    """The state file's text, or why it is not one."""
    try:
        found = json.loads(text)
    except ValueError:
        return f"{layout.TUNE_STATE} is not JSON: {text[:60]!r}"
    if not isinstance(found, dict):
        return f"{layout.TUNE_STATE} is not a JSON object: {text[:60]!r}"
    pid = found.get("pid")
    if isinstance(pid, str) and pid.isdigit():
        pid = int(pid)
    return TuneState(
        unit=_str(found.get("unit")),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        live=live,
    )


def parse_tune(lines: list[str]) -> LastTune:
    """The fact's lines: "record JSON" per line of the records (the last RECORDS_READ), then
    "state JSON" when the state file is a regular file, "live PID" when that pid is a tune,
    "end"."""
    records: list[str] = []
    state_text: str | None = None
    live = False
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "record":
            records.append(rest)
        elif word == "state":
            state_text = rest
        elif word == "live":
            live = True
    run, bad = parse_run(records)
    notes: list[str] = []
    if bad:
        many = f"{len(bad)} lines" if len(bad) > 1 else "a line"
        notes.append(f"{layout.TUNE_RECORDS}: {many} not read (not a tune record): {bad[0][:60]!r}")
    state: TuneState | None = None
    if state_text is not None:
        parsed = parse_state(state_text, live)
        if isinstance(parsed, str):
            notes.append(parsed)
            state = TuneState(unit=None, pid=None, live=live)
        else:
            state = parsed
    return LastTune(run=run, state=state, notes=tuple(notes))


# The records' last lines (each cut at LINE_BYTES), then the state file when it is a regular
# file (a link is not read) and whether its pid is a tune, as programs/tune.py still_tuning
# asks: a word of /proc/PID/cmdline whose base name is tune.py.
_SCRIPT = " ".join(
    (
        f'tail -n {RECORDS_READ} -- "$f" 2>/dev/null | cut -c -{LINE_BYTES} |',
        "sed 's/^/record /';",
        'if [ -f "$s" ] && [ ! -L "$s" ]; then',
        f't=$(head -c {STATE_BYTES} -- "$s" | tr -d \'\\n\'); echo "state $t";',
        'p=$(printf \'%s\' "$t" | sed -n \'s/.*"pid": *"\\{0,1\\}\\([0-9][0-9]*\\).*/\\1/p\');',
        "if [ -n \"$p\" ] && tr '\\0' '\\n' 2>/dev/null < \"/proc/$p/cmdline\" |",
        "grep -q '\\(^\\|/\\)tune\\.py$'; then echo \"live $p\"; fi;",
        "fi;",
        "echo end",
    )
)


def tune_words(
    records: str = layout.TUNE_RECORDS, state: str = layout.TUNE_STATE
) -> list[str | QuoteString]:
    """The fact's shell words, joined with no separator (the status fact runs them too, each
    line prefixed, operations/facts/serve_status.py)."""
    return ["f=", QuoteString(records), "; s=", QuoteString(state), "; " + _SCRIPT]


class TuneRecords(FactBase[LastTune]):
    """
    Returns the host's last tune: its run as recorded, the state file while one runs or after
    one was cut off, and what could not be read.

    .. code:: python

        LastTune(
            run=TuneRun(id="2026-12-07T08:00:00Z", unit="sglang@7.service",
                        candidates=("current", ...), rows=(TuneRow(...), ...),
                        summary=TuneSummary(text="tune: best ...", proposal=(...), ...)),
            state=None,
            notes=(),
        )

    + records: the tune's records (layout.TUNE_RECORDS)
    + state: its state file (layout.TUNE_STATE)
    """

    def command(
        self, records: str = layout.TUNE_RECORDS, state: str = layout.TUNE_STATE
    ) -> StringCommand:
        return StringCommand(*tune_words(records, state), _separator="")

    @staticmethod
    def default() -> LastTune:
        return LastTune()

    def process(self, output: list[str]) -> LastTune:
        return parse_tune(output)
