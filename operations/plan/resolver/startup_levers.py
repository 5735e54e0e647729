"""The release's own start-up levers, each a decision with its source: an explicit watchdog
timeout and whether the weight load overlaps graph capture (knowledge/caches.yaml `levers`, the
release's start-up file and CLI table). The graph batch size and the other throughput levers
are operations/plan/resolver/throughput.py's."""

from __future__ import annotations

from operations.kb import Architecture
from operations.kb.caches import load_caches, release_caches
from operations.kb.startup import load_startup
from operations.plan.resolver.context import Resolution
from operations.plan.vocabulary import Decision

WATCHDOG = "--watchdog-timeout"
WEIGHT_LOAD_MODE = "--startup-weight-load-mode"


def _given(ctx: Resolution, option: str) -> bool:
    return any(a.split("=", 1)[0] == option for a in ctx.s.extra_server_args)


def startup_levers(ctx: Resolution, arch: Architecture | None) -> list[str]:
    """The options the levers add to the rank's command line; each lever is a Decision."""
    if ctx.table is None or not ctx.release_known:
        return []
    caches = load_caches(ctx.kb)
    facts = release_caches(ctx.kb, ctx.s.sglang_version) if _has_startup(ctx) else None
    args: list[str] = []
    decide = ctx.plan.decisions.append
    lever = caches.watchdog_timeout
    ours = f"{lever.seconds:g}"
    release = (
        f"sglang {facts.release}'s default {facts.watchdog_timeout:g} s "
        f"({facts.watchdog_timeout_source})"
        if facts is not None and facts.watchdog_timeout is not None
        else "the release's default (no start-up file for it)"
    )
    if ctx.table.get(WATCHDOG) is None:
        decide(Decision("watchdog timeout", "not written", f"the release has no {WATCHDOG}"))
    elif _given(ctx, WATCHDOG):
        decide(Decision("watchdog timeout", "extra_server_args", f"set there; {release}"))
    else:
        args += [WATCHDOG, ours]
        decide(
            Decision(
                "watchdog timeout",
                f"{WATCHDOG} {ours}",
                f"{lever.why}; {release}, written explicitly ({_cited(ctx, lever.source)})",
            )
        )
    decide(_overlap(ctx, arch, facts.weight_load_modes if facts else ()))
    return args


def _has_startup(ctx: Resolution) -> bool:
    return load_startup(ctx.s.sglang_version) is not None


def _cited(ctx: Resolution, names: tuple[str, ...]) -> str:
    """`source: ...` for caches.yaml's own sources (its keys and URLs)."""
    caches = load_caches(ctx.kb)
    return "source: " + "; ".join(f"caches.yaml {n}, {caches.sources[n]['url']}" for n in names)


def _overlap(ctx: Resolution, arch: Architecture | None, modes: tuple[str, ...]) -> Decision:
    """Overlap is never written: it is decided here and said why (SGLang refuses it at start
    for any architecture off its list, which holds no hybrid model)."""
    what = "weight load mode"
    if "overlap" not in modes:
        return Decision(
            what,
            "serial (not written)",
            f"sglang {ctx.s.sglang_version} has no {WEIGHT_LOAD_MODE} overlap (0.5.18+)",
        )
    lever = load_caches(ctx.kb).weight_load_overlap
    name = arch.name if arch is not None else "unknown until config.json is read"
    admitted = arch is not None and arch.name in lever.architectures
    verdict = (
        f"{name} is admitted, but overlap is not enabled: no run here proves it"
        if admitted
        else f"{name} is not one SGLang admits ({', '.join(lever.architectures)})"
        + (
            "; a hybrid Gated DeltaNet model"
            if arch is not None and arch.hybrid_linear_attention
            else ""
        )
        + ": overlap would fail the start"
    )
    return Decision(
        what,
        "serial (the default, not written)",
        f"{lever.why}; {verdict} ({_cited(ctx, lever.source)})",
    )
