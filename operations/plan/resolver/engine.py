"""The engine release and its CUDA lane: refused when the knowledge base does not know them or
the host's driver cannot run them; otherwise the engine this host installs (its pins, indexes,
overrides and compiler), each shown as a decision."""

from __future__ import annotations

from operations import layout
from operations.facts.engine import Proven
from operations.facts.gpu import NvidiaSmi
from operations.kb import Lane, cite, in_range, version
from operations.plan.engine_spec import (
    EngineError,
    EngineSpec,
    engine_spec,
    indexes,
    redist_manifest,
)
from operations.plan.jit_cache import jit_cache_choice
from operations.plan.resolver.context import Resolution, src
from operations.plan.vocabulary import Decision
from operations.redact import redact


def check_release(ctx: Resolution) -> None:
    if ctx.release_known and ctx.table is not None:
        check_router_policy(ctx)
        return
    release = ctx.s.sglang_version
    known = ctx.kb.supported_releases()
    ctx.error(
        f"sglang_version {release!r} {ctx.where('sglang_version')} is not in the knowledge "
        f"base (known: {len(known)} releases, {known[0]} to {known[-1]}; which fit this host: "
        f"'{layout.command('releases')} INVENTORY'); to add it, run "
        f"'{layout.command('kb')} intake {release}' (see docs/how-to/add-a-release.md)"
    )


def check_router_policy(ctx: Resolution) -> None:
    """A router policy that reads an endpoint the pinned release no longer serves."""
    router = ctx.s.router
    if router is None:
        return
    for rule in ctx.kb.router_policies:
        if rule.policy == router.policy and not in_range(ctx.s.sglang_version, rule.releases):
            ctx.error(
                f"router.policy {router.policy!r} {ctx.where('router')}: {rule.reason}; "
                f"sglang {ctx.s.sglang_version} is outside {rule.releases}: choose another "
                f"policy (cache_aware, round_robin, random) ({src(rule.source)})"
            )


def driver_runs(ctx: Resolution, lane: Lane) -> bool | None:
    driver = ctx.driver()
    if driver is None or "," in driver:
        return None
    return version(driver) >= version(lane.min_driver)


def check_lane(ctx: Resolution) -> None:
    s, kb = ctx.s, ctx.kb
    lane = kb.lanes.get(s.cuda_lane)
    if lane is None:
        ctx.error(
            f"cuda_lane {s.cuda_lane!r} {ctx.where('cuda_lane')} is not a known lane; "
            f"accepted: {', '.join(kb.lanes)}"
        )
        return
    release = kb.releases.get(s.sglang_version)
    if release is None:
        return  # check_release said why
    build = release.build(s.cuda_lane)
    if build is None:
        offered = release.lanes
        message = (
            f"cuda_lane {s.cuda_lane!r} {ctx.where('cuda_lane')}: sglang {release.version} "
            f"has no {s.cuda_lane} (CUDA {lane.cuda}) lane; it offers "
            f"{', '.join(offered) or 'no known lane'}"
        )
        runnable = [n for n in offered if driver_runs(ctx, kb.lanes[n]) is not False]
        if offered and not runnable:
            needs = ", ".join(f"{n} needs driver >= {kb.lanes[n].min_driver}" for n in offered)
            message += (
                f", and this host's driver {ctx.driver()} cannot run them ({needs}): "
                f"pin a release that has a {s.cuda_lane} lane or upgrade the host driver"
            )
        ctx.error(f"{message} (source: {cite(release.source)})")
        return
    ctx.plan.decisions.append(
        Decision("CUDA lane", s.cuda_lane, f"CUDA {lane.cuda} builds of torch and kernels")
    )
    if driver_runs(ctx, lane) is False:
        ctx.error(
            f"cuda_lane {s.cuda_lane!r} {ctx.where('cuda_lane')}: the host's driver "
            f"{ctx.driver()} cannot run CUDA {lane.cuda} (needs driver >= "
            f"{lane.min_driver}) (source: {cite(lane.source)})"
        )
    gpu = ctx.facts.gpu
    banner_cuda = gpu.cuda_version if gpu is not None and gpu.ok else None
    # Within a major, minor-version compatibility lets a 12.8 driver run a 12.9 build.
    if banner_cuda is not None and version(banner_cuda).major < version(lane.cuda).major:
        ctx.error(
            f"cuda_lane {s.cuda_lane!r} {ctx.where('cuda_lane')}: nvidia-smi reports "
            f"CUDA Version {banner_cuda}; the lane's CUDA {lane.cuda} needs a CUDA "
            f"{version(lane.cuda).major} driver (source: {cite(lane.source)})"
        )
    chip = kb.gpus.get(s.gpu_compute_cap)
    if (
        chip is not None
        and banner_cuda is not None
        and version(banner_cuda) < version(chip.min_cuda)
    ):
        first = kb.lane_of_cuda(chip.min_cuda)
        branch, sources = "", chip.source
        if first is not None:
            driver = first.toolkit_driver
            branch = f" (the {driver} branch, >= {driver}, is the first for CUDA {first.cuda})"
            sources += first.source
        ctx.error(
            f"gpu_compute_cap {s.gpu_compute_cap!r}: the host's driver {ctx.driver()} runs "
            f"CUDA {banner_cuda}, but {chip.arch} ({chip.family}) needs CUDA >= "
            f"{chip.min_cuda}: upgrade the host driver{branch} (source: {cite(sources)})"
        )
    if chip is not None and version(lane.cuda) < version(chip.min_cuda):
        ctx.error(
            f"cuda_lane {s.cuda_lane!r} {ctx.where('cuda_lane')}: {chip.arch} "
            f"({chip.family}) needs CUDA >= {chip.min_cuda}; the lane's builds are CUDA "
            f"{lane.cuda}: pin a newer lane (source: {cite(chip.source)})"
        )
    plan_engine(ctx)


