"""Each rank: its argv, environment and unit, naming the engine environment and the staged model
copy it runs by path."""

from __future__ import annotations

from operations import layout
from operations.plan.engine_spec import engine_spec
from operations.plan.resolver.caches import CacheVariable, cache_environment
from operations.plan.resolver.context import Resolution, src
from operations.plan.resolver.types import Rank
from operations.plan.vocabulary import Decision
from operations.render import units


def ranks(ctx: Resolution, args: list[str]) -> None:
    s = ctx.s
    if s.dp_size > s.gpu_count:
        ctx.error(
            f"dp_size {s.dp_size} {ctx.where('dp_size')} is more than gpu_count "
            f"{s.gpu_count} {ctx.where('gpu_count')}: one rank per GPU; accepted: 1 to "
            f"{s.gpu_count}"
        )
        return
    if s.base_port + s.dp_size - 1 > 65535:
        ctx.error(f"base_port {s.base_port} {ctx.where('base_port')}: ranks run past 65535")
        return
    tree = layout.EngineTree(s.engine_root)
    env = tree.env(engine_name(ctx))
    cache = tree.compile_cache(engine_name(ctx))
    python = layout.env_python(env)
    copy = model_path(ctx)
    for rank in range(s.dp_size):
        port = s.base_port + rank
        argv = [python, "-m", "sglang.launch_server", *args, "--port", str(port)]
        environment = {"CUDA_VISIBLE_DEVICES": str(rank), **rank_environment(ctx)}
        unit = units.rank_unit(
            rank=rank,
            gpu=rank,
            port=port,
            model_name=s.model_name,
            user=s.service_user,
            env=environment,
            argv=argv,
            device_nodes=ctx.facts.device_nodes,
            drain_timeout_s=s.drain_timeout_s,
            compile_cache=cache,
        )
        ctx.plan.ranks.append(
            Rank(
                rank,
                rank,
                port,
                argv,
                environment,
                layout.unit_name(rank),
                unit,
                engine_env=env,
                model_path=copy,
            )
        )


def rank_environment(ctx: Resolution) -> dict[str, str]:
    """What every rank sets: the engine's compiler (SGLang's tvm-ffi runs
    $CUDA_HOME/bin/nvcc, FlashInfer the nvcc on PATH) and the knowledge base's variables
    for this release, GPU, compiler and driver."""
    s = ctx.s
    spec = ctx.plan.engine
    found: dict[str, str] = {v.variable: v.value for v in _caches(ctx)}
    if spec is not None and spec.toolkit is not None:
        home = spec.toolkit.home(s.engine_root)
        found |= {"CUDA_HOME": home, "PATH": f"{home}/bin:{layout.SYSTEMD_PATH}"}
    rules = ctx.kb.rank_environment_for(
        s.sglang_version, s.gpu_compute_cap, s.cuda_lane, ctx.single_driver()
    )
    return {**found, **{r.variable: r.value for r in rules}}


def _caches(ctx: Resolution) -> list[CacheVariable]:
    base = layout.EngineTree(ctx.s.engine_root).compile_cache(engine_name(ctx))
    return cache_environment(ctx.kb, ctx.s.sglang_version, base)


def explain_environment(ctx: Resolution) -> None:
    s = ctx.s
    for v in _caches(ctx):
        ctx.plan.decisions.append(
            Decision("compile cache", f"{v.variable}={v.value}", f"{v.why} (source: {v.source})")
        )
    for r in ctx.kb.rank_environment_for(
        s.sglang_version, s.gpu_compute_cap, s.cuda_lane, ctx.single_driver()
    ):
        ctx.plan.decisions.append(
            Decision("rank environment", f"{r.variable}={r.value}", f"{r.why} ({src(r.source)})")
        )


def engine_name(ctx: Resolution) -> str:
    """The environment the engine step installs for these settings (its EngineSpec)."""
    spec = ctx.plan.engine or engine_spec(ctx.s, ctx.kb)
    return spec.name


def model_path(ctx: Resolution) -> str:
    """The staged copy the ranks read: by its key, so a unit names exactly what it runs."""
    key = ctx.facts.model_key
    if key is None:
        return layout.staged_model_link(ctx.s)
    return layout.staged_copy(ctx.s, key)
