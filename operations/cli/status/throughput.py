"""`status`'s throughput line: the host's last throughput record and the one before it of the
same workload (programs/throughput_guard.previous), how much faster or slower, host and per
rank output tok/s, and whether the last check did not pass (the host's pending marker: the next
deploy checks again) (docs/how-to/read-throughput-and-verdicts.md "Throughput")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from operations.programs.throughput_guard import Record, describe, previous


class RecordsJson(TypedDict):
    last: Record | None
    before: Record | None
    ratio: float | None
    pending: bool


@dataclass(frozen=True)
class ThroughputView:
    last: Record | None = None
    before: Record | None = None
    # A check started and did not pass (failed or cut off): the next deploy runs it again.
    pending: bool = False

    @classmethod
    def of(cls, records: list[Record], pending: bool = False) -> ThroughputView:
        if not records:
            return cls(pending=pending)
        last = records[-1]
        return cls(last, previous(records[:-1], last), pending)

    @property
    def ratio(self) -> float | None:
        if self.last is None or self.before is None:
            return None
        before = float(self.before.get("output_tok_s") or 0)
        return float(self.last.get("output_tok_s") or 0) / before if before > 0 else None

    def lines(self) -> list[str]:
        again = (
            ["  the last check did not pass (failed or cut off): the next deploy checks again"]
            if self.pending
            else []
        )
        if self.last is None:
            return ["  throughput: no record on this host (the deploy's check has not run)", *again]
        last = self.last
        ranks = ", ".join(
            f"{name} {float(r.get('output_tok_s') or 0):.0f}"
            for name, r in sorted((last.get("per_rank") or {}).items())
        )
        lines = [f"  throughput: {describe(last)}; per rank (output tok/s): {ranks or '-'}"]
        if self.before is None:
            lines.append("  before it: no earlier record of this workload")
        else:
            ratio = self.ratio
            change = "" if ratio is None else f" ({(ratio - 1) * 100:+.1f}% now)"
            lines.append(f"  before it: {describe(self.before)}{change}")
        return [*lines, *again]

    def to_json(self) -> RecordsJson:
        return {
            "last": self.last,
            "before": self.before,
            "ratio": self.ratio,
            "pending": self.pending,
        }
