"""The compatibility knowledge base's typed model: knowledge/sglang.yaml's entries as frozen
objects, and the lookups the resolver asks them. It holds data and lookups, never decisions.

Every entry cites its sources as `Source` objects (operations/kb/loader.py refuses an id that
names no source, and a source that nothing cites).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType
from typing import Literal

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from operations.kb.cli_tables import CliTable, load_cli_table


def version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise ValueError(f"{text!r} is not a version number") from exc


def in_range(release: str, specifier: str) -> bool:
    # prereleases=True so that a .post or rc release still falls in its range.
    return SpecifierSet(specifier).contains(version(release), prereleases=True)


# -- the knowledge base's entries ------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One citation: what it says (for the reader of the data) and where to read it."""

    id: str
    what: str
    url: str


Cites = tuple[Source, ...]


def cite(sources: Cites) -> str:
    """The URLs of an entry's sources, for a message."""
    return "; ".join(dict.fromkeys(s.url for s in sources))


@dataclass(frozen=True)
class Gpu:
    cap: str
    arch: str  # "sm_120"
    family: str
    min_cuda: str  # the first CUDA toolkit that targets the chip
    source: Cites


# Where each kind of compiler archive is published: settings cuda_redist_url (NVIDIA's) and
# cuda_wheels_url (PyPI's file host, this by default).
PYPI_FILES_URL = "https://files.pythonhosted.org/packages"
# A sha256 starting so is not a real value: the plan refuses a lane whose compiler has one.
PLACEHOLDER = "PLACEHOLDER"


@dataclass(frozen=True)
class CompilerArchive:
    """One archive of a lane's compiler, as its publisher's manifest lists it."""

    name: str  # "cuda_nvcc" (NVIDIA's component) or "nvidia-cuda-nvcc" (PyPI's project)
    version: str
    path: str  # relative to the publisher's base URL (NVIDIA's manifest: relative_path)
    sha256: str
    size: int

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Compiler:
    """The CUDA compiler every engine of a lane gets: archives unpacked into one CUDA_HOME."""

    version: str  # nvcc's, "12.8.93"
    origin: str  # "nvidia-redist" or "pypi"
    release: str | None  # NVIDIA's manifest, redistrib_<release>.json
    root: str  # the folder of each archive that becomes CUDA_HOME; "*": its one top folder
    archives: tuple[CompilerArchive, ...]
    why: str
    source: Cites

    @property
    def placeholder(self) -> bool:
        return any(a.sha256.startswith(PLACEHOLDER) for a in self.archives)


@dataclass(frozen=True)
class Lane:
    name: str  # "cu128"
    cuda: str  # what torch.version.cuda says for the lane's builds
    min_driver: str  # the oldest driver that runs the lane's builds
    toolkit_driver: str  # the first driver branch whose own CUDA is `cuda`
    source: Cites
    compiler: Compiler | None = None


@dataclass(frozen=True)
class PackageBuild:
    """One CUDA-bearing package of a release on a lane: its exact build and where it comes from."""

    name: str  # canonical project name
    version: str  # with its local build tag, e.g. "2.11.0+cu128"
    index: str  # "torch", "kernel" or "main"
    index_lane: str  # the lane the index URL is filled with (the kernel on cu128 reads cu129)
    source: Cites

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Override:
    """A requirement of the release replaced for an install (uv's override-dependencies)."""

    requirement: str
    replaces: str
    source: Cites


@dataclass(frozen=True)
class Exclude:
    """A requirement of the release left out of an install (uv's exclude-dependencies): no
    build of it can run on the lane."""

    package: str  # canonical project name
    replaces: str  # the release's requirement it removes
    source: Cites


@dataclass(frozen=True)
class Unproven:
    what: str
    source: Cites


@dataclass(frozen=True)
class LaneBuild:
    lane: Lane
    packages: tuple[PackageBuild, ...]
    overrides: tuple[Override, ...]
    unproven: tuple[Unproven, ...]
    excludes: tuple[Exclude, ...] = ()


@dataclass(frozen=True)
class PythonSupport:
    """The CPython minors an engine of a release is locked and built for, one per engine."""

    versions: tuple[str, ...]  # "3.11", "3.12"
    why: str  # what rules the other minors out
    source: Cites

    def minor_of(self, full: str) -> str | None:
        """The supported minor a host's `python3` version ("3.11.2") is, or None."""
        minor = ".".join(full.split(".")[:2])
        return minor if minor in self.versions else None


