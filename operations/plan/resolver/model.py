"""The GPU and the model: the chip is one the knowledge base knows, the release serves the
model's architecture, and the source's weights are the model that model_name names."""

from __future__ import annotations

from operations.kb import Architecture, Gpu, version
from operations.plan.resolver.context import Resolution, src


def gpu_entry(ctx: Resolution) -> Gpu | None:
    cap = ctx.s.gpu_compute_cap
    entry = ctx.kb.gpus.get(cap)
    if entry is None:
        ctx.error(
            f"gpu_compute_cap {cap!r} {ctx.where('gpu_compute_cap')} is not in the knowledge "
            f"base; accepted: {', '.join(ctx.kb.gpus)}"
        )
    return entry


def model_architecture(ctx: Resolution) -> Architecture | None:
    """The architecture entry of the model, after checking the release serves it."""
    s, kb = ctx.s, ctx.kb
    known = kb.models.get(s.model_name)
    model = ctx.facts.model
    arch = model.architecture if model is not None and model.architecture else None
    if arch is None and known is not None:
        arch = known.architecture.name
    if arch is None:
        ctx.plan.warnings.append(
            f"model {s.model_name!r}: architecture unknown until model_source "
            f"{s.model_source} holds a config.json; model support is not checked yet"
        )
        return None
    entry = kb.architectures.get(arch)
    if entry is None:
        ctx.error(
            f"model_name {s.model_name!r} {ctx.where('model_name')}: architecture {arch} is "
            "not in the knowledge base; add it under 'architectures' in "
            "operations/kb/knowledge/sglang.yaml with the first release that serves it"
        )
        return None
    release = s.sglang_version
    if version(release) < version(entry.first_release):
        ctx.error(
            f"sglang_version {release!r} {ctx.where('sglang_version')} does not serve "
            f"{arch} ({s.model_name}): first served by sglang {entry.first_release} "
            f"({src(entry.source)})"
        )
    elif (
        known is not None
        and known.min_release is not None
        and version(release) < version(known.min_release)
    ):
        ctx.error(
            f"sglang_version {release!r} {ctx.where('sglang_version')} cannot serve "
            f"{s.model_name}: it needs sglang >= {known.min_release} ({src(known.source)})"
        )
    return entry


def check_weights(ctx: Resolution) -> None:
    """The weights decide what is served: the source's config.json must be the model that
    model_name names in the knowledge base (architecture, quantization), or clients get
    other weights under that name."""
    s, kb = ctx.s, ctx.kb
    known = kb.models.get(s.model_name)
    model = ctx.facts.model
    if known is None and model is not None and model.architecture is not None:
        quantized = f" quantized {model.quantization}" if model.quantization else ""
        ctx.plan.warnings.append(
            f"model_name {s.model_name!r} {ctx.where('model_name')} is not in the knowledge "
            f"base: model_source's config.json names {model.architecture}{quantized}, and the "
            "flags are that architecture's; nothing checks these weights are the model the "
            f"name says (known: {', '.join(kb.models)})"
        )
    if known is None or model is None or model.architecture is None:
        return
    theirs = f"model_source {s.model_source} holds"
    if model.size_bytes:
        theirs += f" {model.size_bytes / 1024**3:.1f} GiB of"
    theirs += f" {model.architecture} weights"
    theirs += f" quantized {model.quantization}" if model.quantization else " with no quantization"
    ours = f"{known.architecture.name} weights"
    ours += f" quantized {known.quantization}" if known.quantization else " with no quantization"
    if known.size_gb:
        ours += f", {known.size_gb:g} GB"
    if (model.architecture, model.quantization) == (
        known.architecture.name,
        known.quantization,
    ):
        return
    same = [
        m.name
        for m in kb.models.values()
        if (m.architecture.name, m.quantization) == (model.architecture, model.quantization)
    ]
    fix = "point model_source at the weights of that model"
    if same:
        fix += f", or set model_name to {' or '.join(same)} (what these weights are)"
    ctx.error(
        f"model_name {s.model_name!r} {ctx.where('model_name')} names {ours} in the knowledge "
        f"base ({src(known.source)}), but {theirs} (its config.json): {fix}"
    )
