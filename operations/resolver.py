"""The resolver: (settings, host facts) -> what each rank runs, or why it cannot.

This is the one place where flags, the attention backend and the CUDA lane are decided. It is a
pure function: tests feed it facts directly, the plan command and deploy.py feed it facts
gathered by pyinfra, and so what the plan shows is exactly what a deploy writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from operations import kb as kbmod
from operations import layout, units
from operations.argv import cli_problems
from operations.engine_spec import (
    EngineError,
    EngineSpec,
    engine_spec,
    indexes,
    read_redist_manifest,
)
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model
from operations.kb import Architecture, Cites, Flag, Gpu, Knowledge, Lane, cite, version
from operations.redact import redact
from operations.settings import Settings

if TYPE_CHECKING:
    from operations.roll import ServeJson

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


@dataclass(frozen=True)
class Facts:
    """What the resolver knows of the host; None means not gathered (plan from settings)."""

    gpu: NvidiaSmi | None = None
    model: Model | None = None
    # The key of the staged copy this model's source makes (host_plan.model_key): the ranks
    # name STAGE_DIR/models/.SLUG@KEY. None: not known yet; the ranks name the model link.
    model_key: str | None = None
    # /dev/nvidia* nodes present (HostResources); None: not gathered.
    device_nodes: tuple[str, ...] | None = None
    # The host's python3 version ("3.11.2", HostResources); None: not gathered.
    python: str | None = None


@dataclass(frozen=True)
class Decision:
    what: str
    value: str
    why: str


@dataclass(frozen=True)
class Rank:
    rank: int
    gpu: int
    port: int
    argv: list[str]
    env: dict[str, str]
    unit_name: str
    unit: str
    # What the unit runs: the engine environment and the staged model copy, by path.
    engine_env: str = ""
    model_path: str = ""


@dataclass
class HostPlan:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    ranks: list[Rank] = field(default_factory=list)
    # The engine environment this host installs (None when the release or lane is refused).
    engine: EngineSpec | None = None

    def to_json(self) -> PlanJson:
        return {
            "errors": self.errors,
            "warnings": self.warnings,
            "decisions": [{"what": d.what, "value": d.value, "why": d.why} for d in self.decisions],
            "engine": _engine_json(self.engine),
            "ranks": [
                {
                    "rank": r.rank,
                    "argv": r.argv,
                    "env": r.env,
                    "unit": r.unit,
                    "engine_env": r.engine_env,
                    "model_path": r.model_path,
                }
                for r in self.ranks
            ],
        }


class DecisionJson(TypedDict):
    what: str
    value: str
    why: str


class PinJson(TypedDict):
    requirement: str
    index: str
    index_lane: str


class EngineJson(TypedDict):
    name: str
    requirements: list[str]
    pins: list[PinJson]
    overrides: list[str]
    excludes: list[str]
    python: str
    unproven: list[str]


class RankJson(TypedDict):
    rank: int
    argv: list[str]
    env: dict[str, str]
    unit: str
    engine_env: str
    model_path: str


class RouterJson(TypedDict):
    argv: list[str]
    unit: str


class TargetGroupJson(TypedDict):
    """One Prometheus file_sd target group (operations/monitoring.py)."""

    targets: list[str]
    labels: dict[str, str]


class MonitoringJson(TypedDict):
    targets_file: str
    dashboard_file: str
    targets: list[TargetGroupJson]


class PlanJson(TypedDict):
    """One host's plan as `python -m operations.plan --json` prints it."""

    errors: list[str]
    warnings: list[str]
    decisions: list[DecisionJson]
    engine: EngineJson | None
    ranks: list[RankJson]
    router: NotRequired[RouterJson]
    monitoring: NotRequired[MonitoringJson]
    # The HostReport's decisions on the host's state (host_plan.py): the staged copy's key,
    # how it is staged, and what the serve and smoke steps do (operations/roll.py).
    model_key: NotRequired[str | None]
    staging: NotRequired[StagingJson]
    serve: NotRequired[ServeJson]


class StagingJson(TypedDict):
    mode: str
    what: str
    why: str
    key: str | None
    keep: list[str]
    source_pending: bool


