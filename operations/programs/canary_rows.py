"""The canary's verdict rows, pure: what was measured in, one row out (check, baseline,
canary, threshold, pass), and the table printed of them. programs/canary_compare.py measures;
its docstring says what each row asks of the ranks.

- answers: known sum: every rank (baseline and each canary) must answer the smoke's question
  (smoke_answers.QUESTION, a fresh pair of 3-digit operands, the same pair to every rank) with
  the sum exactly (smoke_answers.judge_chat, as the smoke judges it).
- answers: open prompts: OPEN_PROMPTS at temperature 0, OPEN_MAX_TOKENS at most, thinking off,
  each canary's text against the baseline's, token by token (the tokens the rank returns with
  its logprobs; else the text's words, each with the blank before it). Greedy decoding is not
  bit-reproducible across batch compositions: SGLang says outputs at temperature 0 may differ
  with batching unless `--enable-deterministic-inference` is set (`python3 -m
  sglang.test.test_deterministic` measures it), and a near-tie between two tokens then flips.
  So an answer passes when it is identical, or when its first divergence comes at token
  AGREE_TOKENS or later (a flip that late leaves the answer's substance, decided in its first
  tokens, the same), or when at the first divergence each side's token is among the other
  side's TOP_K most likely tokens at that position: vLLM's check_logprobs_close
  (https://github.com/vllm-project/vllm/blob/main/tests/models/utils.py) accepts a divergence
  on that ground and stops comparing there, since the two texts continue from different
  prefixes. A divergence earlier than AGREE_TOKENS that
  neither side's top-k explains (or without logprobs to ask) is a changed model: it fails.
- speed: each canary's output tokens/s at saturation (the load client, all ranks at once, the
  same rounds) against the baselines' median: it fails only when it is below (1 - max_slowdown)
  times it beyond the noise (the baselines' spread, an A/A measure of identical ranks side by
  side, or any rank's spread over its rounds), or when its requests failed; within the noise of
  the threshold more rounds are measured, and a last verdict there passes naming the noise.
- errors: from the router's per-worker circuit-breaker outcomes over the soak
  (smg_worker_cb_outcomes_total{outcome, worker}, after minus before): a failure is every
  outcome but "success". A canary passes when its failure ratio is at most the baseline's plus
  ERROR_MARGIN (one percentage point: Flagger's default success-rate check is 99%), and, while
  the baseline has no failure at all, it has at most FAILS_ALONE failures (a ratio over heavy
  traffic would let dozens through). A canary that served nothing in the soak has nothing to
  judge and says so. Without a router the row is skipped, said so, and passes (issue 45).

Not run on its own: inlined into canary_compare.py by operations/render/host_scripts.py.
"""

from __future__ import annotations

import re
import statistics
import textwrap
from collections.abc import Mapping
from typing import TypedDict

from operations.programs.rank_metrics import series
from operations.programs.throughput_guard import noise

OPEN_PROMPTS = (
    "Name the capital of France and the river that flows through it, in one sentence.",
    "List the first five prime numbers, separated by commas.",
    "In two sentences, explain what a hash table is.",
)
OPEN_MAX_TOKENS = 48  # long enough for a sentence or two, short enough to stay cheap
AGREE_TOKENS = 16
TOP_K = 5
ERROR_MARGIN = 0.01
FAILS_ALONE = 3
OUTCOMES = "smg_worker_cb_outcomes_total"
SUCCESS = "success"
EXACT = "exact"


def row(check: str, baseline: str, canary: str, threshold: str, passed: bool) -> dict[str, object]:
    """One row as the record keeps it: {check, baseline, canary, threshold, pass}."""
    return {
        "check": check,
        "baseline": baseline,
        "canary": canary,
        "threshold": threshold,
        "pass": passed,
    }


# -- answers ---------------------------------------------------------------------------------


class Answer(TypedDict):
    """One rank's answer to one open prompt: its text, its tokens and, where the rank returned
    logprobs, each position's TOP_K most likely tokens (else None)."""

    text: str
    tokens: list[str]
    tops: list[list[str]] | None