@cache
def _exact_pins(requires: tuple[str, ...]) -> Mapping[str, str | None]:
    """Project (canonical name) -> the version its first requirement pins with ==, else None;
    parsed once per release's requirements (a plan asks ~800 times: bench/serve_bench.py)."""
    pins: dict[str, str | None] = {}
    for text in requires:
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        pins.setdefault(canonicalize_name(req.name), exact[0] if exact else None)
    return MappingProxyType(pins)


@dataclass(frozen=True)
class Release:
    version: str
    glibc: str
    python: PythonSupport
    requires: tuple[str, ...]  # the CUDA-bearing requirements of the release's METADATA
    builds: tuple[LaneBuild, ...]
    source: Cites

    def build(self, lane: str) -> LaneBuild | None:
        return next((b for b in self.builds if b.lane.name == lane), None)

    @property
    def lanes(self) -> list[str]:
        return [b.lane.name for b in self.builds]

    def pin(self, project: str) -> str | None:
        """The version the release pins `project` to with ==, extras ignored."""
        return _exact_pins(self.requires).get(canonicalize_name(project))


@dataclass(frozen=True)
class Architecture:
    """A model architecture (config.json "architectures"[0]) and the first release serving it."""

    name: str
    first_release: str
    hybrid_linear_attention: bool
    source: Cites


@dataclass(frozen=True)
class KnownModel:
    """A model known by name: its architecture, a later floor than the architecture's, if any,
    and its size (what preflight assumes until the host measures it)."""

    name: str
    architecture: Architecture
    min_release: str | None
    size_gb: float | None
    source: Cites
    # config.json's quantization_config.quant_method of its weights; None: unquantized.
    quantization: str | None = None


@dataclass(frozen=True)
class GpuRule:
    """On which chips a backend runs: `runs_on` lists every chip that works (None: no such
    list), `refused_on` the chips known to fail; `reason` says why, for the refusal."""

    runs_on: tuple[str, ...] | None
    refused_on: tuple[str, ...]
    reason: str
    source: Cites
    releases: str | None = None  # the releases it holds for; None: the backend's own rule

    def refuses(self, cap: str) -> bool:
        return (self.runs_on is not None and cap not in self.runs_on) or cap in self.refused_on


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    chips: GpuRule
    by_release: tuple[GpuRule, ...]  # replace `chips` for the releases they name

    def rule(self, release: str) -> GpuRule:
        for rule in self.by_release:
            if rule.releases is not None and in_range(release, rule.releases):
                return rule
        return self.chips


@dataclass(frozen=True)
class HybridBackends:
    """The backends a release's attention registry accepts for hybrid linear-attention models."""

    releases: str
    backends: tuple[str, ...]
    reason: str | None
    source: Cites


@dataclass(frozen=True)
class AutoBackend:
    """What `attention_backend: auto` tries on these chips, in order."""

    compute_caps: tuple[str, ...]
    prefer: tuple[str, ...]
    why: str
    source: Cites


@dataclass(frozen=True)
class Spelling:
    """A setting's option in the releases named; option None: those releases have none."""

    releases: str
    option: str | None
    note: str | None  # what happens to the other spellings there (for the refusal)
    source: Cites


@dataclass(frozen=True)
class Flag:
    """A setting whose option was renamed between releases."""

    setting: str
    spellings: tuple[Spelling, ...]

    def spelling(self, release: str) -> Spelling | None:
        return next((s for s in self.spellings if in_range(release, s.releases)), None)

    @property
    def options(self) -> tuple[str, ...]:
        """Every spelling any release has."""
        return tuple(s.option for s in self.spellings if s.option is not None)