def _engine_json(spec: EngineSpec | None) -> EngineJson | None:
    if spec is None:
        return None
    return {
        "name": spec.name,
        "requirements": list(spec.requirements),
        "pins": [
            {"requirement": p.requirement, "index": p.index, "index_lane": p.index_lane}
            for p in spec.pins
        ],
        "overrides": list(spec.overrides),
        "excludes": list(spec.excludes),
        "python": spec.python,
        "unproven": list(spec.unproven),
    }


def _src(sources: Cites) -> str:
    return f"source: {cite(sources)}"


class _Resolution:
    """One host's resolution: collects errors instead of stopping at the first."""

    def __init__(self, settings: Settings, facts: Facts, kb: Knowledge) -> None:
        self.s = settings
        self.facts = facts
        self.kb = kb
        self.plan = HostPlan()
        self.release_known = settings.sglang_version in kb.releases
        self.table = kb.cli_table("sglang", settings.sglang_version)

    def error(self, message: str) -> None:
        self.plan.errors.append(message)

    def where(self, key: str) -> str:
        return f"(set in {self.s.origin(key)})"

    # -- engine release and CUDA lane --------------------------------------------------------

    def check_release(self) -> None:
        if self.release_known and self.table is not None:
            return
        release = self.s.sglang_version
        supported = ", ".join(self.kb.supported_releases())
        self.error(
            f"sglang_version {release!r} {self.where('sglang_version')} is not in the knowledge "
            f"base (supported: {supported}); to add it, run "
            f"'python scripts/gen_cli_table.py sglang {release}' and add a 'releases' entry in "
            "operations/knowledge/sglang.yaml (see operations/knowledge/cli/README.md)"
        )

    def driver(self) -> str | None:
        gpu = self.facts.gpu
        return gpu.driver_version if gpu is not None and gpu.ok else None

    def single_driver(self) -> str | None:
        """The driver version when every GPU reports the same one; None when not known."""
        driver = self.driver()
        return None if driver is None or "," in driver else driver

    def driver_runs(self, lane: Lane) -> bool | None:
        driver = self.driver()
        if driver is None or "," in driver:
            return None
        return version(driver) >= version(lane.min_driver)

    def check_lane(self) -> None:
        s, kb = self.s, self.kb
        lane = kb.lanes.get(s.cuda_lane)
        if lane is None:
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')} is not a known lane; "
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
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: sglang {release.version} "
                f"has no {s.cuda_lane} (CUDA {lane.cuda}) lane; it offers "
                f"{', '.join(offered) or 'no known lane'}"
            )
            runnable = [n for n in offered if self.driver_runs(kb.lanes[n]) is not False]
            if offered and not runnable:
                needs = ", ".join(f"{n} needs driver >= {kb.lanes[n].min_driver}" for n in offered)
                message += (
                    f", and this host's driver {self.driver()} cannot run them ({needs}): "
                    f"pin a release that has a {s.cuda_lane} lane or upgrade the host driver"
                )
            self.error(f"{message} (source: {cite(release.source)})")
            return
        self.plan.decisions.append(
            Decision("CUDA lane", s.cuda_lane, f"CUDA {lane.cuda} builds of torch and kernels")
        )
        if self.driver_runs(lane) is False:
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: the host's driver "
                f"{self.driver()} cannot run CUDA {lane.cuda} (needs driver >= "
                f"{lane.min_driver}) (source: {cite(lane.source)})"
            )
        gpu = self.facts.gpu
        banner_cuda = gpu.cuda_version if gpu is not None and gpu.ok else None
        # Within a major, minor-version compatibility lets a 12.8 driver run a 12.9 build.
        if banner_cuda is not None and version(banner_cuda).major < version(lane.cuda).major:
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: nvidia-smi reports "
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
            self.error(
                f"gpu_compute_cap {s.gpu_compute_cap!r}: the host's driver {self.driver()} runs "
                f"CUDA {banner_cuda}, but {chip.arch} ({chip.family}) needs CUDA >= "
                f"{chip.min_cuda}: upgrade the host driver{branch} (source: {cite(sources)})"
            )
        if chip is not None and version(lane.cuda) < version(chip.min_cuda):
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: {chip.arch} "
                f"({chip.family}) needs CUDA >= {chip.min_cuda}; the lane's builds are CUDA "
                f"{lane.cuda}: pin a newer lane (source: {cite(chip.source)})"
            )
        self.plan_engine()

    def plan_engine(self) -> None:
        """The engine this host installs: every CUDA-bearing pin with its build and index."""
        release = self.kb.releases[self.s.sglang_version]
        # The engine is locked and built for the host's own Python; one outside the release's
        # is preflight's failure (the host is refused), so the plan shows the release's first.
        host_python = self.facts.python
        minor = release.python.minor_of(host_python) if host_python else None
        manifest_path = self.s.cuda_redist_manifest
        try:
            manifest = read_redist_manifest(manifest_path) if manifest_path else None
            spec = engine_spec(self.s, self.kb, minor, manifest)
        except EngineError as exc:
            self.error(f"{exc} {self.where('cuda_redist_manifest')}")
            return
        self.plan.engine = spec
        self.explain_compiler(spec)
        found = f"the host's python3 is {host_python}" if host_python else "host not asked"
        self.plan.decisions.append(
            Decision(
                "engine python",
                f"{spec.python} ({spec.python_tag}, locked for it alone)",
                f"{found}; sglang {spec.release} is built for "
                f"{', '.join(release.python.versions)}: {release.python.why} "
                f"({_src(release.python.source)})",
            )
        )
        urls = {index.name: redact(index.url) for index in indexes(self.s, spec)}
        main = redact(self.s.package_index_url or "") or "the installer's default index (PyPI)"
        for pin in spec.pins:
            where = urls[pin.index_name] if pin.index_name else main
            self.plan.decisions.append(
                Decision("engine pin", pin.requirement, f"only from {where}")
            )
        self.plan.decisions.append(
            Decision(
                "engine pin", f"sglang=={spec.release}", f"and everything else only from {main}"
            )
        )
        build = release.build(spec.lane)
        for override in build.overrides if build else ():
            self.plan.decisions.append(
                Decision(
                    "engine override",
                    override.requirement,
                    f"replaces the release's {override.replaces} ({_src(override.source)})",
                )
            )
        for exclude in build.excludes if build else ():
            self.plan.decisions.append(
                Decision(
                    "engine exclude",
                    exclude.package,
                    f"the release's {exclude.replaces} is left out: no build for "
                    f"{spec.lane} ({_src(exclude.source)})",
                )
            )
        for what in spec.unproven:
            self.plan.warnings.append(
                f"sglang {spec.release} on {spec.lane} is unproven: {what}; the engine check "
                "settles it on this host's GPUs before any rank uses it"
            )

    # -- GPU and model ----------------------------------------------------------------------

    def gpu_entry(self) -> Gpu | None:
        cap = self.s.gpu_compute_cap
        entry = self.kb.gpus.get(cap)
        if entry is None:
            self.error(
                f"gpu_compute_cap {cap!r} {self.where('gpu_compute_cap')} is not in the knowledge "
                f"base; accepted: {', '.join(self.kb.gpus)}"
            )
        return entry

    def model_architecture(self) -> Architecture | None:
        """The architecture entry of the model, after checking the release serves it."""
        s, kb = self.s, self.kb
        known = kb.models.get(s.model_name)
        model = self.facts.model
        arch = model.architecture if model is not None and model.architecture else None
        if arch is None and known is not None:
            arch = known.architecture.name
        if arch is None:
            self.plan.warnings.append(
                f"model {s.model_name!r}: architecture unknown until model_source "
                f"{s.model_source} holds a config.json; model support is not checked yet"
            )
            return None
        entry = kb.architectures.get(arch)
        if entry is None:
            self.error(
                f"model_name {s.model_name!r} {self.where('model_name')}: architecture {arch} is "
                "not in the knowledge base; add it under 'architectures' in "
                "operations/knowledge/sglang.yaml with the first release that serves it"
            )
            return None
        release = s.sglang_version
        if version(release) < version(entry.first_release):
            self.error(
                f"sglang_version {release!r} {self.where('sglang_version')} does not serve "
                f"{arch} ({s.model_name}): first served by sglang {entry.first_release} "
                f"({_src(entry.source)})"
            )
        elif (
            known is not None
            and known.min_release is not None
            and version(release) < version(known.min_release)
        ):
            self.error(
                f"sglang_version {release!r} {self.where('sglang_version')} cannot serve "
                f"{s.model_name}: it needs sglang >= {known.min_release} ({_src(known.source)})"
            )
        return entry

    def check_weights(self) -> None:
        """The weights decide what is served: the source's config.json must be the model that
        model_name names in the knowledge base (architecture, quantization), or clients get
        other weights under that name."""
        s, kb = self.s, self.kb
        known = kb.models.get(s.model_name)
        model = self.facts.model
        if known is None or model is None or model.architecture is None:
            return
        theirs = f"model_source {s.model_source} holds"
        if model.size_bytes:
            theirs += f" {model.size_bytes / 1024**3:.1f} GiB of"
        theirs += f" {model.architecture} weights"
        theirs += (
            f" quantized {model.quantization}" if model.quantization else " with no quantization"
        )
        ours = f"{known.architecture.name} weights"
        ours += (
            f" quantized {known.quantization}" if known.quantization else " with no quantization"
        )
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
        self.error(
            f"model_name {s.model_name!r} {self.where('model_name')} names {ours} in the knowledge "
            f"base ({_src(known.source)}), but {theirs} (its config.json): {fix}"
        )

    # -- attention backend ------------------------------------------------------------------

    def backend_refusals(self, backend: str, hybrid: bool) -> list[str]:
        """Why `backend` cannot run here; empty when it can."""
        s, kb = self.s, self.kb
        cap = s.gpu_compute_cap
        chip = kb.gpus.get(cap)
        arch = chip.arch if chip else cap
        chips = kb.backend_rule(backend, s.sglang_version)
        if chips is None:
            return [
                f"{backend!r} is not a known backend (known: {', '.join(kb.attention_backends)})"
            ]
        reasons = []
        if chips.refuses(cap):
            reasons.append(f"{chips.reason}; this GPU is {arch} ({_src(chips.source)})")
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
                    f"models{why} ({_src(rule.source)})"
                )
        spec = kb.speculative
        if backend == "flashinfer" and s.speculative is not None and self.release_known:
            flashinfer = kb.releases[s.sglang_version].pin("flashinfer-python") or "0"
            if version(flashinfer) <= version(spec.flashinfer_newer_than):
                reasons.append(
                    f"{spec.flashinfer_reason}; sglang {s.sglang_version} pins flashinfer "
                    f"{flashinfer} ({_src(spec.source)})"
                )
        if self.table is not None:
            option = self.table.get("--attention-backend")
            if option is not None and option.choices is not None and backend not in option.choices:
                reasons.append(
                    f"sglang {s.sglang_version}'s --attention-backend has no {backend!r}"
                )
        return reasons

    def runnable_backends(self, hybrid: bool) -> list[str]:
        """Every backend that runs with this release on this GPU (for this model)."""
        return [b for b in self.kb.attention_backends if not self.backend_refusals(b, hybrid)]

    def attention_backend(self, hybrid: bool) -> str | None:
        s, kb = self.s, self.kb
        if not self.release_known or self.table is None:
            return None  # check_release said why; any backend error would only follow from it
        if s.attention_backend != "auto":
            reasons = self.backend_refusals(s.attention_backend, hybrid)
            if reasons:
                runnable = self.runnable_backends(hybrid)
                choose = (
                    f"backends that run here: {', '.join(runnable)} (or auto)"
                    if runnable
                    else "no backend runs here"
                )
                self.error(
                    f"attention_backend {s.attention_backend!r} "
                    f"{self.where('attention_backend')} cannot run with sglang "
                    f"{s.sglang_version} on compute capability {s.gpu_compute_cap}: "
                    + "; ".join(reasons)
                    + f"; {choose}"
                )
                return None
            self.plan.decisions.append(Decision("attention backend", s.attention_backend, "set"))
            return s.attention_backend
        rule = kb.auto_rule(s.gpu_compute_cap)
        if rule is None:
            self.error(
                f"attention_backend 'auto': the knowledge base has no preference for compute "
                f"capability {s.gpu_compute_cap}; set attention_backend explicitly"
            )
            return None
        skipped: list[str] = []
        for backend in rule.prefer:
            reasons = self.backend_refusals(backend, hybrid)
            if not reasons:
                why = rule.why + (f"; skipped {'; '.join(skipped)}" if skipped else "")
                self.plan.decisions.append(
                    Decision("attention backend", backend, f"auto: {why} ({_src(rule.source)})")
                )
                if skipped:
                    self.plan.warnings.append(
                        f"attention_backend auto chose {backend}: skipped {'; '.join(skipped)}"
                    )
                return backend
            skipped.append(f"{backend} ({reasons[0]})")
        self.error(
            f"attention_backend 'auto': no backend runs with sglang {s.sglang_version} on "
            f"compute capability {s.gpu_compute_cap}: {'; '.join(skipped)}"
        )
        return None

    def check_no_buffer(self, backend: str | None) -> None:
        """What the no_buffer Mamba cache strategy asserts in this release."""
        s = self.s
        rule = self.kb.no_buffer_rule(s.sglang_version)
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
                f"mamba_cache_strategy 'no_buffer' {self.where('mamba_cache_strategy')} with "
                f"{' and '.join(hits)} on sglang {s.sglang_version}: {rule.reason} "
                f"({_src(rule.source)})"
            )
            if found:
                self.error(message + "; use extra_buffer, or another backend and page size")
            else:
                self.plan.warnings.append(message + "; SGLang changes it at start-up")

    # -- renamed flags ----------------------------------------------------------------------

    def renamed_flag(self, flag: Flag) -> str | None:
        """The option `flag`'s setting is spelled with in the pinned release."""
        if not self.release_known:
            return None
        spelling = flag.spelling(self.s.sglang_version)
        if spelling is None or spelling.option is None:
            self.error(
                f"{flag.setting} {self.where(flag.setting)}: sglang {self.s.sglang_version} has "
                "no option for it; leave it unset"
                + (f" ({_src(spelling.source)})" if spelling is not None else "")
            )
            return None
        return spelling.option

    # -- the command line -------------------------------------------------------------------

    def server_args(self, hybrid: bool, backend: str | None) -> list[str]:
        s = self.s
        args = [
            "--model-path",
            self.model_path(),
            "--served-model-name",
            s.model_name,
            "--host",
            s.server_host,
        ]
        if backend is not None:
            args += ["--attention-backend", backend]
        args += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
        if hybrid:
            option = self.renamed_flag(self.kb.flags.mamba_cache_strategy)
            if option:
                args += [option, s.mamba_cache_strategy]
        if s.cuda_graph_max_bs is not None:
            option = self.renamed_flag(self.kb.flags.cuda_graph_max_bs)
            if option:
                args += [option, str(s.cuda_graph_max_bs)]
        if s.speculative is not None:
            spec = s.speculative
            rule = self.kb.speculative
            need = rule.hybrid_requires_mamba_strategy
            if hybrid and s.mamba_cache_strategy != need:
                self.error(
                    f"mamba_cache_strategy {s.mamba_cache_strategy!r} "
                    f"{self.where('mamba_cache_strategy')}: {rule.hybrid_reason}; accepted with "
                    f"speculative: {need} ({_src(rule.source)})"
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

    def check_extra_args(self) -> None:
        managed = managed_options(self.kb)
        for arg in self.s.extra_server_args:
            option = arg.split("=", 1)[0]
            key = managed.get(option)
            if key is None:
                continue
            self.error(
                f"extra_server_args {self.where('extra_server_args')}: {option} is managed "
                f"by the setting {key!r}; set that instead{self.spelled(option)}"
            )

    def spelled(self, option: str) -> str:
        """How the pinned release spells a renamed option, when `option` is another spelling."""
        flag = next((f for f in self.kb.flags.all() if option in f.options), None)
        spelling = flag.spelling(self.s.sglang_version) if flag and self.release_known else None
        if spelling is None or spelling.option == option:
            return ""
        note = f"; {spelling.note}" if spelling.note else ""
        return (
            f" (sglang {self.s.sglang_version} spells it {spelling.option or 'not at all'}"
            f"{note}; {_src(spelling.source)})"
        )

    def check_against_cli(self, args: list[str], origin: str) -> None:
        """Refuse anything the pinned release's own parser would reject."""
        if self.table is None:
            return
        errors, warnings = cli_problems(args, self.table, origin)
        self.plan.errors.extend(errors)
        self.plan.warnings.extend(warnings)

    # -- ranks --------------------------------------------------------------------------------

    def ranks(self, args: list[str]) -> None:
        s = self.s
        if s.dp_size > s.gpu_count:
            self.error(
                f"dp_size {s.dp_size} {self.where('dp_size')} is more than gpu_count "
                f"{s.gpu_count} {self.where('gpu_count')}: one rank per GPU; accepted: 1 to "
                f"{s.gpu_count}"
            )
            return
        if s.base_port + s.dp_size - 1 > 65535:
            self.error(f"base_port {s.base_port} {self.where('base_port')}: ranks run past 65535")
            return
        env = layout.engine_env(s.engine_root, self.engine_name())
        python = layout.env_python(env)
        model_path = self.model_path()
        for rank in range(s.dp_size):
            port = s.base_port + rank
            argv = [python, "-m", "sglang.launch_server", *args, "--port", str(port)]
            environment = {"CUDA_VISIBLE_DEVICES": str(rank), **self.rank_environment()}
            unit = units.rank_unit(
                rank=rank,
                gpu=rank,
                port=port,
                model_name=s.model_name,
                user=s.service_user,
                env=environment,
                argv=argv,
                device_nodes=self.facts.device_nodes,
                drain_timeout_s=s.drain_timeout_s,
            )
            self.plan.ranks.append(
                Rank(
                    rank,
                    rank,
                    port,
                    argv,
                    environment,
                    layout.unit_name(rank),
                    unit,
                    engine_env=env,
                    model_path=model_path,
                )
            )

    def explain_compiler(self, spec: EngineSpec) -> None:
        """The compiler every rank's JIT builds use: the plan shows where it comes from."""
        tools = spec.toolkit
        lane = self.kb.lanes[spec.lane]
        if tools is None or lane.compiler is None:
            return
        names = ", ".join(f"{a.name} {a.version}" for a in tools.archives)
        where = f"{redact(tools.url)}" if not self.s.wheelhouse else "the wheelhouse's cuda-redist/"
        self.plan.decisions.append(
            Decision(
                "engine compiler",
                f"nvcc {tools.version} -> CUDA_HOME {tools.home(self.s.engine_root)}",
                f"{names} from {where}, each checked against the sha256 of {tools.checksums}: "
                f"{lane.compiler.why} ({_src(lane.compiler.source)})",
            )
        )
        if tools.placeholder:
            self.error(
                f"cuda_lane {self.s.cuda_lane!r}: the knowledge base has no real checksum for "
                f"nvcc {tools.version}'s archives (a placeholder): no compiler can be installed "
                "for this lane until operations/knowledge/sglang.yaml lists them"
            )
        if self.s.cuda_redist_manifest:
            self.plan.warnings.append(
                f"cuda_redist_manifest {self.s.cuda_redist_manifest}: nvcc {tools.version}'s "
                "archives are checked against that file, not the knowledge base's checksums"
            )

    def rank_environment(self) -> dict[str, str]:
        """What every rank sets: the engine's compiler (SGLang's tvm-ffi runs
        $CUDA_HOME/bin/nvcc, FlashInfer the nvcc on PATH) and the knowledge base's variables
        for this release, GPU, compiler and driver."""
        s = self.s
        spec = self.plan.engine
        found: dict[str, str] = {}
        if spec is not None and spec.toolkit is not None:
            home = spec.toolkit.home(s.engine_root)
            found = {"CUDA_HOME": home, "PATH": f"{home}/bin:{layout.SYSTEMD_PATH}"}
        rules = self.kb.rank_environment_for(
            s.sglang_version, s.gpu_compute_cap, s.cuda_lane, self.single_driver()
        )
        return {**found, **{r.variable: r.value for r in rules}}

    def explain_environment(self) -> None:
        s = self.s
        for r in self.kb.rank_environment_for(
            s.sglang_version, s.gpu_compute_cap, s.cuda_lane, self.single_driver()
        ):
            self.plan.decisions.append(
                Decision(
                    "rank environment", f"{r.variable}={r.value}", f"{r.why} ({_src(r.source)})"
                )
            )

    def engine_name(self) -> str:
        """The environment the engine step installs for these settings (its EngineSpec)."""
        spec = self.plan.engine or engine_spec(self.s, self.kb)
        return spec.name

    def model_path(self) -> str:
        """The staged copy the ranks read: by its key, so a unit names exactly what it runs."""
        key = self.facts.model_key
        if key is None:
            return layout.staged_model_link(self.s)
        return layout.staged_copy(self.s, key)

    def run(self) -> HostPlan:
        self.check_release()
        self.check_lane()
        self.gpu_entry()
        arch = self.model_architecture()
        self.check_weights()
        hybrid = arch is not None and arch.hybrid_linear_attention
        backend = self.attention_backend(hybrid)
        if hybrid:
            self.check_no_buffer(backend)
        self.check_extra_args()
        args = self.server_args(hybrid, backend)
        self.check_against_cli(args, "resolved command line")
        self.check_against_cli(list(self.s.extra_server_args), "extra_server_args")
        if self.plan.errors:
            return self.plan
        if self.facts.model_key is None:
            self.plan.warnings.append(
                f"model_source {self.s.model_source}: its staged copy is not known until the "
                "source is readable; the ranks are shown reading the model link"
            )
        self.explain_environment()
        self.ranks(args + list(self.s.extra_server_args))
        return self.plan


@dataclass(frozen=True)
class RouterPlan:
    argv: list[str]
    unit: str
    workers: list[str]
    health_url: str
    env_dir: str
    version: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def worker_urls(all_settings: list[tuple[str, Settings]]) -> list[str]:
    """Every rank of every host, as the router reaches it."""
    return [
        layout.worker_url(s.server_host, s.base_port + rank)
        for _, s in all_settings
        for rank in range(s.dp_size)
    ]


def resolve_router(
    settings: Settings, host_name: str, all_settings: list[tuple[str, Settings]]
) -> RouterPlan:
    """The router's command line and unit, for the host that runs it."""
    router = settings.router
    assert router is not None and router.host == host_name
    env_dir = layout.router_env(settings)
    workers = worker_urls(all_settings)
    argv = [
        layout.env_python(env_dir),
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *workers,
        "--policy",
        router.policy,
        "--host",
        router.bind,
        "--port",
        str(router.port),
        # Reliability (settings.Router says why each differs from the router's own default).
        "--retry-max-retries",
        str(router.retry_max_retries),
        "--retry-initial-backoff-ms",
        str(router.retry_initial_backoff_ms),
        "--health-check-interval-secs",
        str(router.health_check_interval_s),
        "--health-failure-threshold",
        str(router.health_failure_threshold),
        "--health-success-threshold",
        str(router.health_success_threshold),
        "--cb-failure-threshold",
        str(router.cb_failure_threshold),
        "--cb-timeout-duration-secs",
        str(router.cb_timeout_s),
        "--worker-startup-timeout-secs",
        str(router.worker_startup_timeout_s),
        # Its Prometheus metrics, where the targets file says (operations/monitoring.py).
        "--prometheus-host",
        router.bind,
        "--prometheus-port",
        str(router.metrics_port),
    ]
    errors: list[str] = []
    warnings: list[str] = []
    table = kbmod.load_cli_table("sglang-router", router.version)
    if table is None:
        errors.append(
            f"router version {router.version!r}: no option table for sglang-router "
            f"{router.version}; run 'python scripts/gen_cli_table.py sglang-router "
            f"{router.version}' (see operations/knowledge/cli/README.md)"
        )
    else:
        found, warned = cli_problems(argv[3:], table, "router command line")
        errors += found
        warnings += warned
    if router.metrics_port == router.port:
        errors.append(
            f"router metrics_port {router.metrics_port} (set in {settings.origin('router')}) is "
            "the router's own port; choose another"
        )
    for name, s in all_settings:
        ports = range(s.base_port, s.base_port + s.dp_size)
        for what, port in (
            ("router port", router.port),
            ("router metrics_port", router.metrics_port),
        ):
            if name == host_name and port in ports:
                errors.append(
                    f"{what} {port} (set in {settings.origin('router')}) collides with "
                    f"rank {port - s.base_port} of {name} (ports {ports.start}-{ports.stop - 1})"
                    "; choose a router port outside every host's rank ports"
                )
        if name != host_name and s.server_host.startswith("127."):
            warnings.append(
                f"router on {host_name} reaches {name}'s ranks at {s.server_host}, a loopback "
                "address: set server_host for that host to an address the router can reach"
            )
    unit = units.router_unit(
        version=router.version,
        workers=len(workers),
        port=router.port,
        user=settings.service_user,
        argv=argv,
    )
    return RouterPlan(
        argv=argv,
        unit=unit,
        workers=workers,
        health_url=layout.health_url(router.bind, router.port),
        env_dir=env_dir,
        version=router.version,
        errors=errors,
        warnings=warnings,
    )


def resolve(
    settings: Settings, facts: Facts | None = None, kb: Knowledge | None = None
) -> HostPlan:
    return _Resolution(settings, facts or Facts(), kb or kbmod.load()).run()
