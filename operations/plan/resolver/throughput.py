"""The levers that set a rank's throughput, each a decision with what it trades and its source
(knowledge/throughput.yaml): how many requests a rank runs at once (and the 48 that speculative
decoding caps it at when it is unset), the largest CUDA-graph batch against that concurrency,
the prefill chunk, the scheduler's conservativeness, the memory fraction, speculative decoding,
and FP8 weights. Only a setting writes an option; unset, the release decides and the plan says
what it will choose."""

from __future__ import annotations

from operations.kb import Architecture, Cites
from operations.kb.throughput import ThroughputLever, load_throughput
from operations.plan.resolver.context import Resolution, src
from operations.plan.vocabulary import Decision

MAX_RUNNING = "--max-running-requests"
CHUNKED_PREFILL = "--chunked-prefill-size"
CONSERVATIVENESS = "--schedule-conservativeness"
# The GPU memory tier (MiB, as SGLang measures it) whose defaults throughput.yaml records: an
# RTX PRO 6000's 96 GB (nvidia-smi: 97,887 MiB) lies in it.
DEFAULTS_TIER_MIB = (90 * 1024, 160 * 1024)


def _lever(name: str) -> ThroughputLever:
    return load_throughput().lever(name)


def _why(lever: ThroughputLever, *notes: str) -> str:
    """The lever's trade-off, the notes, and its sources by their keys in throughput.yaml
    (where each names the file and lines it was read in)."""
    said = "; ".join(n for n in (lever.why, *notes) if n)
    return f"{said} ({cited(lever.source)})"


def cited(sources: Cites) -> str:
    keys = "; ".join(f"throughput.yaml {s.id}, {s.url}" for s in sources)
    return f"source: {keys}"


def _set_in(ctx: Resolution, key: str) -> str:
    return f"{key} (its default)" if ctx.s.origin(key) == "default" else f"{key} {ctx.where(key)}"


def _release_default(ctx: Resolution, lever: ThroughputLever) -> str:
    if lever.release_default is None or not _in_defaults_tier(ctx):
        return ""
    return (
        f"sglang's own default on these GPUs (90-160 GiB each): {lever.release_default} "
        "(read in 0.5.11 and 0.5.23)"
    )


def _given(ctx: Resolution, option: str) -> str | None:
    """The value extra_server_args gives `option` ("" for one it gives without a value)."""
    extra = list(ctx.s.extra_server_args)
    for i, arg in enumerate(extra):
        name, eq, value = arg.partition("=")
        if name == option:
            return value if eq else (extra[i + 1] if i + 1 < len(extra) else "")
    return None


def _in_defaults_tier(ctx: Resolution) -> bool:
    gpu = ctx.facts.gpu
    if gpu is None or not gpu.ok or not gpu.gpus:
        return False
    low, high = DEFAULTS_TIER_MIB
    return all(low <= g.memory_total_mib < high for g in gpu.gpus)


def throughput_levers(ctx: Resolution, arch: Architecture | None) -> list[str]:
    """The options these levers add to the rank's command line (only what a setting asks);
    every lever is a Decision, and a concurrency the graphs or the cap would cut is a warning."""
    args: list[str] = []
    decide = ctx.plan.decisions.append
    running, option = _max_running(ctx)
    args += option
    decide(_graph_bs(ctx, running))
    args += _written_lever(ctx, "chunked_prefill_size", CHUNKED_PREFILL, "chunked prefill")
    args += _written_lever(
        ctx, "schedule_conservativeness", CONSERVATIVENESS, "schedule conservativeness"
    )
    decide(
        Decision(
            "memory fraction",
            f"--mem-fraction-static {ctx.s.mem_fraction_static:g}",
            _why(
                _lever("mem_fraction_static"),
                f"{_set_in(ctx, 'mem_fraction_static')}, always written",
            ),
        )
    )
    decide(_speculative(ctx))
    decide(_weights(ctx, arch))
    return args


def _max_running(ctx: Resolution) -> tuple[int | None, list[str]]:
    """(the concurrency a rank runs at, where known; the option written)."""
    s, lever = ctx.s, _lever("max_running_requests")
    what, cap = "max running requests", lever.speculative_cap
    given = _given(ctx, MAX_RUNNING)
    if s.max_running_requests is not None and given is not None:
        ctx.error(
            f"max_running_requests {ctx.where('max_running_requests')} and extra_server_args "
            f"{ctx.where('extra_server_args')} both set {MAX_RUNNING}: keep the setting and "
            "drop it from extra_server_args"
        )
        return None, []
    if s.max_running_requests is not None:
        n = s.max_running_requests
        ctx.plan.decisions.append(
            Decision(
                what,
                f"{MAX_RUNNING} {n}",
                _why(lever, f"max_running_requests {ctx.where('max_running_requests')}"),
            )
        )
        return n, [MAX_RUNNING, str(n)]
    if given is not None:
        ctx.plan.decisions.append(Decision(what, "extra_server_args", _why(lever, "set there")))
        return (int(given) if given.isdigit() else None), []
    if s.speculative is not None and cap is not None:
        ctx.plan.decisions.append(
            Decision(what, f"{cap} (speculative decoding's cap; not written)", _why(lever))
        )
        ctx.plan.warnings.append(
            f"speculative {ctx.where('speculative')} without max_running_requests: sglang "
            f"{s.sglang_version} caps every rank at {cap} running requests (a batch job's "
            f"concurrency above that waits in the queue); set max_running_requests to choose "
            f"({cited(lever.source)})"
        )
        return cap, []
    ctx.plan.decisions.append(
        Decision(what, "the rank's own, from its KV cache (not written)", _why(lever))
    )
    return None, []


