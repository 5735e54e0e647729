"""The server's command line: the options written from settings (a renamed setting in the
pinned release's spelling), extra_server_args kept off the managed ones, and the whole line
checked against the release's own option table."""

from __future__ import annotations

from operations import layout
from operations.kb import Flag, Knowledge
from operations.kb.argv import cli_problems
from operations.plan.resolver.context import Resolution, src
from operations.plan.resolver.ranks import model_path

# Options the resolver writes from settings; extra_server_args may not set them again. Every
# spelling of a renamed setting (the knowledge base's `flags`) is managed too: managed_options.
MANAGED_OPTIONS = {
    "--model-path": "model_source",
    "--model": "model_source",
    "--served-model-name": "model_name",
    "--host": "server_host",
    "--port": "base_port",
    "--attention-backend": "attention_backend",
    "--mem-fraction-static": "mem_fraction_static",
    "--speculative-algorithm": "speculative",
    "--speculative-num-steps": "speculative",
    "--speculative-eagle-topk": "speculative",
    "--speculative-num-draft-tokens": "speculative",
    "--enable-metrics": "enable_metrics",
    "--api-key": "api_key_file",
    "--config": "api_key_file",
    "--dp-size": "dp_size",
    "--data-parallel-size": "dp_size",
    "--tp-size": "dp_size",
    "--tensor-parallel-size": "dp_size",
    "--base-gpu-id": "dp_size",
}


def managed_options(kb: Knowledge) -> dict[str, str]:
    """Every option a setting manages, with the setting's name."""
    renamed = {option: flag.setting for flag in kb.flags.all() for option in flag.options}
    return {**MANAGED_OPTIONS, **renamed}


def renamed_flag(ctx: Resolution, flag: Flag) -> str | None:
    """The option `flag`'s setting is spelled with in the pinned release."""
    if not ctx.release_known:
        return None
    spelling = flag.spelling(ctx.s.sglang_version)
    if spelling is None or spelling.option is None:
        ctx.error(
            f"{flag.setting} {ctx.where(flag.setting)}: sglang {ctx.s.sglang_version} has "
            "no option for it; leave it unset"
            + (f" ({src(spelling.source)})" if spelling is not None else "")
        )
        return None
    return spelling.option


def server_args(ctx: Resolution, hybrid: bool, backend: str | None) -> list[str]:
    s = ctx.s
    args = [
        "--model-path",
        model_path(ctx),
        "--served-model-name",
        s.model_name,
        "--host",
        s.server_host,
    ]
    if backend is not None:
        args += ["--attention-backend", backend]
    args += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
    if hybrid:
        option = renamed_flag(ctx, ctx.kb.flags.mamba_cache_strategy)
        if option:
            args += [option, s.mamba_cache_strategy]
        no_buffer = ctx.kb.no_buffer_rule(s.sglang_version) if ctx.release_known else None
        if s.mamba_cache_strategy == "no_buffer" and no_buffer is not None:
            # What the release asserts with no_buffer (e.g. the overlap schedule off from 0.5.14).
            args += [a for a in no_buffer.adds if a not in s.extra_server_args]
    if s.cuda_graph_max_bs is not None:
        option = renamed_flag(ctx, ctx.kb.flags.cuda_graph_max_bs)
        if option:
            args += [option, str(s.cuda_graph_max_bs)]
    if s.speculative is not None:
        spec = s.speculative
        rule = ctx.kb.speculative
        need = rule.hybrid_requires_mamba_strategy
        if hybrid and s.mamba_cache_strategy != need:
            ctx.error(
                f"mamba_cache_strategy {s.mamba_cache_strategy!r} "
                f"{ctx.where('mamba_cache_strategy')}: {rule.hybrid_reason}; accepted with "
                f"speculative: {need} ({src(rule.source)})"
            )
        cap = rule.hybrid_max_draft_tokens
        if hybrid and cap is not None and (spec.num_draft_tokens or 0) > cap:
            ctx.error(
                f"speculative.num_draft_tokens {spec.num_draft_tokens} "
                f"{ctx.where('speculative')}: {rule.hybrid_max_draft_tokens_reason}; accepted: "
                f"at most {cap} ({src(ctx.kb.sources_for('sglang-start-asserts'))})"
            )
        if spec.num_steps is None and (
            spec.eagle_topk is not None or spec.num_draft_tokens is not None
        ):
            ctx.error(
                f"speculative {ctx.where('speculative')}: eagle_topk and num_draft_tokens need "
                "num_steps (without it SGLang chooses all three and asserts the other two unset "
                f"at start); set num_steps, or none of the three "
                f"({src(ctx.kb.sources_for('sglang-start-asserts'))})"
            )
        args += ["--speculative-algorithm", spec.algorithm]
        for name, value in (
            ("--speculative-num-steps", spec.num_steps),
            ("--speculative-eagle-topk", spec.eagle_topk),
            ("--speculative-num-draft-tokens", spec.num_draft_tokens),
        ):
            if value is not None:
                args += [name, str(value)]
    if s.enable_metrics:
        args.append("--enable-metrics")
    if s.api_key_file:
        # The key itself travels in a root/service-user-only file, never on a command line.
        args += ["--config", layout.SECRETS_FILE]
    return args


def check_extra_args(ctx: Resolution) -> None:
    managed = managed_options(ctx.kb)
    for arg in ctx.s.extra_server_args:
        option = arg.split("=", 1)[0]
        key = managed.get(option)
        if key is None:
            continue
        ctx.error(
            f"extra_server_args {ctx.where('extra_server_args')}: {option} is managed "
            f"by the setting {key!r}; set that instead{spelled(ctx, option)}"
        )


def spelled(ctx: Resolution, option: str) -> str:
    """How the pinned release spells a renamed option, when `option` is another spelling."""
    flag = next((f for f in ctx.kb.flags.all() if option in f.options), None)
    spelling = flag.spelling(ctx.s.sglang_version) if flag and ctx.release_known else None
    if spelling is None or spelling.option == option:
        return ""
    note = f"; {spelling.note}" if spelling.note else ""
    return (
        f" (sglang {ctx.s.sglang_version} spells it {spelling.option or 'not at all'}"
        f"{note}; {src(spelling.source)})"
    )


def check_against_cli(ctx: Resolution, args: list[str], origin: str) -> None:
    """Refuse anything the pinned release's own parser would reject."""
    if ctx.table is None:
        return
    errors, warnings = cli_problems(args, ctx.table, origin)
    ctx.plan.errors.extend(errors)
    ctx.plan.warnings.extend(warnings)
