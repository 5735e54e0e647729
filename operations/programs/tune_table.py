"""The tune's decisions on what it measured, pure (no file, no clock): each candidate's row
against the current settings and the noise, the best, and the proposal. Shared by the host
program (programs/tune.py) and its tests; stdlib only.

The current settings are measured first and again last (`AGAIN`, after every candidate): the
baseline is their mean, and its noise the larger of each one's own (throughput_guard.noise: the
rounds' half-range over their median) and the drift between them (half their difference over
the mean), so a host whose speed moved during the tune widens the noise rather than crediting
or blaming a candidate. The noise of a comparison is the larger of the row's and the
baseline's; a change is beyond the noise when its size is larger. The best is the measured
candidate with the highest median; the proposal is the best when it is faster than the current
settings beyond the noise, else the current settings (a difference the noise explains is no
reason to change). With latency bounds (the most TTFT and
ITL p50 a proposal may have), only rows within them may be the best, and current settings over
a bound are proposed away from whenever a row within them was measured.

A cut-off tune is resumed (`resumable`): the records of the last tune of the same unit and the
same plan (the candidates, the unit they were made from, the load: the start line's `plan`)
that never reached its summary give the candidates it finished (measured or failed, not
skipped), kept as they are; the current settings are always measured again, so every change is
against a baseline of this run.

Not run on its own: inlined into programs/tune.py by operations/render/host_scripts.py.
"""

from __future__ import annotations

import statistics
from typing import TypedDict, cast

from operations.programs.throughput_guard import noise


class Row(TypedDict, total=False):
    """One candidate's outcome (one JSON line of layout.TUNE_RECORDS, with the tune's time)."""

    name: str
    lines: list[str]
    status: str  # "measured", "failed", "skipped"
    why: str
    rounds: list[float]
    output_tok_s: float
    noise: float
    concurrency: int
    ttft_ms: float | None
    itl_ms: float | None
    change: float | None
    beyond_noise: bool | None
    kept_from: str  # the cut-off tune this row was measured in (resumed)


def measured_row(
    name: str, lines: list[str], rounds: list[float], concurrency: int, ttft: object, itl: object
) -> Row:
    return {
        "name": name,
        "lines": lines,
        "status": "measured",
        "rounds": rounds,
        "output_tok_s": round(statistics.median(rounds), 2) if rounds else 0.0,
        "noise": round(noise(rounds), 4),
        "concurrency": concurrency,
        "ttft_ms": float(ttft) if isinstance(ttft, int | float) else None,
        "itl_ms": float(itl) if isinstance(itl, int | float) else None,
    }


def failed_row(name: str, lines: list[str], status: str, why: str) -> Row:
    return {"name": name, "lines": lines, "status": status, "why": why}


# The current settings are measured first and, after every candidate, again (AGAIN): a drift
# of the host between them (another tenant's load, the card's clock) is part of the noise every
# change is judged against, as paired runs (A B ... A) measure it.
CURRENT = "current"
AGAIN = "current, again"


def is_current(row: Row) -> bool:
    return row.get("name") in (CURRENT, AGAIN)


def baseline(rows: list[Row]) -> tuple[float, float] | None:
    """The current settings' rate (the mean of their measurements) and their noise: the larger
    of each measurement's own and the drift between the first and the last (half their
    difference over the rate); None when the first was not measured."""
    first = rows[0] if rows and rows[0].get("status") == "measured" else None
    if first is None or not first.get("output_tok_s"):
        return None
    runs = [
        r for r in rows if is_current(r) and r.get("status") == "measured" and r.get("output_tok_s")
    ]
    rates = [float(r.get("output_tok_s") or 0) for r in runs]
    rate = statistics.mean(rates)
    drift = (max(rates) - min(rates)) / 2 / rate
    return rate, max(drift, *(float(r.get("noise") or 0) for r in runs))


def compared(rows: list[Row]) -> list[Row]:
    """Each row with its change against the current settings (`baseline`) and whether that is
    beyond the noise (the larger of the row's and the baseline's); rows not measured, or all of
    them when the current settings were not, get None."""
    base = baseline(rows)
    out: list[Row] = []
    for row in rows:
        row = dict(row)  # type: ignore[assignment]
        if base is None or row.get("status") != "measured":
            row["change"], row["beyond_noise"] = None, None
        else:
            ratio = float(row.get("output_tok_s") or 0) / base[0]
            n = max(float(row.get("noise") or 0), base[1])
            row["change"] = round(ratio - 1, 4)
            row["beyond_noise"] = abs(ratio - 1) > n
        out.append(row)
    return out


Bounds = tuple[float | None, float | None]  # the most TTFT and ITL p50 (ms) a proposal may have


def over(row: Row, bounds: Bounds) -> str:
    """Which latency bound a measured row is over ("" when none, or no bound is set)."""
    ttft, itl = bounds
    said = []
    if ttft is not None and (row.get("ttft_ms") is None or float(row["ttft_ms"] or 0) > ttft):
        said.append(f"TTFT p50 over {ttft:g} ms")
    if itl is not None and (row.get("itl_ms") is None or float(row["itl_ms"] or 0) > itl):
        said.append(f"ITL p50 over {itl:g} ms")
    return ", ".join(said)


