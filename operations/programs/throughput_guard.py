"""The throughput check's decisions, pure: the load client's result and the records in, a record
and a verdict out (no file, no clock). Shared by the host program (programs/throughput.py, which
decides the run's exit), the canary's speed row (canary_rows.py) and `status`; stdlib only.

The figure. A record is one check (programs/throughput.py writes it, one JSON line of
layout.THROUGHPUT_RECORDS). Its `output_tok_s` is the host's capacity: the median over the
check's rounds (windows, load_client.py) of the tokens every rank generated per second at
saturation, counted by the ranks' own counters. Its `noise` is the rounds' half-range over their
median (`noise`): how far one round strays from the figure.

Which records are compared. Two records measure the same thing when their workload (lengths,
model, its digest, the ranks count), their hardware (GPU name and driver) and their ruler (the
load client, load_client.CLIENT) are equal. A record whose verdict failed, that measured nothing,
or that was inconclusive (too much traffic not the check's) is never a baseline.

The verdict (`judge`), against the threshold t (throughput_max_slowdown) and the noise n: the
larger of this check's noise and the median noise of the records it is compared with (each
record's own rounds). The spread between records is not taken for noise: a slow drift between
deploys is what the guard is for, and counting it as noise would hide it.
- the baseline is the median of the last BASELINE_RECORDS comparable passed records, and the
  drift check's is the best of the last DRIFT_RECORDS: a chain of losses each under t still
  ends below the best by more than t, and is caught;
- slower beyond the noise (ratio < 1 - t - n against either): fails (warns with guard `warn`,
  and a warned record is the host's new rate: the records before it are no baseline any more);
- slower than 1 - t but within the noise: undecided; the program measures more rounds within its
  time budget and asks again with `final`; a final verdict there passes and says the slowdown
  was within the noise, naming it (a check never fails on a difference its noise explains);
- otherwise passes. Every line names the noise it was decided against.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TypedDict, cast

BASELINE_RECORDS = 5
DRIFT_RECORDS = 10
# More than half of the tokens the ranks generated in the check's windows were not the check's:
# the figure is then the clients' mix of lengths, not this workload's; the check says so and
# neither passes nor fails on it.
FOREIGN_MAX = 0.5


class Workload(TypedDict):
    """What a check measures: the request shape, the model and the ranks
    (plan/throughput_plan.workload)."""

    input_len: int
    output_len: int
    model: str
    model_digest: str | None
    ranks: int


class Meta(TypedDict):
    """What the plan says of a check (the record's first fields): the release, engine and flags
    it measures, the hardware it runs on, the router in front (None without one) and the ranks'
    server arguments, readable (rank 0's, without its port)."""

    release: str
    engine: str
    model_digest: str | None
    flags_digest: str
    workload: Workload
    gpu: str | None
    driver: str | None
    router: str | None
    server_args: list[str]


class Percentiles(TypedDict):
    p50: float | None


class RankFigure(TypedDict):
    """One rank in a record: its median over the rounds, each round, the requests in flight the
    load kept and how that number was found (load_client.py: queue, most, fixed, timeout), the
    share of its finished requests that were not the check's, and the share of readings with a
    queue (1.0: saturated throughout)."""

    output_tok_s: float
    rounds: list[float]
    concurrency: int
    found: str
    foreign_share: float
    queued_share: float


class Outcome(TypedDict):
    ok: bool
    ratio: float | None
    fell: list[str]
    noise: float
    decided: str  # "first", "passed", "within noise", "slower", "drift", "inconclusive", "failed"


class Record(Meta, total=False):
    """One line of layout.THROUGHPUT_RECORDS."""

    time: str
    client: str
    seed: int
    ranks: int
    rounds: list[float]
    output_tok_s: float
    total_tok_s: float
    noise: float
    per_rank: dict[str, RankFigure]
    foreign_share: float
    completed: int
    errors: int
    first_error: str | None
    ttft_ms: Percentiles
    itl_ms: Percentiles
    changed_args: list[str]
    verdict: Outcome


def noise(values: list[float]) -> float:
    """Half the range of `values` over their median; 0.0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / (2 * mid) if mid > 0 else 0.0


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def figures(result: dict[str, object], ranks: list[str]) -> dict[str, RankFigure]:
    """Each rank's figure from the load client's result (load_client.py's `ranks`)."""
    read = result.get("ranks")
    found = read if isinstance(read, dict) else {}
    out: dict[str, RankFigure] = {}
    for name in ranks:
        rank = found.get(name)
        rank = rank if isinstance(rank, dict) else {}
        windows = [w for w in rank.get("windows") or [] if isinstance(w, dict)]
        rounds = [_number(w.get("output_tok_s")) for w in windows]
        requests = sum(_number(w.get("generated")) for w in windows)
        own = sum(_number(w.get("own_generated")) for w in windows)
        queued = [_number(w.get("queued_share")) for w in windows]
        out[name] = {
            "output_tok_s": round(statistics.median(rounds), 2) if rounds else 0.0,
            "rounds": rounds,
            "concurrency": int(_number(rank.get("concurrency"))),
            "found": str(rank.get("found") or "?"),
            "foreign_share": round(max(0.0, 1 - own / requests), 3) if requests > 0 else 0.0,
            "queued_share": round(min(queued), 3) if queued else 0.0,
        }
    return out


def measured(meta: Meta, result: dict[str, object], ranks: list[str], now: str) -> Record:
    """A record of one check from the load client's result (see the docstring)."""
    per_rank = figures(result, ranks)
    count = min((len(f["rounds"]) for f in per_rank.values()), default=0)
    rounds = [round(sum(f["rounds"][i] for f in per_rank.values()), 2) for i in range(count)]
    read = result.get("ranks")
    raw = [r for r in (read.values() if isinstance(read, dict) else []) if isinstance(r, dict)]
    errors = int(sum(_number(r.get("errors")) for r in raw))
    first = next((str(r["first_error"]) for r in raw if r.get("first_error")), None)
    requests = own = 0.0
    for r in raw:
        for w in r.get("windows") or []:
            if isinstance(w, dict):
                requests += _number(w.get("generated"))
                own += _number(w.get("own_generated"))
    median = round(statistics.median(rounds), 2) if rounds else 0.0
    shape = meta["workload"]
    per_token = (shape["input_len"] + shape["output_len"]) / max(1, shape["output_len"])

    def p50(key: str) -> Percentiles:
        values = sorted(_number(r[key]) for r in raw if r.get(key) is not None)
        return {"p50": values[len(values) // 2] if values else None}

    record: Record = {
        "release": meta["release"],
        "engine": meta["engine"],
        "model_digest": meta["model_digest"],
        "flags_digest": meta["flags_digest"],
        "workload": meta["workload"],
        "gpu": meta["gpu"],
        "driver": meta["driver"],
        "router": meta["router"],
        "server_args": meta["server_args"],
        "time": now,
        "client": str(result.get("client") or "?"),
        "seed": int(_number(result.get("seed"))),
        "ranks": len(ranks),
        "rounds": rounds,
        "output_tok_s": median,
        "total_tok_s": round(median * per_token, 2),
        "noise": round(noise(rounds), 4),
        "per_rank": per_rank,
        "foreign_share": round(max(0.0, 1 - own / requests), 3) if requests > 0 else 0.0,
        "completed": int(sum(_number(r.get("completed")) for r in raw)),
        "errors": errors,
        "first_error": first,
        "ttft_ms": p50("ttft_ms"),
        "itl_ms": p50("itl_ms"),
    }
    return record


def key(record: Record) -> tuple[str, str, str]:
    """What must match for two records to be compared (the docstring)."""
    workload = record.get("workload") or {}
    hardware = (record.get("gpu"), record.get("driver"))
    return repr(sorted(workload.items())), repr(hardware), str(record.get("client"))


def baseline_records(history: list[Record], current: Record) -> list[Record]:
    """The comparable records that may be a baseline, newest first (the docstring)."""
    found = []
    for record in reversed(history):
        verdict: dict[str, object] = dict(record.get("verdict") or {})
        refused = verdict.get("ok") is False or verdict.get("decided") == "inconclusive"
        ok = int(record.get("errors") or 0) == 0 and bool(record.get("output_tok_s"))
        if ok and not refused and key(record) == key(current):
            found.append(record)
            if verdict.get("decided") in ("slower", "drift"):
                break  # a slowdown accepted with guard `warn`: the host's new rate
    return found


def previous(history: list[Record], current: Record) -> Record | None:
    """The last comparable record that may be a baseline."""
    found = baseline_records(history, current)
    return found[0] if found else None


def changed_args(history: list[Record], current: Record) -> list[str]:
    """The server arguments that differ from the last comparable record: `+ARG` new, `-ARG`
    gone."""
    for record in reversed(history):
        if key(record) == key(current):
            was, now = record.get("server_args") or [], current.get("server_args") or []
            return [f"-{a}" for a in was if a not in now] + [f"+{a}" for a in now if a not in was]
    return []


@dataclass(frozen=True)
class Verdict:
    ok: bool
    line: str
    previous: Record | None = None
    ratio: float | None = None
    fell: list[str] = field(default_factory=list)
    warning: bool = False
    undecided: bool = False
    noise: float = 0.0
    decided: str = "passed"

    def outcome(self) -> Outcome:
        return {
            "ok": self.ok,
            "ratio": self.ratio,
            "fell": self.fell,
            "noise": round(self.noise, 4),
            "decided": self.decided,
        }


def describe(record: Record) -> str:
    """One record in a few words: when, which release and engine, output tok/s and noise."""
    rounds = record.get("rounds") or []
    return (
        f"{record.get('time', '?')} sglang {record.get('release', '?')} "
        f"({record.get('engine', '?')}, flags {str(record.get('flags_digest', '?'))[:12]}): "
        f"{float(record.get('output_tok_s') or 0):.1f} output tok/s "
        f"(median of {len(rounds)}, noise {float(record.get('noise') or 0):.1%})"
    )


def _rank_rates(record: Record) -> dict[str, float]:
    return {n: float(r.get("output_tok_s") or 0) for n, r in (record.get("per_rank") or {}).items()}


def judge(
    current: Record, history: list[Record], max_slowdown: float, guard: str, final: bool = True
) -> Verdict:
    """The guard's verdict on `current` (the docstring); `history` oldest first, without it."""
    now = float(current.get("output_tok_s") or 0)
    shown = f"{now:.1f} output tok/s (median of {len(current.get('rounds') or [])} rounds"
    if int(current.get("errors") or 0) > 0 or now <= 0:
        why = current.get("first_error") or "nothing was generated"
        return Verdict(
            False,
            f"throughput: {current.get('errors')} requests failed ({why})",
            decided="failed",
        )
    own = float(current.get("noise") or 0)
    foreign = float(current.get("foreign_share") or 0)
    if foreign > FOREIGN_MAX:
        return Verdict(
            True,
            f"throughput: {shown}); not judged: {foreign:.0%} of the tokens the ranks generated "
            f"while measured were not the check's (more than {FOREIGN_MAX:.0%}): the figure is "
            "the clients' mix, not this workload; the next check judges again",
            noise=own,
            decided="inconclusive",
        )
    records = baseline_records(history, current)
    if not records:
        return Verdict(
            True,
            f"throughput: {shown}, noise {own:.1%}); a first run of this workload on this "
            "hardware with this client: nothing to compare",
            noise=own,
            decided="first",
        )
    last = records[:BASELINE_RECORDS]
    values = [float(r.get("output_tok_s") or 0) for r in last]
    base = statistics.median(values)
    best = max(float(r.get("output_tok_s") or 0) for r in records[:DRIFT_RECORDS])
    n = max(own, statistics.median(float(r.get("noise") or 0) for r in last))
    ratio = now / base if base > 0 else 1.0
    to_best = now / best if best > 0 else 1.0
    was, is_ = _rank_rates(last[0]), _rank_rates(current)
    fell = sorted(
        name
        for name, rate in is_.items()
        if was.get(name, 0) > 0 and rate < (1 - max_slowdown - n) * was[name]
    )
    said = (
        f"throughput: {shown}, noise {n:.1%}), {(ratio - 1) * 100:+.1f}% against the median "
        f"of the last {len(last)} passed record(s) ({base:.1f}), {(to_best - 1) * 100:+.1f}% "
        f"against the best of the last {min(len(records), DRIFT_RECORDS)} ({best:.1f})"
    )
    floor = 1 - max_slowdown
    if ratio >= floor and to_best >= floor:
        return Verdict(True, said, last[0], ratio, noise=n)
    beyond = ratio < floor - n or to_best < floor - n
    if not beyond and not final:
        return Verdict(
            True,
            f"{said}: below {floor:.2f} but within the noise: measuring more rounds",
            last[0],
            ratio,
            noise=n,
            undecided=True,
            decided="within noise",
        )
    if not beyond:
        return Verdict(
            True,
            f"{said}: slower than throughput_max_slowdown {max_slowdown:g} allows, but within "
            f"the noise {n:.1%}: not failed; the next checks will tell",
            last[0],
            ratio,
            fell,
            noise=n,
            decided="within noise",
        )
    drift = ratio >= floor - n
    what = (
        f"{(1 - to_best):.1%} below the best recent record: a chain of smaller losses"
        if drift
        else f"{(1 - ratio):.1%} slower"
    )
    changed = ", ".join(current.get("changed_args") or []) or "no server argument"
    line = (
        f"{said}: {what}, past throughput_max_slowdown {max_slowdown:g} beyond the noise "
        f"{n:.1%}; ranks that fell: {', '.join(fell) or 'none alone'}; "
        f"changed since the record before: {changed}; last passed: {describe(last[0])}"
    )
    decided = "drift" if drift else "slower"
    if guard == "warn":
        line = "WARNING " + line
        return Verdict(True, line, last[0], ratio, fell, True, noise=n, decided=decided)
    return Verdict(False, line, last[0], ratio, fell, noise=n, decided=decided)


class Ceilings(TypedDict):
    """The card's ceilings for the served model (knowledge with sources, from the plan): one
    stream's decode bound by memory bandwidth, and a full batch's tokens/s bound by compute,
    per GPU."""

    one_stream_tok_s: float
    full_batch_tok_s: float
    source: str


def beside_ceilings(record: Record, ceilings: Ceilings | None) -> str | None:
    """The check beside the card's ceilings, per GPU; None when the plan has none for this card
    and model (plan/throughput_plan.card_ceilings). Input and output tokens are counted as the
    ceiling counts them (the check's fixed lengths: total = output x (in + out) / out)."""
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


def start_concurrency(history: list[Record], current: Meta, least: int) -> int:
    """Where the ramp starts: half the least concurrency the last record of the same workload,
    release and flags found (a host and release keep their capacity between checks), else
    `least`."""
    for record in reversed(history):
        same = record.get("flags_digest") == current["flags_digest"] and repr(
            sorted((record.get("workload") or {}).items())
        ) == repr(sorted(current["workload"].items()))
        per_rank = record.get("per_rank") or {}
        found = [int(r.get("concurrency") or 0) for r in per_rank.values()]
        if same and found and min(found) > 0:
            return max(least, min(found) // 2)
    return least


def as_record(value: object) -> Record | None:
    return cast(Record, value) if isinstance(value, dict) else None
