"""The attention backend: the one set, or auto's first that runs with this release on this GPU
(for this model), and why each other cannot; what the no_buffer Mamba cache strategy refuses."""

from __future__ import annotations

from operations.kb import version
from operations.plan.resolver.context import Resolution, src
from operations.plan.vocabulary import Decision


def backend_refusals(ctx: Resolution, backend: str, hybrid: bool) -> list[str]:
    """Why `backend` cannot run here; empty when it can."""
    s, kb = ctx.s, ctx.kb
    cap = s.gpu_compute_cap
    chip = kb.gpus.get(cap)
    arch = chip.arch if chip else cap
    chips = kb.backend_rule(backend, s.sglang_version)
    if chips is None:
        return [f"{backend!r} is not a known backend (known: {', '.join(kb.attention_backends)})"]
    reasons = []
    if chips.refuses(cap):
        reasons.append(f"{chips.reason}; this GPU is {arch} ({src(chips.source)})")
    if hybrid:
        rule = kb.hybrid_backends(s.sglang_version)
        if rule is None:
            reasons.append(
                f"the knowledge base has no data on which backends sglang "
                f"{s.sglang_version} accepts for hybrid linear-attention models"
            )
        elif backend not in rule.backends:
            why = f"; {rule.reason}" if rule.reason else ""
            reasons.append(
                f"sglang {s.sglang_version} does not accept it for hybrid linear-attention "
                f"models{why} ({src(rule.source)})"
            )
    spec = kb.speculative
    if backend == "flashinfer" and s.speculative is not None and ctx.release_known:
        flashinfer = kb.releases[s.sglang_version].pin("flashinfer-python") or "0"
        if version(flashinfer) <= version(spec.flashinfer_newer_than):
            reasons.append(
                f"{spec.flashinfer_reason}; sglang {s.sglang_version} pins flashinfer "
                f"{flashinfer} ({src(spec.source)})"
            )
    if ctx.table is not None:
        option = ctx.table.get("--attention-backend")
        if option is not None and option.choices is not None and backend not in option.choices:
            reasons.append(f"sglang {s.sglang_version}'s --attention-backend has no {backend!r}")
    return reasons


def runnable_backends(ctx: Resolution, hybrid: bool) -> list[str]:
    """Every backend that runs with this release on this GPU (for this model)."""
    return [b for b in ctx.kb.attention_backends if not backend_refusals(ctx, b, hybrid)]


def attention_backend(ctx: Resolution, hybrid: bool) -> str | None:
    s, kb = ctx.s, ctx.kb
    if not ctx.release_known or ctx.table is None:
        return None  # check_release said why; any backend error would only follow from it
    if s.attention_backend != "auto":
        reasons = backend_refusals(ctx, s.attention_backend, hybrid)
        if reasons:
            runnable = runnable_backends(ctx, hybrid)
            choose = (
                f"backends that run here: {', '.join(runnable)} (or auto)"
                if runnable
                else "no backend runs here"
            )
            ctx.error(
                f"attention_backend {s.attention_backend!r} "
                f"{ctx.where('attention_backend')} cannot run with sglang "
                f"{s.sglang_version} on compute capability {s.gpu_compute_cap}: "
                + "; ".join(reasons)
                + f"; {choose}"
            )
            return None
        ctx.plan.decisions.append(Decision("attention backend", s.attention_backend, "set"))
        return s.attention_backend
    rule = kb.auto_rule(s.gpu_compute_cap)
    if rule is None:
        ctx.error(
            f"attention_backend 'auto': the knowledge base has no preference for compute "
            f"capability {s.gpu_compute_cap}; set attention_backend explicitly"
        )
        return None
    skipped: list[str] = []
    for backend in rule.prefer:
        reasons = backend_refusals(ctx, backend, hybrid)
        if not reasons:
            why = rule.why + (f"; skipped {'; '.join(skipped)}" if skipped else "")
            ctx.plan.decisions.append(
                Decision("attention backend", backend, f"auto: {why} ({src(rule.source)})")
            )
            if skipped:
                ctx.plan.warnings.append(
                    f"attention_backend auto chose {backend}: skipped {'; '.join(skipped)}"
                )
            return backend
        skipped.append(f"{backend} ({reasons[0]})")
    ctx.error(
        f"attention_backend 'auto': no backend runs with sglang {s.sglang_version} on "
        f"compute capability {s.gpu_compute_cap}: {'; '.join(skipped)}"
    )
    return None


def check_no_buffer(ctx: Resolution, backend: str | None) -> None:
    """What the no_buffer Mamba cache strategy asserts in this release."""
    s = ctx.s
    rule = ctx.kb.no_buffer_rule(s.sglang_version)
    if s.mamba_cache_strategy != "no_buffer" or rule is None:
        return
    page_size = None
    extra = list(s.extra_server_args)
    for i, arg in enumerate(extra):
        if arg.startswith("--page-size="):
            page_size = arg.split("=", 1)[1]
        elif arg == "--page-size" and i + 1 < len(extra):
            page_size = extra[i + 1]
    for limits, found in ((rule.refuses, True), (rule.warns, False)):
        hits = []
        if backend in limits.attention_backends:
            hits.append(f"attention backend {backend}")
        if limits.page_size_other_than_1 and page_size not in (None, "1"):
            hits.append(f"--page-size {page_size}")
        if not hits:
            continue
        message = (
            f"mamba_cache_strategy 'no_buffer' {ctx.where('mamba_cache_strategy')} with "
            f"{' and '.join(hits)} on sglang {s.sglang_version}: {rule.reason} "
            f"({src(rule.source)})"
        )
        if found:
            ctx.error(message + "; use extra_buffer, or another backend and page size")
        else:
            ctx.plan.warnings.append(message + "; SGLang changes it at start-up")