_WORD = re.compile(r"\s*\S+")


def answer_of(data: Mapping[str, object]) -> Answer | None:
    """A chat completion's first choice as an Answer; None when it has no text content."""
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict):
        return None
    message = first.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        return None
    logprobs = first.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if isinstance(entries, list) and entries and all(isinstance(e, dict) for e in entries):
        tokens = [str(e.get("token", "")) for e in entries]
        tops = [
            [str(t.get("token", "")) for t in (e.get("top_logprobs") or []) if isinstance(t, dict)]
            for e in entries
        ]
        return {"text": content, "tokens": tokens, "tops": tops}
    return {"text": content, "tokens": _WORD.findall(content), "tops": None}


def compare(baseline: Answer, canary: Answer) -> tuple[bool, str]:
    """(passes, how) for one prompt's two answers (the module docstring's tolerance)."""
    base, can = baseline["tokens"], canary["tokens"]
    if base == can:
        return True, "identical"
    at = next((i for i, (b, c) in enumerate(zip(base, can, strict=False)) if b != c), None)
    at = min(len(base), len(can)) if at is None else at
    unit = "token" if baseline["tops"] is not None and canary["tops"] is not None else "word"
    if at >= AGREE_TOKENS:
        return True, f"diverges at {unit} {at} (>= {AGREE_TOKENS})"
    b = base[at] if at < len(base) else "<end>"
    c = can[at] if at < len(can) else "<end>"
    tops_b, tops_c = baseline["tops"], canary["tops"]
    if (
        tops_b is not None
        and tops_c is not None
        and at < min(len(base), len(can), len(tops_b), len(tops_c))
        and c in tops_b[at]
        and b in tops_c[at]
    ):
        return True, f"diverges at token {at} within each other's top-{TOP_K}"
    return False, f"diverges at {unit} {at}: {b!r} vs {c!r}"


def open_threshold() -> str:
    return f"same first {AGREE_TOKENS} tokens, or top-{TOP_K} at the divergence"


# -- speed -----------------------------------------------------------------------------------


class RankSpeed(TypedDict):
    """One rank in the speed row: its median output tok/s over the rounds, each round, its
    requests that failed, and why it has no figure (None when it has one)."""

    tok_s: float
    rounds: list[float]
    errors: int
    why: str | None


def speed_row(
    baselines: dict[str, RankSpeed],
    canaries: dict[str, RankSpeed],
    max_slowdown: float,
    final: bool = True,
) -> tuple[dict[str, object], bool]:
    """The speed row and whether it is undecided (more rounds would decide it; only when not
    `final`). The baseline is the baselines' median; the noise n is the larger of their spread
    (measured at once on identical ranks: the host's own A/A noise) and any rank's spread over
    its rounds (throughput_guard.noise). A canary fails only when it is slower than
    1 - max_slowdown beyond n, or failed requests; within n of the threshold it is undecided,
    and when final passes with the noise said."""
    figures = [b["tok_s"] for b in baselines.values()]
    base = statistics.median(figures) if figures else 0.0
    ranks = (*baselines.values(), *canaries.values())
    n = max([noise(figures)] + [noise(r["rounds"]) for r in ranks])
    floor = 1 - max_slowdown
    passed, undecided, cells = base > 0, False, []
    for unit, s in sorted(canaries.items()):
        ratio = s["tok_s"] / base if base > 0 else 0.0
        if s["why"] is not None or s["errors"]:
            why = s["why"] or f"{s['errors']} requests failed"
            cells.append(f"{unit}: {why}")
            passed = False
            continue
        cells.append(f"{unit}: {s['tok_s']:.1f} tok/s, x{ratio:.2f}")
        if ratio < floor - n:
            passed = False
        elif ratio < floor:
            undecided = undecided or not final
    names = ", ".join(sorted(baselines))
    shown = f"median of {names}: {base:.1f} tok/s" if base > 0 else "no figure"
    threshold = f">= {floor:.2f} x baseline beyond noise {n:.1%}"
    return row("speed", shown, "; ".join(cells), threshold, passed), undecided and passed


# -- errors ----------------------------------------------------------------------------------