def best(rows: list[Row], bounds: Bounds = (None, None)) -> Row | None:
    """The measured row within the bounds with the highest median (the first of equals; the
    current settings' runs count as one, the first)."""
    measured = [
        r
        for r in rows
        if r.get("status") == "measured"
        and r.get("output_tok_s")
        and not over(r, bounds)
        and r.get("name") != AGAIN
    ]
    return max(measured, key=lambda r: float(r.get("output_tok_s") or 0), default=None)


def proposal(rows: list[Row], bounds: Bounds = (None, None)) -> tuple[Row | None, str]:
    """What the tune proposes (the docstring; with latency bounds, the best throughput within
    them: the current settings over a bound are no reason to keep them) and the sentence that
    says it."""
    rows = compared(rows)
    top = best(rows, bounds)
    if top is None:
        within = " within the latency bounds" if bounds != (None, None) else ""
        return None, f"tune: nothing was measured{within}: no proposal (the table says why)"
    if rows[0].get("status") != "measured":
        return None, (
            f"tune: the current settings could not be measured ({rows[0].get('why')}): no "
            f"proposal; the fastest measured was {top['name']} at {top['output_tok_s']:.1f} tok/s"
        )
    current_over = over(rows[0], bounds)
    if not current_over and (
        is_current(top) or not top.get("beyond_noise") or not top.get("change")
    ):
        return rows[0], (
            "tune: keep the current settings: no candidate was faster beyond the noise "
            f"(best {top['name']}, {float(top.get('change') or 0):+.1%})"
        )
    why = (
        f"the current settings are over a latency bound ({current_over})"
        if current_over
        else "beyond the noise"
    )
    return top, (
        f"tune: best {top['name']}: {top['output_tok_s']:.1f} output tok/s, "
        f"{float(top.get('change') or 0):+.1%} against the current settings, {why}; "
        "put these lines in the host's group_data and deploy (the canary judges it):"
    )


def _ms(value: object) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"


def table(rows: list[Row], bounds: Bounds = (None, None)) -> list[str]:
    """The table, one line a candidate (docs/how-to/tune.md shows one); a row over a latency bound
    says so at its end."""
    head = (
        f"{'candidate':<52} {'output tok/s':>13} {'spread':>7} {'TTFT p50':>9} {'ITL p50':>8} "
        f"{'vs current':>10}  beyond noise"
    )
    lines = [head]
    kept = sorted({str(r["kept_from"]) for r in rows if r.get("kept_from")})
    for row in compared(rows):
        status = row.get("status")
        name = f"{row['name']}{' *' if row.get('kept_from') else ''}"
        if status != "measured":
            lines.append(f"{name:<52} {str(status).upper()}: {row.get('why', '')}")
            continue
        change = row.get("change")
        beyond = row.get("beyond_noise")
        lines.append(
            f"{name:<52} {float(row.get('output_tok_s') or 0):>13.1f} "
            f"{float(row.get('noise') or 0):>7.1%} {_ms(row.get('ttft_ms')):>9} "
            f"{_ms(row.get('itl_ms')):>8} "
            f"{'-' if change is None else f'{change:+.1%}':>10}  "
            f"{'-' if beyond is None else ('yes' if beyond else 'no')}"
            + (f"  ({bound})" if (bound := over(row, bounds)) else "")
        )
    if kept:
        lines.append(f"* measured by the cut-off tune of {', '.join(kept)} (resumed)")
    base = baseline(rows)
    runs = [r for r in rows if is_current(r) and r.get("status") == "measured"]
    if base is not None and len(runs) > 1:
        first, last = (float(r.get("output_tok_s") or 0) for r in (runs[0], runs[-1]))
        lines.append(
            f"the current settings measured first and last: {first:.1f} and {last:.1f} "
            f"output tok/s; every change is against their mean, beyond a noise of at least "
            f"{base[1]:.1%}"
        )
    return lines


# Row keys a kept row carries over (not the old run's "tune" and "unit").
ROW_KEYS = tuple(Row.__annotations__)


def resumable(
    records: list[dict[str, object]], unit: str, plan: str
) -> tuple[str | None, dict[str, Row]]:
    """The cut-off tune to resume (its id) and its finished rows by name (the docstring); (None,
    {}) when the last tune of `unit` finished, had another plan, or there is none."""
    last = next(
        (r for r in reversed(records) if r.get("unit") == unit and r.get("event") == "start"),
        None,
    )
    if last is None or last.get("plan") != plan:
        return None, {}
    tid = last.get("tune")
    own = [r for r in records if r.get("tune") == tid and r.get("unit") == unit]
    if any("summary" in r for r in own):
        return None, {}
    kept: dict[str, Row] = {}
    for record in own:
        name = record.get("name")
        if (
            isinstance(name, str)
            and name not in (CURRENT, AGAIN)
            and record.get("status")
            in (
                "measured",
                "failed",
            )
        ):
            kept[name] = cast(Row, {k: record[k] for k in ROW_KEYS if k in record})
    return str(tid), kept


def summary(rows: list[Row], chosen: Row | None, said: str) -> dict[str, object]:
    """The summary line's decision: the proposal (None: nothing to propose), its change
    against the current settings and the noise that change was judged against."""
    if chosen is None:
        return {"summary": said, "best": None, "change": None, "noise": None, "beyond_noise": None}
    base = baseline(rows)
    return {
        "summary": said,
        "best": chosen.get("name"),
        "change": chosen.get("change"),
        "noise": max(float(chosen.get("noise") or 0), base[1] if base else 0.0),
        "beyond_noise": chosen.get("beyond_noise"),
    }