def plan_engine(ctx: Resolution) -> None:
    """The engine this host installs: every CUDA-bearing pin with its build and index."""
    release = ctx.kb.releases[ctx.s.sglang_version]
    # The engine is locked and built for the host's own Python; one outside the release's
    # is preflight's failure (the host is refused), so the plan shows the release's first.
    host_python = ctx.facts.python
    minor = release.python.minor_of(host_python) if host_python else None
    read = ctx.s.controller_files.redist_manifest
    try:
        manifest = redist_manifest(read) if ctx.s.cuda_redist_manifest and read else None
        spec = engine_spec(ctx.s, ctx.kb, minor, manifest)
    except EngineError as exc:
        ctx.error(f"{exc} {ctx.where('cuda_redist_manifest')}")
        return
    ctx.plan.engine = spec
    explain_compiler(ctx, spec)
    found = f"the host's python3 is {host_python}" if host_python else "host not asked"
    ctx.plan.decisions.append(
        Decision(
            "engine python",
            f"{spec.python} ({spec.python_tag}, locked for it alone)",
            f"{found}; sglang {spec.release} is built for "
            f"{', '.join(release.python.versions)}: {release.python.why} "
            f"({src(release.python.source)})",
        )
    )
    urls = {index.name: redact(index.url) for index in indexes(ctx.s, spec)}
    main = redact(ctx.s.package_index_url or "") or "the installer's default index (PyPI)"
    for pin in spec.pins:
        where = urls[pin.index_name] if pin.index_name else main
        ctx.plan.decisions.append(Decision("engine pin", pin.requirement, f"only from {where}"))
    ctx.plan.decisions.append(
        Decision("engine pin", f"sglang=={spec.release}", f"and everything else only from {main}")
    )
    jit = jit_cache_choice(ctx.s, ctx.kb, spec.release, spec.lane)
    ctx.plan.decisions.append(
        Decision("prebuilt kernels", jit.value, f"{jit.why} (source: {'; '.join(jit.sources)})")
    )
    build = release.build(spec.lane)
    for override in build.overrides if build else ():
        ctx.plan.decisions.append(
            Decision(
                "engine override",
                override.requirement,
                f"replaces the release's {override.replaces} ({src(override.source)})",
            )
        )
    for exclude in build.excludes if build else ():
        ctx.plan.decisions.append(
            Decision(
                "engine exclude",
                exclude.package,
                f"the release's {exclude.replaces} is left out: no build for "
                f"{spec.lane} ({src(exclude.source)})",
            )
        )
    record = ctx.facts.proven.get(spec.name)
    if record is not None and proven_here(record, ctx.facts.gpu):
        ctx.plan.decisions.append(proven_decision(record, spec))
        return
    for what in spec.unproven:
        ctx.plan.warnings.append(
            f"sglang {spec.release} on {spec.lane} is unproven: {what}; the engine check "
            "settles it on this host's GPUs before any rank uses it"
        )


# The decision reads "proven  on this host's GPUs on DATE (the engine check)" in the plan.
PROVEN = "proven"
ON_GPUS = "on this host's GPUs on "


def proven_here(record: Proven, gpu: NvidiaSmi | None) -> bool:
    """The engine check passed on the GPUs the host has now: the same names, by index, under
    the same driver (a GPU or a driver changed since is unproven again)."""
    if gpu is None or not gpu.ok:
        return False
    now = [g.name for g in sorted(gpu.gpus, key=lambda g: g.index)]
    return record["gpus"] == now and record["driver"] == gpu.driver_version


def proven_decision(record: Proven, spec: EngineSpec) -> Decision:
    """What the plan says of an engine the check passed in on this host's GPUs, instead of
    warning that its unproven parts are."""
    gpus = record["gpus"]
    names = ", ".join(sorted(set(gpus)))
    settled = "; ".join(spec.unproven) or "nothing was unproven"
    return Decision(
        PROVEN,
        f"{ON_GPUS}{record['date']} (the engine check)",
        f"the engine check passed as {record['user']} on {len(gpus)} x {names}, driver "
        f"{record['driver']} ({layout.ENGINE_PROVEN} beside the environment); what it settled: "
        f"{settled}",
    )


def explain_compiler(ctx: Resolution, spec: EngineSpec) -> None:
    """The compiler every rank's JIT builds use: the plan shows where it comes from."""
    tools = spec.toolkit
    lane = ctx.kb.lanes[spec.lane]
    if tools is None or lane.compiler is None:
        return
    names = ", ".join(f"{a.name} {a.version}" for a in tools.archives)
    where = f"{redact(tools.url)}" if not ctx.s.wheelhouse else "the wheelhouse's cuda-redist/"
    ctx.plan.decisions.append(
        Decision(
            "engine compiler",
            f"nvcc {tools.version} -> CUDA_HOME {tools.home(ctx.s.engine_root)}",
            f"{names} from {where}, each checked against the sha256 of {tools.checksums}: "
            f"{lane.compiler.why} ({src(lane.compiler.source)})",
        )
    )
    if tools.placeholder:
        ctx.error(
            f"cuda_lane {ctx.s.cuda_lane!r}: the knowledge base has no real checksum for "
            f"nvcc {tools.version}'s archives (a placeholder): no compiler can be installed "
            "for this lane until operations/kb/knowledge/sglang.yaml lists them"
        )
    if ctx.s.cuda_redist_manifest:
        ctx.plan.warnings.append(
            f"cuda_redist_manifest {ctx.s.cuda_redist_manifest}: nvcc {tools.version}'s "
            "archives are checked against that file, not the knowledge base's checksums"
        )
