"""`status`'s canary lines: the host's last canary verdict (facts/canary.py, read in the status
fact's one command), which ranks it names, what they run now, and whether the host is mixed:
ranks whose command lines differ beyond their port (a canary paused, or a run cut off before
it promoted or rolled back). What the next deploy does with each is the canary plan's
(plan/canary_plan.py); these lines only say it (docs/how-to/upgrade-with-canary.md "A canary
first")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from operations.facts.canary import Canary, CanaryRecord
from operations.facts.serve import UnitState
from operations.plan.canary_plan import command_words

# Rows shown per failed verdict (each is one line); a verdict has four.
ROWS_SHOWN = 4


class CanaryStatusJson(TypedDict):
    """`status --json`'s "canary" of a host."""

    record: dict[str, object] | None  # asdict(CanaryRecord): the last verdict
    problem: str | None  # why the record on the host was not read or not trusted
    canary_ranks: list[int]  # the ranks the last verdict judged
    mixed: bool  # the counted ranks run more than one command line (beyond their port)
    groups: list[dict[str, object]]  # each command line's ranks and engine


@dataclass(frozen=True)
class Group:
    """Ranks that run one command line (their port aside), and its engine environment."""

    ranks: tuple[int, ...]
    engine: str | None


def _signature(unit: UnitState | None) -> tuple[str, ...]:
    """A rank's command line as the canary compares it (canary_plan.command_words), its port
    left out: the one word that differs between ranks of one deploy."""
    words = command_words(unit.argv()) if unit is not None else []
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--port":
            skip = True
            continue
        out.append(word)
    return tuple(out)


def groups(units: Mapping[int, UnitState], ranks: list[int]) -> list[Group]:
    """The counted ranks by command line, the largest group first (then the lowest rank)."""
    found: dict[tuple[str, ...], list[int]] = {}
    for rank in ranks:
        unit = units.get(rank)
        if unit is None or not unit.exists:
            continue
        found.setdefault(_signature(unit), []).append(rank)
    engines = {
        rank: (u.engine_env() or "").rstrip("/").rsplit("/", 1)[-1] for rank, u in units.items()
    }
    made = [Group(tuple(r), engines.get(r[0]) or None) for r in found.values()]
    return sorted(made, key=lambda g: (-len(g.ranks), g.ranks))


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


@dataclass(frozen=True)
class CanaryView:
    record: CanaryRecord | None = None
    problem: str | None = None
    parts: list[Group] = field(default_factory=list)

    @classmethod
    def of(cls, canary: Canary, units: Mapping[int, UnitState], ranks: list[int]) -> CanaryView:
        return cls(canary.record, canary.problem, groups(units, ranks))

    @property
    def mixed(self) -> bool:
        return len(self.parts) > 1

    def _where(self) -> str:
        return "; ".join(f"{_ranks(g.ranks)} on {g.engine or '?'}" for g in self.parts)

    def _verdict(self, record: CanaryRecord) -> str:
        judged = f"{_ranks(record.canary_ranks)} on {record.engine}"
        against = "" if record.baseline_rank is None else f" against rank {record.baseline_rank}"
        word = "passed" if record.ok else "FAILED"
        return f"canary: last verdict {word} ({judged}{against}, {record.at})"

    def lines(self) -> list[str]:
        """Nothing when no verdict was ever recorded and every rank runs one command line."""
        lines: list[str] = []
        if self.problem is not None:
            lines.append(f"  canary record not read: {self.problem}")
        record = self.record
        if record is None:
            if self.mixed:
                lines.append(
                    f"  the ranks run different command lines ({self._where()}) and no canary "
                    "verdict names them: a deploy was cut off; the next deploy converges them"
                )
            return lines
        head = "  " + self._verdict(record)
        if record.ok and not self.mixed:
            lines.append(f"{head}: every rank runs one command line ({self._where()})")
        elif record.ok and record.paused:
            lines.append(
                f"{head}; paused: {self._where()}; the next deploy with rollout.pause false "
                "promotes the rest"
            )
        elif record.ok:
            lines.append(f"{head}; not promoted yet ({self._where()}): the next deploy promotes")
        else:
            if record.rolled_back and not self.mixed:
                lines.append(f"{head}; rolled back: {self._where()}")
            else:
                lines.append(
                    f"{head}; not rolled back yet ({self._where()}): the next deploy rolls "
                    f"{_ranks(record.canary_ranks)} back"
                )
            lines.append(
                "  a deploy of the same ranks' command line is refused; change it (or the "
                "release) to try again, or judge it again on purpose: --data "
                f"canary_judge_again={record.at}"
            )
            for row in record.failed_rows()[:ROWS_SHOWN]:
                lines.append(
                    f"    {row.check}: canary {row.canary}, baseline {row.baseline} "
                    f"(threshold {row.threshold})"
                )
        return lines

    def to_json(self) -> CanaryStatusJson:
        return {
            "record": asdict(self.record) if self.record is not None else None,
            "problem": self.problem,
            "canary_ranks": list(self.record.canary_ranks) if self.record is not None else [],
            "mixed": self.mixed,
            "groups": [{"ranks": list(g.ranks), "engine": g.engine} for g in self.parts],
        }
