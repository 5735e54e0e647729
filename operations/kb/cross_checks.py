"""The knowledge base's cross-checks: what its schema cannot express, run on the typed
Knowledge the loader read (operations/kb/loader.py). Every problem names its key."""

from __future__ import annotations

from collections.abc import Iterator

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from operations.kb.cli_tables import cli_table_path, load_cli_table
from operations.kb.types import Knowledge, Release, in_range, version


def cross_problems(kb: Knowledge) -> Iterator[str]:
    """Cross-references a schema cannot express: names that must exist, ranges that must
    cover every release once, spellings and backends the release's own parser must accept."""
    for number, release in kb.releases.items():
        yield from (f"releases.{number}: {p}" for p in _release_problems(kb, release))
    tables = {number: load_cli_table("sglang", number) for number in kb.releases}
    for number, table in tables.items():
        if table is None:
            yield f"releases.{number}: no CLI table {cli_table_path('sglang', number)}"
    yield from _router_problems(kb)

    def caps(where: str, listed: tuple[str, ...] | None) -> Iterator[str]:
        for cap in listed or ():
            if cap not in kb.gpus:
                yield f"{where}: unknown compute capability {cap!r}"

    def backends(where: str, listed: tuple[str, ...]) -> Iterator[str]:
        for backend in listed:
            if backend not in kb.attention_backends:
                yield f"{where}: unknown backend {backend!r}"

    def choices(number: str, option: str) -> tuple[str, ...] | None:
        table = tables[number]
        entry = table.get(option) if table is not None else None
        return entry.choices if entry is not None else None

    for name, entry in kb.attention_backends.items():
        for rule in (entry.chips, *entry.by_release):
            yield from caps(f"attention_backends.{name}", rule.runs_on)
            yield from caps(f"attention_backends.{name}", rule.refused_on)
    for i, hybrid in enumerate(kb.hybrid_attention_backends):
        where = f"hybrid_attention_backends[{i}]"
        yield from backends(where, hybrid.backends)
        for number in kb.releases:
            accepted = choices(number, "--attention-backend")
            if in_range(number, hybrid.releases) and accepted is not None:
                for backend in hybrid.backends:
                    if backend not in accepted:
                        yield f"{where}: sglang {number}'s --attention-backend has no {backend!r}"
    for i, auto in enumerate(kb.auto_attention_backend):
        yield from caps(f"auto_attention_backend[{i}]", auto.compute_caps)
        yield from backends(f"auto_attention_backend[{i}]", auto.prefer)
    for i, no_buffer in enumerate(kb.mamba_no_buffer):
        for limits in (no_buffer.refuses, no_buffer.warns):
            yield from backends(f"mamba_no_buffer[{i}]", limits.attention_backends)
        for number, table in tables.items():
            if table is None or not in_range(number, no_buffer.releases):
                continue
            for added in no_buffer.adds:
                flag_entry = table.get(added)
                if flag_entry is None or flag_entry.takes_value:
                    yield f"mamba_no_buffer[{i}].adds: sglang {number} has no flag {added}"
    for number in kb.releases:
        rules = [r for r in kb.mamba_no_buffer if in_range(number, r.releases)]
        if len(rules) != 1:
            yield (
                f"mamba_no_buffer: sglang {number} falls in {len(rules)} of its ranges; "
                "every release must fall in exactly one"
            )
    for flag in kb.flags.all():
        for number in kb.releases:
            covering = [i for i, s in enumerate(flag.spellings) if in_range(number, s.releases)]
            if len(covering) != 1:
                yield (
                    f"flags.{flag.setting}: sglang {number} falls in {len(covering)} of its "
                    "ranges; every release must fall in exactly one"
                )
                continue
            option = flag.spellings[covering[0]].option
            table = tables[number]
            if option is None or table is None:
                continue
            spelled = table.get(option)
            if spelled is None or spelled.deprecated:
                found = "no" if spelled is None else "only a deprecated"
                yield (
                    f"flags.{flag.setting}[{covering[0]}]: sglang {number} has {found} option "
                    f"{option} (its CLI table)"
                )
    for i, env in enumerate(kb.rank_environment):
        yield from caps(f"rank_environment[{i}]", env.compute_caps)
    for name, lane in kb.lanes.items():
        compiler = lane.compiler
        if compiler is None:
            continue
        # The compiler builds for the lane's CUDA: a 12.9 nvcc in the 12.8 lane would emit
        # PTX the lane's oldest driver cannot load.
        if version(compiler.version).release[:2] != version(lane.cuda).release[:2]:
            yield (
                f"lanes.{name}.compiler: version {compiler.version} is not CUDA {lane.cuda}'s "
                "compiler"
            )
        if not any(a.name in ("cuda_nvcc", "nvidia-cuda-nvcc") for a in compiler.archives):
            yield f"lanes.{name}.compiler: no nvcc archive (cuda_nvcc or nvidia-cuda-nvcc)"
    strategy = kb.speculative.hybrid_requires_mamba_strategy
    for number in kb.releases:
        spelling = kb.flags.mamba_cache_strategy.spelling(number)
        accepted = choices(number, spelling.option) if spelling and spelling.option else None
        if accepted is not None and strategy not in accepted:
            yield (
                f"speculative.hybrid_requires_mamba_strategy: sglang {number} does not accept "
                f"{strategy!r} (accepted: {', '.join(accepted)})"
            )


