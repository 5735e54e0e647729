"""`status`'s tune line: the host's last tune (facts/tune.py, read in the status fact's one
command): a finished one's proposal and the group_data lines that apply it (and whether the
inventory's settings already have them), a running one's progress, or a cut-off one and what
picks it up (docs/how-to/tune.md "Applying it", "If a tune is cut off"). Nothing when the host
was never tuned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypedDict

from operations import layout
from operations.facts.tune import LastTune, Phase, TuneRun, TuneSummary
from operations.plan.tune_plan import differs
from operations.settings import Settings

RESUME = "`python -m operations.tune INVENTORY`"


class TuneJson(TypedDict):
    """`status --json`'s "tune" of a host (null: never tuned)."""

    phase: Phase | None  # finished, running, cut_off; None: only notes
    id: str | None  # the run: its UTC start time
    unit: str | None  # the rank's unit it measured on
    rank: int | None
    candidates: int | None  # how many the run has (None: not known, a 0.14.0 run cut off)
    done: int  # candidates with a row
    resumes: str | None  # the cut-off run it resumes
    pid: int | None  # a running tune's
    # The state file is there: the rank may be on a candidate's unit until a tune or a deploy.
    state_file: bool
    summary: str | None  # a finished run's sentence
    best: str | None
    change: float | None  # the best's change against the current settings (0.1: +10%)
    noise: float | None
    beyond_noise: bool | None
    proposal: list[str]  # group_data lines ([]: keep the current settings, or no proposal)
    restored: bool | None  # a finished run put the rank back on its own unit
    applied: bool | None  # the inventory's settings already have the proposal (None: no proposal)
    notes: list[str]  # what was not read


def settings_have(proposal: tuple[str, ...], settings: Settings | None) -> bool | None:
    """Whether every group_data line of the proposal ("max_running_requests: 128", written by
    plan/tune_plan.line) is what the settings hold; None: no proposal, no settings, or a line
    that names no setting."""
    if not proposal or settings is None:
        return None
    for entry in proposal:
        key, sep, text = entry.partition(": ")
        if not sep or not hasattr(settings, key):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if differs(settings, key, value):
            return False
    return True


def _verdict(summary: TuneSummary) -> str:
    """The proposal in a few words: the best and its change against the current settings and
    the noise, or keep the current settings; a 0.14.0 summary (no best) by its own sentence."""
    best, change, noise = summary.best, summary.change, summary.noise
    if best is None or change is None:
        said = summary.text.removeprefix("tune: ").split("; put these lines", 1)[0]
        return said.rstrip(":").strip()
    within = "beyond" if summary.beyond_noise else "within"
    of = f" ({noise:.1%})" if noise is not None else ""
    if summary.proposal:
        return f"best {best}, {change:+.1%} against the current settings, {within} the noise{of}"
    if best == "current":
        return "keep the current settings: no candidate was faster" + (
            f" (noise {noise:.1%})" if noise is not None else ""
        )
    return f"keep the current settings (best {best}, {change:+.1%}, {within} the noise{of})"


def _rank(unit: str | None) -> str:
    rank = layout.rank_of(unit) if unit else None
    return f"rank {rank}" if rank is not None else (unit or "rank ?")


def _count(run: TuneRun) -> str:
    total = run.total
    return f"{run.done} of {total} candidates" if total is not None else f"{run.done} candidates"


@dataclass(frozen=True)
class TuneView:
    last: LastTune
    # The inventory's settings already have the finished run's proposal (None: no proposal).
    applied: bool | None = None

    @classmethod
    def of(cls, last: LastTune, settings: Settings | None = None) -> TuneView:
        run = last.current
        summary = run.summary if run is not None else None
        proposal = summary.proposal if summary is not None else ()
        return cls(last, settings_have(proposal, settings))

    def _unit(self) -> str | None:
        run, state = self.last.current, self.last.state
        if run is not None and run.unit:
            return run.unit
        return state.unit if state is not None else None

    def lines(self) -> list[str]:
        """Nothing when the host was never tuned."""
        last = self.last
        run, state = last.current, last.state
        lines = [f"  tune records not read: {note}" for note in last.notes]
        where = _rank(self._unit())
        if last.phase == "running":
            pid = state.pid if state is not None else None
            since = f" since {run.id}" if run is not None else ""
            done = f"{_count(run)} done" if run is not None else "no candidate recorded yet"
            lines.append(f"  tune: running on {where}{since} (pid {pid}): {done}")
        elif last.phase == "finished" and run is not None and run.summary is not None:
            summary = run.summary
            lines.append(f"  tune: {run.id} on {where}: {_verdict(summary)}")
            if summary.proposal:
                said = "; ".join(summary.proposal)
                if self.applied:
                    lines.append(f"  the inventory's settings already have them: {said}")
                else:
                    lines.append(f"  to apply, put in the host's group_data and deploy: {said}")
            if not summary.restored:
                lines.append(
                    f"  the tune could NOT put {where} back on its own unit: the next tune or "
                    "deploy does"
                )
        elif last.phase == "cut_off":
            after = (
                f"after {_count(run)}"
                if run is not None and run.done
                else "before its first candidate"
            )
            started = f", started {run.id}" if run is not None else ""
            back = "; the next tune or deploy puts the rank back" if state is not None else ""
            lines.append(f"  tune: cut off {after} ({where}{started}){back}; {RESUME} resumes")
        return lines

    def to_json(self) -> TuneJson | None:
        last = self.last
        if last.phase is None and not last.notes:
            return None
        run, state = last.current, last.state
        summary = run.summary if run is not None else None
        unit = self._unit()
        return {
            "phase": last.phase,
            "id": run.id if run is not None else None,
            "unit": unit,
            "rank": layout.rank_of(unit) if unit else None,
            "candidates": run.total if run is not None else None,
            "done": run.done if run is not None else 0,
            "resumes": run.resumes if run is not None else None,
            "pid": state.pid if state is not None and state.live else None,
            "state_file": state is not None,
            "summary": summary.text if summary is not None else None,
            "best": summary.best if summary is not None else None,
            "change": summary.change if summary is not None else None,
            "noise": summary.noise if summary is not None else None,
            "beyond_noise": summary.beyond_noise if summary is not None else None,
            "proposal": list(summary.proposal) if summary is not None else [],
            "restored": summary.restored if summary is not None else None,
            "applied": self.applied,
            "notes": list(last.notes),
        }
