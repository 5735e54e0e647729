"""One host's resolution, check by check in the order the plan shows its decisions: the
release and lane (and so the engine), the GPU, the model and its weights, the attention
backend, the command line (its start-up and throughput levers), and then each rank."""

from __future__ import annotations

from operations import kb as kbmod
from operations.kb import Knowledge
from operations.plan.resolver.args import (
    check_against_cli,
    check_extra_args,
    server_args,
)
from operations.plan.resolver.backend import attention_backend, check_no_buffer
from operations.plan.resolver.clients import clients
from operations.plan.resolver.context import Resolution
from operations.plan.resolver.engine import check_lane, check_release
from operations.plan.resolver.model import check_weights, gpu_entry, model_architecture
from operations.plan.resolver.ranks import explain_environment, ranks
from operations.plan.resolver.startup_levers import startup_levers
from operations.plan.resolver.throughput import throughput_levers
from operations.plan.resolver.types import Facts, ResolvedHost
from operations.settings import Settings


def run(ctx: Resolution) -> ResolvedHost:
    check_release(ctx)
    check_lane(ctx)
    gpu_entry(ctx)
    arch = model_architecture(ctx)
    check_weights(ctx)
    hybrid = arch is not None and arch.hybrid_linear_attention
    backend = attention_backend(ctx, hybrid)
    if hybrid:
        check_no_buffer(ctx, backend)
    check_extra_args(ctx)
    args = server_args(ctx, hybrid, backend) + startup_levers(ctx, arch)
    args += throughput_levers(ctx, arch)
    check_against_cli(ctx, args, "resolved command line")
    check_against_cli(ctx, list(ctx.s.extra_server_args), "extra_server_args")
    if ctx.plan.errors:
        return ctx.plan
    if ctx.facts.model_key is None:
        ctx.plan.warnings.append(
            f"model_source {ctx.s.model_source}: its staged copy is not known until the "
            "source is readable; the ranks are shown reading the model link"
        )
    explain_environment(ctx)
    ranks(ctx, args + list(ctx.s.extra_server_args))
    clients(ctx)
    return ctx.plan


def resolve(
    settings: Settings, facts: Facts | None = None, kb: Knowledge | None = None
) -> ResolvedHost:
    return run(Resolution(settings, facts or Facts(), kb or kbmod.load()))