def _router_problems(kb: Knowledge) -> Iterator[str]:
    """Each router release against its own option table (the options its health rules name,
    the control-plane option) and the releases it names; a worker state it drains into must be
    one it lists."""
    for number, router in kb.routers.items():
        where = f"routers.{number}"
        table = load_cli_table(router.package, number)
        if table is None:
            yield f"{where}: no CLI table {cli_table_path(router.package, number)}"
        named = [*(router.health.options if router.health else ())]
        named += [router.control_plane.from_option] if router.control_plane else []
        for option in named:
            entry = table.get(option) if table is not None else None
            if table is not None and (entry is None or entry.deprecated):
                yield f"{where}: {router.package} {number} has no option {option}"
        if router.drain is not None and router.drain.state not in router.worker_states:
            yield (
                f"{where}.drain.state: {router.drain.state!r} is not one of its worker_states "
                f"({', '.join(router.worker_states) or 'none listed'})"
            )
        for tested in router.engines.tested if router.engines else ():
            if tested not in kb.releases:
                yield f"{where}.engines.tested: {tested!r} is not a release of `releases`"


def _release_problems(kb: Knowledge, release: Release) -> list[str]:
    """A release's builds must be what the release asks for, with one CUDA build of torch and
    its companions per lane, from indexes and lanes that exist."""
    problems: list[str] = []
    asked: dict[str, Requirement] = {
        canonicalize_name(Requirement(r).name): Requirement(r) for r in release.requires
    }
    for build in release.builds:
        where = f"builds.{build.lane.name}"
        for package in build.packages:
            req = asked.get(package.name)
            if req is None:
                problems.append(f"{where}: {package.name} is not among the release's requires")
            elif not req.specifier.contains(Version(package.version), prereleases=True):
                problems.append(f"{where}: {package.requirement} does not satisfy {req}")
            if package.index_lane not in kb.lanes:
                problems.append(f"{where}: {package.name} reads unknown lane {package.index_lane}")
        # torchvision/torchaudio refuse to load beside a torch of another CUDA build.
        tags = {
            p.name: Version(p.version).local
            for p in build.packages
            if p.name in ("torch", "torchvision", "torchaudio")
        }
        if set(tags.values()) != {build.lane.name}:
            problems.append(
                f"{where}: torch and its companions must all be +{build.lane.name}: {tags}"
            )
        for override in build.overrides:
            if override.replaces not in release.requires:
                problems.append(f"{where}: override replaces {override.replaces!r}, not required")
        for exclude in build.excludes:
            if exclude.replaces not in release.requires:
                problems.append(f"{where}: exclude replaces {exclude.replaces!r}, not required")
            elif canonicalize_name(Requirement(exclude.replaces).name) != exclude.package:
                problems.append(f"{where}: exclude {exclude.package} replaces {exclude.replaces!r}")
    return problems