@dataclass(frozen=True)
class Flags:
    mamba_cache_strategy: Flag
    cuda_graph_max_bs: Flag

    def all(self) -> tuple[Flag, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class NoBufferLimits:
    attention_backends: tuple[str, ...] = ()
    page_size_other_than_1: bool = False


@dataclass(frozen=True)
class NoBufferRule:
    """What the no_buffer Mamba cache strategy asserts in the releases named: `refuses` fails
    at start-up, `warns` is silently changed by SGLang."""

    releases: str
    refuses: NoBufferLimits
    warns: NoBufferLimits
    reason: str
    source: Cites
    # Options the plan adds whenever no_buffer is set (what the release asserts is set).
    adds: tuple[str, ...] = ()


@dataclass(frozen=True)
class StartAssert:
    """How the plan meets the asserts a release's argument checks make at start-up
    (knowledge/asserts/sglang-<v>.json): those of `function` whose message contains `match`
    (all of them without one) are `anticipated` (the plan adds the flag or refuses) or
    `unreachable` from the settings, each with why."""

    function: str
    match: str | None
    anticipated: str | None
    unreachable: str | None
    source: Cites

    def covers(self, function: str, message: str) -> bool:
        return function == self.function and (self.match is None or self.match in message)


@dataclass(frozen=True)
class RouterPolicy:
    """A router policy that reads an endpoint only some SGLang releases serve."""

    policy: str
    releases: str  # where it works
    reason: str
    source: Cites


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding (MTP through EAGLE) on hybrid models."""

    hybrid_requires_mamba_strategy: str
    hybrid_reason: str
    flashinfer_newer_than: str
    flashinfer_reason: str
    source: Cites
    hybrid_max_draft_tokens: int | None = None
    hybrid_max_draft_tokens_reason: str = ""


@dataclass(frozen=True)
class RankEnvironment:
    """A variable a rank unit sets when the release pins a flashinfer in `flashinfer`, on a GPU
    of `compute_caps`, with an engine compiler in `compiler`, and (when `driver_below` is set)
    on a driver older than that branch."""

    variable: str
    value: str
    flashinfer: str  # a version specifier
    compute_caps: tuple[str, ...]
    compiler: str  # a version specifier over the lane's compiler version
    why: str
    source: Cites
    driver_below: str | None = None

    def applies(
        self, flashinfer: str | None, compute_cap: str, compiler: str | None, driver: str | None
    ) -> bool:
        # An unknown driver (a host not asked) counts as below: the variable is then set, which
        # every driver runs; leaving it out would break JIT builds on an old one.
        old_driver = (
            self.driver_below is None
            or driver is None
            or version(driver).release[0] < version(self.driver_below).release[0]
        )
        return (
            flashinfer is not None
            and compiler is not None
            and compute_cap in self.compute_caps
            and SpecifierSet(self.compiler).contains(version(compiler), prereleases=True)
            and old_driver
            and SpecifierSet(self.flashinfer).contains(version(flashinfer), prereleases=True)
        )


RouterPackage = Literal["sglang-router", "smg"]


@dataclass(frozen=True)
class RouterDrain:
    """What the router's removal does before the worker leaves its list: the `state` it lists
    the worker in meanwhile (no new requests), for `settle_secs` (per worker, set through
    `settle_update`, a queued job: `settle_applied` lists the worker with its job's status
    until the update is done), and whether it waits for the worker's in-flight requests
    (smg 1.13: no, a timer)."""

    state: str
    settle_secs: int
    settle_update: str
    settle_applied: str
    waits_for_in_flight: bool
    why: str
    source: Cites


@dataclass(frozen=True)
class RouterControlPlane:
    """How the worker API is closed: the key's format, the status without (or with a wrong)
    key, and where the launcher takes keys from (`from_option`; `no_environment`: the Python
    launcher reads no variable for them)."""

    key_format: str
    missing_key_status: int
    from_option: str
    no_environment: bool
    why: str
    source: Cites


@dataclass(frozen=True)
class RouterWorkerKey:
    """How a worker added through the worker API gets the key its engine wants: the add
    request's body field that carries it (the router calls a worker added without it
    unauthenticated)."""

    field: str
    why: str
    source: Cites


@dataclass(frozen=True)
class RouterHealth:
    """The router's own rules for taking a worker out and back, with the options that set
    them (each present in the release's option table) and their defaults."""

    options: Mapping[str, str]  # option -> its default, as the release's parser has it
    rules: str
    source: Cites


@dataclass(frozen=True)
class RankMetrics:
    """What the router reads from a rank's /metrics: the prefix the engine emits and the
    gauges it reads."""

    prefix: str
    gauges: tuple[str, ...]
    why: str
    source: Cites


@dataclass(frozen=True)
class RouterEngines:
    """The SGLang releases this router is known to work with over HTTP (`tested`), and the
    range nothing shows either way (`unproven`)."""

    tested: tuple[str, ...]
    unproven: str
    why: str
    source: Cites


@dataclass(frozen=True)
class RouterRelease:
    """A router release (sglang-router or its successor smg): the package and the console
    commands its wheel installs, the module whose `parse_router_args`/`launch_router` the
    launcher calls, and its worker API, as `METHOD /path` (`{id}`: the worker's id in the
    list): how a roll takes a rank out of the router and puts it back. smg adds what its
    sdist and a capture of the real binary show (drain, control plane, health, the ranks'
    metrics, the engines it is known to work with)."""

    version: str
    list_workers: str
    remove_worker: str
    add_worker: str
    why: str
    source: Cites
    package: RouterPackage = "sglang-router"
    commands: tuple[str, ...] = ()
    launcher: str = "sglang_router.launch_router"
    update_worker: str | None = None
    worker_states: tuple[str, ...] = ()
    duplicate_add_status: int | None = None
    drain: RouterDrain | None = None
    control_plane: RouterControlPlane | None = None
    worker_api_key: RouterWorkerKey | None = None
    health: RouterHealth | None = None
    rank_metrics: RankMetrics | None = None
    engines: RouterEngines | None = None


# eq=False: compared and hashed by identity (its mappings are read-only views, unhashable).
@dataclass(frozen=True, eq=False)
class Knowledge:
    sources: Mapping[str, Source]
    gpus: Mapping[str, Gpu]  # by compute capability
    lanes: Mapping[str, Lane]
    releases: Mapping[str, Release]
    architectures: Mapping[str, Architecture]
    models: Mapping[str, KnownModel]
    attention_backends: Mapping[str, AttentionBackend]
    hybrid_attention_backends: tuple[HybridBackends, ...]
    auto_attention_backend: tuple[AutoBackend, ...]
    flags: Flags
    speculative: Speculative
    mamba_no_buffer: tuple[NoBufferRule, ...]
    rank_environment: tuple[RankEnvironment, ...]
    # sglang-router releases whose worker API a roll drives, by version.
    routers: Mapping[str, RouterRelease] = field(default_factory=lambda: MappingProxyType({}))
    start_asserts: tuple[StartAssert, ...] = ()
    router_policies: tuple[RouterPolicy, ...] = ()

    def sources_for(self, *ids: str) -> Cites:
        """The sources of these ids (a rule in code citing the data it copies)."""
        return tuple(self.sources[i] for i in ids if i in self.sources)

    def rank_environment_for(
        self, release: str, compute_cap: str, lane: str, driver: str | None = None
    ) -> tuple[RankEnvironment, ...]:
        """The variables a rank of `release` sets on that GPU, with the lane's compiler, on
        the host's `driver` ("570.172.08"; None: not known), by the release's flashinfer pin."""
        entry = self.releases.get(release)
        pinned = entry.pin("flashinfer-python") if entry is not None else None
        found = self.lanes.get(lane)
        compiler = found.compiler.version if found is not None and found.compiler else None
        return tuple(
            r for r in self.rank_environment if r.applies(pinned, compute_cap, compiler, driver)
        )

    def supported_releases(self) -> list[str]:
        return sorted(self.releases, key=version)

    def lane_of_cuda(self, cuda: str) -> Lane | None:
        """The lane whose builds are CUDA `cuda` (its toolkit_driver is that CUDA's driver)."""
        return next((lane for lane in self.lanes.values() if lane.cuda == cuda), None)

    def backend_rule(self, backend: str, release: str) -> GpuRule | None:
        """The backend's GPU rule for `release`; None: not a known backend."""
        entry = self.attention_backends.get(backend)
        return entry.rule(release) if entry is not None else None

    def no_buffer_rule(self, release: str) -> NoBufferRule | None:
        return next((r for r in self.mamba_no_buffer if in_range(release, r.releases)), None)

    def hybrid_backends(self, release: str) -> HybridBackends | None:
        return next(
            (r for r in self.hybrid_attention_backends if in_range(release, r.releases)), None
        )

    def auto_rule(self, compute_cap: str) -> AutoBackend | None:
        return next((r for r in self.auto_attention_backend if compute_cap in r.compute_caps), None)

    def cli_table(self, package: str, release: str) -> CliTable | None:
        return load_cli_table(package, release)
