"""The throughput check's decisions, pure: records in, a verdict out (no file, no clock).

A record is one run of the benchmark client as programs/throughput.py writes it (one JSON line
of layout.THROUGHPUT_RECORDS). Two records measure the same thing when their `workload` (the
run's settings, the model copy's digest, the ranks count and whether it went through the
router) is equal: the release, the engine and the ranks' flags are what a run compares across.

- `previous`: the last record of the same workload that passed, or None (a first run: nothing
  to compare). A record whose `verdict` says `ok: false` (a slower run the guard failed, a rank
  starved through the router or unread, failed requests) is never the baseline, so a slower run
  is compared with the last good one again; a run passed with `throughput_guard: warn` has
  `ok: true` and is (that is how an operator accepts a new rate: warn once). A record without a
  `verdict` (written before it was kept) counts when it measured.
- `judge`: a run more than `max_slowdown` below that record's output tokens/s is slower; the
  ranks whose own output tokens/s fell by more than that are named. `guard` "fail" fails,
  "warn" passes with a warning.
- `starved`: through the router each rank must carry its share: a rank whose generated tokens
  are under MIN_SHARE of an even share (1/N of the run's) took (almost) no load.

Shared by the host program (which decides the run's exit) and the status command (which shows
the last record beside the one before it); stdlib only, as every file of this folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

# Under half of an even share through the router: the router is not spreading the load (a rank
# it does not list, or one whose requests all fail and are retried elsewhere).
MIN_SHARE = 0.5


class Workload(TypedDict):
    """What a run measures: its settings and what it runs on (plan/throughput_plan.workload)."""

    input_len: int
    output_len: int
    concurrency_per_rank: int
    prompts_per_rank: int
    model: str
    model_digest: str | None
    ranks: int
    through: str  # "router" or "ranks"


class Meta(TypedDict):
    """What the plan says of a run (the record's first fields)."""

    release: str
    engine: str
    model_digest: str | None
    flags_digest: str
    workload: Workload


class Percentiles(TypedDict):
    p50: float | None
    p99: float | None


class RankShare(TypedDict):
    """A rank's share of a run; each None when its /metrics could not be read after it."""

    generated: float | None  # sglang:generation_tokens_total, after minus before
    requests: float | None  # sglang:num_requests_total, after minus before
    output_tok_s: float | None


class Outcome(TypedDict):
    ok: bool
    ratio: float | None
    fell: list[str]


class Record(Meta, total=False):
    """One line of layout.THROUGHPUT_RECORDS (programs/throughput.py writes it)."""

    time: str
    ranks: int
    through: str
    prompts: int
    completed: int
    errors: int
    first_error: str | None
    duration_s: float
    output_tok_s: float
    total_tok_s: float
    per_rank: dict[str, RankShare]
    ttft_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    verdict: Outcome


def workload_key(record: Record) -> str:
    """What must match for two records to be compared (see the docstring)."""
    workload = record.get("workload") or {}
    return repr(sorted(workload.items()))


def previous(history: list[Record], current: Record) -> Record | None:
    """The last record of `history` (oldest first) with `current`'s workload that is a baseline
    (the docstring): a run whose requests failed measured nothing, and a run whose verdict
    failed (`"verdict": {"ok": false}`) is not what this host should serve at; neither is ever
    compared with. A warned run (ok true) and a record without a verdict are."""
    key = workload_key(current)
    found: Record | None = None
    for record in reversed(history):
        measured = int(record.get("errors") or 0) == 0 and bool(record.get("completed"))
        verdict = record.get("verdict")
        refused = isinstance(verdict, dict) and verdict.get("ok") is False
        if measured and not refused and workload_key(record) == key:
            found = record
            break
    return found


def starved(generated: dict[str, float], min_share: float = MIN_SHARE) -> list[str]:
    """The ranks (by name) whose generated tokens are under `min_share` of an even share."""
    total = sum(generated.values())
    if not generated or total <= 0:
        return sorted(generated)
    even = total / len(generated)
    return sorted(name for name, tokens in generated.items() if tokens < min_share * even)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    line: str
    previous: Record | None = None
    ratio: float | None = None
    fell: list[str] = field(default_factory=list)
    warning: bool = False


def describe(record: Record) -> str:
    """One record in a few words: when, which release and engine, output and total tok/s."""
    return (
        f"{record.get('time', '?')} sglang {record.get('release', '?')} "
        f"({record.get('engine', '?')}, flags {str(record.get('flags_digest', '?'))[:12]}): "
        f"{float(record.get('output_tok_s') or 0):.1f} output tok/s, "
        f"{float(record.get('total_tok_s') or 0):.1f} total"
    )


def _rank_rates(record: Record) -> dict[str, float]:
    """Each rank's output tok/s; a rank whose share is unknown (None) is left out."""
    ranks = record.get("per_rank") or {}
    return {
        name: float(rate)
        for name, r in ranks.items()
        if (rate := r.get("output_tok_s")) is not None
    }


def judge(
    current: Record,
    history: list[Record],
    max_slowdown: float,
    guard: str,
) -> Verdict:
    """The guard's verdict on `current` against the last record of its workload (see the
    docstring); `history` oldest first, without `current`."""
    if int(current.get("errors") or 0) > 0 or not current.get("completed"):
        return Verdict(
            False,
            f"throughput: {current.get('errors')} of {current.get('prompts')} requests failed "
            f"({current.get('first_error') or 'no request completed'})",
        )
    last = previous(history, current)
    now = float(current.get("output_tok_s") or 0)
    if last is None:
        return Verdict(
            True,
            f"throughput: {now:.1f} output tok/s; a first run of this workload on this host: "
            "nothing to compare",
        )
    before = float(last.get("output_tok_s") or 0)
    ratio = now / before if before > 0 else 1.0
    was, is_ = _rank_rates(last), _rank_rates(current)
    fell = sorted(
        name
        for name, rate in is_.items()
        if was.get(name, 0) > 0 and rate < (1 - max_slowdown) * was[name]
    )
    change = f"{(ratio - 1) * 100:+.1f}%"
    if ratio >= 1 - max_slowdown:
        return Verdict(
            True,
            f"throughput: {now:.1f} output tok/s, {change} against the last record",
            last,
            ratio,
        )
    line = (
        f"throughput: {now:.1f} output tok/s is {change} against the last record of this "
        f"workload, past throughput_max_slowdown {max_slowdown:g} (ratio {ratio:.3f}); "
        f"ranks that fell: {', '.join(fell) or 'none alone'}; "
        f"last: {describe(last)}; this run: {describe(current)}"
    )
    if guard == "warn":
        return Verdict(True, "WARNING " + line, last, ratio, fell, warning=True)
    return Verdict(False, line, last, ratio, fell)


class Ceilings(TypedDict):
    """The card's ceilings for the served model (knowledge with sources, from the plan): one
    stream's decode bound by memory bandwidth, and a full batch's tokens/s bound by compute,
    per GPU."""

    one_stream_tok_s: float
    full_batch_tok_s: float
    source: str


def beside_ceilings(record: Record, ceilings: Ceilings | None) -> str | None:
    """The run beside the card's ceilings, per GPU; None when the plan has none for this card
    and model (plan/throughput_plan.card_ceilings)."""
    if ceilings is None:
        return None
    ranks = int(record.get("ranks") or 1)
    per_gpu = float(record.get("total_tok_s") or 0) / max(1, ranks)
    share = per_gpu / ceilings["full_batch_tok_s"] if ceilings["full_batch_tok_s"] > 0 else 0.0
    return (
        f"per GPU {per_gpu:.0f} tokens/s (input and output), {share:.0%} of the compute ceiling "
        f"{ceilings['full_batch_tok_s']:.0f}; one stream's decode ceiling "
        f"{ceilings['one_stream_tok_s']:.0f} tok/s ({ceilings['source']})"
    )