def _graph_bs(ctx: Resolution, running: int | None) -> Decision:
    what, lever = "graph batch size", _lever("cuda_graph_max_bs")
    default = lever.release_default if _in_defaults_tier(ctx) else None
    if ctx.s.cuda_graph_max_bs is None:
        largest = default
        value = "the release's own (no option written)"
        note = _release_default(ctx, lever)
    else:
        flag = ctx.kb.flags.cuda_graph_max_bs
        spelling = flag.spelling(ctx.s.sglang_version) if ctx.release_known else None
        option = spelling.option if spelling is not None else None
        largest = ctx.s.cuda_graph_max_bs
        value = f"{option or 'not written'} {largest}"
        note = (
            f"cuda_graph_max_bs {ctx.where('cuda_graph_max_bs')}, spelled as sglang "
            f"{ctx.s.sglang_version} spells it"
            + (f" ({src(spelling.source)})" if spelling is not None else "")
        )
    if running is not None and largest is not None and running > largest:
        ctx.plan.warnings.append(
            f"cuda_graph_max_bs: a rank runs up to {running} requests but captures CUDA graphs "
            f"only up to {largest}; decode batches above {largest} run without graphs (slower "
            f"per step): set cuda_graph_max_bs to {running} ({cited(lever.source)})"
        )
    elif running is not None and largest is not None:
        note += f"; covers the {running} running requests"
    return Decision(what, value, _why(lever, note))


def _written_lever(ctx: Resolution, key: str, option: str, what: str) -> list[str]:
    """A lever whose setting is written as `option` when set (chunked_prefill_size,
    schedule_conservativeness): the setting, else extra_server_args, else the release's own;
    both at once is refused."""
    lever = _lever(key)
    value = getattr(ctx.s, key)
    given = _given(ctx, option)
    if value is not None and given is not None:
        ctx.error(
            f"{key} {ctx.where(key)} and extra_server_args {ctx.where('extra_server_args')} "
            f"both set {option}: keep the setting and drop it from extra_server_args"
        )
        return []
    if value is not None:
        text = f"{value:g}" if isinstance(value, float) else str(value)
        ctx.plan.decisions.append(
            Decision(what, f"{option} {text}", _why(lever, f"{key} {ctx.where(key)}"))
        )
        return [option, text]
    if given is not None:
        ctx.plan.decisions.append(Decision(what, "extra_server_args", _why(lever, "set there")))
        return []
    note = _release_default(ctx, lever)
    ctx.plan.decisions.append(
        Decision(what, "the release's own (no option written)", _why(lever, note))
    )
    return []


def _speculative(ctx: Resolution) -> Decision:
    spec, lever = ctx.s.speculative, _lever("speculative")
    if spec is None:
        return Decision("speculative decoding", "off (not written)", _why(lever))
    steps = [
        f"{name} {value}"
        for name, value in (
            ("steps", spec.num_steps),
            ("topk", spec.eagle_topk),
            ("draft tokens", spec.num_draft_tokens),
        )
        if value is not None
    ]
    value = " ".join([f"--speculative-algorithm {spec.algorithm}", *(f"({s})" for s in steps)])
    return Decision(
        "speculative decoding", value, _why(lever, f"speculative {ctx.where('speculative')}")
    )


def _weights(ctx: Resolution, arch: Architecture | None) -> Decision:
    """FP8 where the user names an FP8 checkpoint (its config.json says so); otherwise what
    an FP8 checkpoint of the same model would change, when the knowledge base knows one."""
    lever, kb, s = _lever("fp8_checkpoint"), ctx.kb, ctx.s
    known = kb.models.get(s.model_name)
    read = ctx.facts.model.quantization if ctx.facts.model is not None else None
    quant = read or (known.quantization if known is not None else None)
    if quant == "fp8":
        where = "model_source's config.json" if read else f"model_name {s.model_name}"
        return Decision(
            "weights", "fp8 (from the checkpoint; no option written)", _why(lever, where)
        )
    if quant is not None:
        return Decision(
            "weights",
            f"{quant} (from the checkpoint; no option written)",
            f"SGLang reads the quantization from the checkpoint's config.json "
            f"({cited(lever.source[:1])})",
        )
    name = arch.name if arch is not None else (known.architecture.name if known else None)
    fp8 = [
        m.name
        for m in kb.models.values()
        if m.quantization == "fp8" and (m.architecture.name == name)
    ]
    other = f"an FP8 checkpoint of this architecture: {', '.join(fp8)}" if fp8 else ""
    return Decision("weights", "as the checkpoint is (unquantized)", _why(lever, other))