def outcomes(text: str) -> dict[str, tuple[float, float]]:
    """Each worker's (failures, outcomes) on the router's /metrics page, from OUTCOMES."""
    found: dict[str, tuple[float, float]] = {}
    for name, labels, value in series(text):
        worker = labels.get("worker")
        if name != OUTCOMES or worker is None:
            continue
        failed, total = found.get(worker, (0.0, 0.0))
        bad = value if labels.get("outcome") != SUCCESS else 0.0
        found[worker] = (failed + bad, total + value)
    return found


def _worker(counts: dict[str, tuple[float, float]], url: str) -> tuple[float, float] | None:
    for name in (url, url.rstrip("/"), url.rstrip("/") + "/"):
        if name in counts:
            return counts[name]
    return None


def errors_row(
    before: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    baseline: tuple[str, str],
    canaries: dict[str, str],
    soak: float,
) -> dict[str, object]:
    """`baseline`: (unit, worker URL); `canaries`: unit -> worker URL, as the router names
    them. A worker with no series on the page has had no outcome since it joined: smg 1.13.0
    labels its counters per worker and a worker that left and rejoined (the canary's roll
    drains and re-adds it) starts with none until its first request, so it counts 0 of 0
    (nothing to judge); the roll's readmit already checked that the router lists it."""
    threshold = (
        f"ratio <= baseline + {ERROR_MARGIN:.0%}; <= {FAILS_ALONE} if the baseline has none "
        f"(soak {soak:g} s)"
    )

    def delta(url: str) -> tuple[float, float]:
        now = _worker(after, url) or (0.0, 0.0)
        was = _worker(before, url) or (0.0, 0.0)
        return now[0] - was[0], now[1] - was[1]

    def shown(d: tuple[float, float]) -> str:
        ratio = f" ({d[0] / d[1]:.1%})" if d[1] > 0 else ": nothing to judge"
        return f"{d[0]:g} failed of {d[1]:g}{ratio}"

    base = delta(baseline[1])
    base_ratio = base[0] / base[1] if base[1] > 0 else 0.0
    passed = True
    cells = []
    for unit, url in sorted(canaries.items()):
        got = delta(url)
        ratio = got[0] / got[1] if got[1] > 0 else 0.0
        ok = ratio <= base_ratio + ERROR_MARGIN and (base[0] > 0 or got[0] <= FAILS_ALONE)
        cells.append(f"{unit}: {shown(got)}")
        passed = passed and ok
    return row("errors", f"{baseline[0]}: {shown(base)}", "; ".join(cells), threshold, passed)


def no_router_row() -> dict[str, object]:
    return row("errors", "-", "skipped: no router", "-", True)


# -- the table -------------------------------------------------------------------------------

# The table fits 80 columns (a terminal's least width) where the deploy logs it: the columns, two
# spaces between each, and the log's indent before every line (runtime/host_lines.host_block:
# the table is printed under its host's name, never after it on each line).
TABLE_WIDTH = 76
COLUMNS = (("check", 16), ("baseline", 17), ("canary", 17), ("threshold", 14), ("pass", 4))


def table(rows: list[dict[str, object]]) -> list[str]:
    """A header line and each row's line(s): every cell wrapped to its column's width."""
    lines = ["  ".join(name.ljust(width) for name, width in COLUMNS).rstrip()]
    for item in rows:
        cells = []
        for name, width in COLUMNS:
            value = item[name]
            text = ("yes" if value else "NO") if name == "pass" else str(value)
            cells.append(textwrap.wrap(text, width, break_on_hyphens=False) or [""])
        for i in range(max(len(c) for c in cells)):
            pairs = zip(cells, COLUMNS, strict=True)
            parts = [(c[i] if i < len(c) else "").ljust(w) for c, (_, w) in pairs]
            lines.append("  ".join(parts).rstrip())
    return lines


def last_line(rows: list[dict[str, object]]) -> str:
    failed = [str(r["check"]) for r in rows if not r["pass"]]
    return "canary: passed" if not failed else f"canary: FAILED ({', '.join(failed)})"
