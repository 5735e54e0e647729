"""A rank's start, phase by phase, read from its own journal since that start: the one reader of
start-up phases, for the health wait (wait_healthy.py), the status probe (serving_probe.py) and,
imported on the controller, the status command and bench/roll_bench.py.

The lines are the release's own words: the plan hands over, per phase, the regexes of the
release's start-up file (operations/kb/knowledge/startup/sglang-<v>.json, loaded by
operations/kb/startup.py) as JSON, `{"weight_load_end": ["Load\\ weight\\ end...", ...]}`; a
regex with a `seconds` group gives that phase's own duration.

What a start is made of, as the log tells it:
- weights: the weight line's own seconds (`Load weight end. elapsed=...`);
- graphs: the sum of every capture line's own seconds (`Capture ... end. ... elapsed=...`);
- warm-up: from the last capture line to the ready line (no line marks the warm-up's start:
  SGLang warms up with a request once the HTTP server is up, then logs the ready line);
- healthy: from the unit's start (systemd's ExecMainStartTimestamp) to the ready line.
The journal is read as `journalctl -o short-unix` prints it: `EPOCH.USEC HOST IDENT[PID]: TEXT`.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import TypedDict

# Journal lines shown before the last phase line of a start that failed (and all after it).
LINES_BEFORE = 5
LINES_AFTER = 30
READY = "ready"
WEIGHTS_END = "weight_load_end"
GRAPH_END = "graph_capture_end"
GRAPH_BEGIN = "graph_capture_begin"
SHOW = (
    "systemctl",
    "show",
    "--timestamp=unix",
    "-p",
    "InvocationID",
    "-p",
    "ExecMainStartTimestamp",
)
JOURNAL = ("-o", "short-unix", "--no-pager", "-q")
AUTOTUNE = ("flashinfer_autotune_begin", "flashinfer_autotune_end")


class StartupPhases(TypedDict):
    started_at: float | None  # the unit's start, epoch seconds
    last_phase: str | None  # the last phase line seen
    last_at: float | None  # its time, seconds after the start
    healthy_s: float | None  # start -> the ready line
    weights_s: float | None
    graphs_s: float | None
    graphs: int  # capture lines
    warmup_s: float | None  # the last capture line -> the ready line
    autotune_s: float | None  # FlashInfer's autotune, begin -> end lines


Patterns = dict[str, list["re.Pattern[str]"]]


def compile_patterns(text: str) -> Patterns:
    """The plan's JSON of phase -> regexes."""
    raw = json.loads(text) if text else {}
    return {phase: [re.compile(r) for r in regexes] for phase, regexes in raw.items()}


def split_line(line: str) -> tuple[float | None, str]:
    """(epoch seconds, the message) of a `short-unix` journal line; (None, line) otherwise."""
    stamp, _, rest = line.partition(" ")
    try:
        when = float(stamp)
    except ValueError:
        return None, line
    _host, _, rest = rest.partition(" ")
    _ident, sep, message = rest.partition(": ")
    return when, message if sep else rest


def _match(patterns: Patterns, message: str) -> tuple[str, float | None] | None:
    for phase, regexes in patterns.items():
        for regex in regexes:
            m = regex.search(message)
            if m is not None:
                seconds = m.groupdict().get("seconds")
                return phase, float(seconds) if seconds is not None else None
    return None


def read_phases(
    started_at: float | None, lines: list[str], patterns: Patterns
) -> tuple[StartupPhases, int | None]:
    """The phases of one start, and the index of its last phase line (None: none)."""
    found = StartupPhases(
        started_at=started_at,
        last_phase=None,
        last_at=None,
        healthy_s=None,
        weights_s=None,
        graphs_s=None,
        graphs=0,
        warmup_s=None,
        autotune_s=None,
    )
    last_index: int | None = None
    graph_end_at: float | None = None
    autotune_begin: float | None = None
    for i, line in enumerate(lines):
        when, message = split_line(line)
        hit = _match(patterns, message)
        if hit is None:
            continue
        phase, seconds = hit
        last_index = i
        found["last_phase"] = phase
        if when is not None and started_at is not None:
            found["last_at"] = round(when - started_at, 3)
        if phase == WEIGHTS_END and seconds is not None:
            found["weights_s"] = round((found["weights_s"] or 0.0) + seconds, 3)
        elif phase == GRAPH_END:
            found["graphs"] += 1
            graph_end_at = when
            if seconds is not None:
                found["graphs_s"] = round((found["graphs_s"] or 0.0) + seconds, 3)
        elif phase == AUTOTUNE[0]:
            autotune_begin = when
        elif phase == AUTOTUNE[1] and when is not None and autotune_begin is not None:
            found["autotune_s"] = round(when - autotune_begin, 3)
        elif phase == READY and when is not None:
            if started_at is not None:
                found["healthy_s"] = round(when - started_at, 3)
            if graph_end_at is not None:
                found["warmup_s"] = round(when - graph_end_at, 3)
    return found, last_index


def around(lines: list[str], index: int | None) -> list[str]:
    """The lines around the last phase line: LINES_BEFORE before it, up to LINES_AFTER after
    (the last LINES_AFTER lines when no phase line came)."""
    if index is None:
        return lines[-LINES_AFTER:]
    return lines[max(index - LINES_BEFORE, 0) : index + LINES_AFTER + 1]


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def summary(p: StartupPhases) -> str:
    """One line: `healthy 95.2 s: weights 4.6 s, graphs 12.0 s (3), warm-up 2.1 s`."""
    if p["healthy_s"] is None:
        at = f" at {p['last_at']:.1f} s" if p["last_at"] is not None else ""
        head = f"starting, last phase {p['last_phase'] or 'none logged'}{at}"
    else:
        head = f"healthy {_seconds(p['healthy_s'])}"
    parts = [
        f"weights {_seconds(p['weights_s'])}",
        f"graphs {_seconds(p['graphs_s'])} ({p['graphs']})",
        f"warm-up {_seconds(p['warmup_s'])}",
    ]
    if p["autotune_s"] is not None:
        parts.append(f"FlashInfer autotune {_seconds(p['autotune_s'])}")
    return f"{head}: {', '.join(parts)}"


# ---- on the host --------------------------------------------------------------------------


def unit_start(unit: str) -> tuple[str | None, float | None]:
    """(its invocation id, its main process's start in epoch seconds), as systemd says."""
    out = subprocess.run(
        [*SHOW, unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    stamp = values.get("ExecMainStartTimestamp", "").lstrip("@")
    try:
        started = float(stamp) if stamp else None
    except ValueError:
        started = None
    return values.get("InvocationID") or None, started


def journal_of_start(unit: str) -> tuple[float | None, list[str]]:
    """The unit's start and its journal since then (this invocation's lines only)."""
    invocation, started = unit_start(unit)
    if invocation is None:
        return started, []
    out = subprocess.run(
        ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", *JOURNAL],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return started, out.splitlines()


def rank_phases(unit: str, patterns: Patterns) -> tuple[StartupPhases, list[str]]:
    """The unit's start read from its journal, and the lines around its last phase."""
    started, lines = journal_of_start(unit)
    phases, index = read_phases(started, lines, patterns)
    return phases, around(lines, index)
