"""The compatibility knowledge base: loads knowledge/sglang.yaml and the CLI tables into frozen,
typed objects, checks them (schema.json, then the cross-references a schema cannot express),
and answers the questions the resolver asks. It holds data and lookups, never decisions.

Every entry cites its sources as `Source` objects; an id that names no source, and a source
that nothing cites, are load errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import NotRequired, TypedDict, cast

import jsonschema
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

KNOWLEDGE_DIR = Path(__file__).parent / "knowledge"
CLI_DIR = KNOWLEDGE_DIR / "cli"


class KnowledgeError(Exception):
    """The knowledge base itself is broken (a bug in our data, not a user mistake)."""


def version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise ValueError(f"{text!r} is not a version number") from exc


def in_range(release: str, specifier: str) -> bool:
    # prereleases=True so that a .post or rc release still falls in its range.
    return SpecifierSet(specifier).contains(version(release), prereleases=True)


# -- the command-line tables (knowledge/cli/*.json) ------------------------------------------


@dataclass(frozen=True)
class CliOption:
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    deprecated: bool


@dataclass(frozen=True)
class CliTable:
    """One release's real command line: every option string it accepts."""

    package: str
    version: str
    options: Mapping[str, CliOption]

    def get(self, option: str) -> CliOption | None:
        return self.options.get(option)


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
        wanted = canonicalize_name(project)
        for text in self.requires:
            req = Requirement(text)
            if canonicalize_name(req.name) == wanted:
                exact = [s.version for s in req.specifier if s.operator == "=="]
                return exact[0] if exact else None
        return None


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


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding (MTP through EAGLE) on hybrid models."""

    hybrid_requires_mamba_strategy: str
    hybrid_reason: str
    flashinfer_newer_than: str
    flashinfer_reason: str
    source: Cites


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


@dataclass(frozen=True)
class RouterRelease:
    """An sglang-router release's worker API, as `METHOD /path` (`{id}`: the worker's id in
    the list): how a roll takes a rank out of the router and puts it back."""

    version: str
    list_workers: str
    remove_worker: str
    add_worker: str
    why: str
    source: Cites


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

    def lanes_for_release(self, release: str) -> list[str]:
        entry = self.releases.get(release)
        return entry.lanes if entry is not None else []

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


# -- raw shapes: what schema.json admits, as the loader reads them ---------------------------

RawCites = str | list[str]


class RawSource(TypedDict):
    what: str
    url: str


class RawGpu(TypedDict):
    arch: str
    family: str
    min_cuda: str
    source: RawCites


class RawArchive(TypedDict):
    version: str
    path: str
    sha256: str
    size: int


RawCompiler = TypedDict(
    "RawCompiler",
    {
        "version": str,
        "from": str,
        "release": NotRequired[str],
        "root": str,
        "archives": dict[str, RawArchive],
        "why": str,
        "source": RawCites,
    },
)


class RawLane(TypedDict):
    cuda: str
    min_driver: str
    toolkit_driver: str
    source: RawCites
    compiler: RawCompiler


class RawOverride(TypedDict):
    requirement: str
    replaces: str
    source: RawCites


class RawUnproven(TypedDict):
    what: str
    source: RawCites


class RawPackage(TypedDict):
    version: str
    index: str
    index_lane: NotRequired[str]
    source: RawCites


class RawExclude(TypedDict):
    package: str
    replaces: str
    source: RawCites


class RawBuild(TypedDict):
    packages: dict[str, RawPackage]
    overrides: NotRequired[list[RawOverride]]
    excludes: NotRequired[list[RawExclude]]
    unproven: NotRequired[list[RawUnproven]]


class RawPython(TypedDict):
    versions: list[str]
    why: str
    source: RawCites


class RawRelease(TypedDict):
    glibc: str
    python: RawPython
    requires: list[str]
    overrides: NotRequired[list[RawOverride]]
    builds: dict[str, RawBuild]
    source: RawCites


class RawArchitecture(TypedDict):
    first_release: str
    hybrid_linear_attention: bool
    source: RawCites


class RawModel(TypedDict):
    architecture: str
    min_release: NotRequired[str]
    size_gb: NotRequired[float]
    quantization: NotRequired[str]
    source: RawCites


class RawByRelease(TypedDict):
    releases: str
    runs_on: list[str]
    reason: str
    source: RawCites


class RawBackend(TypedDict):
    runs_on: NotRequired[list[str]]
    refused_on: NotRequired[list[str]]
    reason: NotRequired[str]
    source: RawCites
    by_release: NotRequired[list[RawByRelease]]


class RawHybrid(TypedDict):
    releases: str
    backends: list[str]
    reason: NotRequired[str]
    source: RawCites


class RawAuto(TypedDict):
    compute_caps: list[str]
    prefer: list[str]
    why: str
    source: RawCites


class RawSpelling(TypedDict):
    releases: str
    option: str | None
    note: NotRequired[str]
    source: RawCites


class RawLimits(TypedDict, total=False):
    attention_backends: list[str]
    page_size_other_than_1: bool


class RawNoBuffer(TypedDict):
    releases: str
    refuses: NotRequired[RawLimits]
    warns: NotRequired[RawLimits]
    reason: str
    source: RawCites


class RawSpeculative(TypedDict):
    hybrid_requires_mamba_strategy: str
    hybrid_reason: str
    flashinfer_newer_than: str
    flashinfer_reason: str
    source: RawCites


class RawRankEnvironment(TypedDict):
    variable: str
    value: str
    flashinfer: str
    compute_caps: list[str]
    compiler: str
    driver_below: NotRequired[str]
    why: str
    source: RawCites


class RawRouter(TypedDict):
    list_workers: str
    remove_worker: str
    add_worker: str
    why: str
    source: RawCites


class RawKnowledge(TypedDict):
    sources: dict[str, RawSource]
    gpus: dict[str, RawGpu]
    lanes: dict[str, RawLane]
    releases: dict[str, RawRelease]
    architectures: dict[str, RawArchitecture]
    models: dict[str, RawModel]
    attention_backends: dict[str, RawBackend]
    hybrid_attention_backends: list[RawHybrid]
    auto_attention_backend: list[RawAuto]
    flags: dict[str, list[RawSpelling]]
    speculative: RawSpeculative
    mamba_no_buffer: list[RawNoBuffer]
    rank_environment: list[RawRankEnvironment]
    routers: NotRequired[dict[str, RawRouter]]


class RawCliOption(TypedDict):
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: list[str] | None
    deprecated: bool


class RawCliTable(TypedDict):
    package: str
    version: str
    options: dict[str, RawCliOption]


# -- the loader ------------------------------------------------------------------------------


class _Reader:
    """Turns schema-valid data into typed entries, noting every problem by its key."""

    def __init__(self, raw: RawKnowledge) -> None:
        self.raw = raw
        self.problems: list[str] = []
        self.sources = {sid: Source(sid, s["what"], s["url"]) for sid, s in raw["sources"].items()}
        self.cited: set[str] = set()

    def cites(self, where: str, raw: RawCites) -> Cites:
        found = []
        for sid in [raw] if isinstance(raw, str) else raw:
            source = self.sources.get(sid)
            if source is None:
                self.problems.append(f"{where}: unknown source {sid!r}")
            else:
                self.cited.add(sid)
                found.append(source)
        return tuple(found)

    def releases(self, where: str, specifier: str, key: str = "releases") -> str:
        try:
            SpecifierSet(specifier)
        except InvalidSpecifier:
            self.problems.append(f"{where}.{key}: {specifier!r} is not a version range")
            return "<0"  # matches no release: the load fails on the problem above anyway
        return specifier

    def compiler(self, lane: str, raw: RawCompiler) -> Compiler:
        return Compiler(
            raw["version"],
            raw["from"],
            raw.get("release"),
            raw["root"],
            tuple(
                CompilerArchive(name, a["version"], a["path"], a["sha256"], a["size"])
                for name, a in raw["archives"].items()
            ),
            raw["why"],
            self.cites(f"lanes.{lane}.compiler", raw["source"]),
        )

    def read(self) -> Knowledge:
        raw = self.raw
        gpus = {
            cap: Gpu(
                cap, g["arch"], g["family"], g["min_cuda"], self.cites(f"gpus.{cap}", g["source"])
            )
            for cap, g in raw["gpus"].items()
        }
        lanes = {
            name: Lane(
                name,
                lane["cuda"],
                lane["min_driver"],
                lane["toolkit_driver"],
                self.cites(f"lanes.{name}", lane["source"]),
                self.compiler(name, lane["compiler"]),
            )
            for name, lane in raw["lanes"].items()
        }
        releases = {
            number: self.release(number, entry, lanes) for number, entry in raw["releases"].items()
        }
        architectures = {
            name: Architecture(
                name,
                a["first_release"],
                a["hybrid_linear_attention"],
                self.cites(f"architectures.{name}", a["source"]),
            )
            for name, a in raw["architectures"].items()
        }
        models = {}
        for name, m in raw["models"].items():
            arch = architectures.get(m["architecture"])
            if arch is None:
                self.problems.append(f"models.{name}: unknown architecture {m['architecture']!r}")
                continue
            models[name] = KnownModel(
                name,
                arch,
                m.get("min_release"),
                m.get("size_gb"),
                self.cites(f"models.{name}", m["source"]),
                m.get("quantization"),
            )
        backends = {name: self.backend(name, b) for name, b in raw["attention_backends"].items()}
        hybrid = tuple(
            HybridBackends(
                self.releases(f"hybrid_attention_backends[{i}]", h["releases"]),
                tuple(h["backends"]),
                h.get("reason"),
                self.cites(f"hybrid_attention_backends[{i}]", h["source"]),
            )
            for i, h in enumerate(raw["hybrid_attention_backends"])
        )
        auto = tuple(
            AutoBackend(
                tuple(a["compute_caps"]),
                tuple(a["prefer"]),
                a["why"],
                self.cites(f"auto_attention_backend[{i}]", a["source"]),
            )
            for i, a in enumerate(raw["auto_attention_backend"])
        )
        flags = Flags(**{f.name: self.flag(f.name) for f in fields(Flags)})
        s = raw["speculative"]
        speculative = Speculative(
            s["hybrid_requires_mamba_strategy"],
            s["hybrid_reason"],
            s["flashinfer_newer_than"],
            s["flashinfer_reason"],
            self.cites("speculative", s["source"]),
        )
        no_buffer = tuple(
            NoBufferRule(
                self.releases(f"mamba_no_buffer[{i}]", r["releases"]),
                _limits(r.get("refuses", {})),
                _limits(r.get("warns", {})),
                r["reason"],
                self.cites(f"mamba_no_buffer[{i}]", r["source"]),
            )
            for i, r in enumerate(raw["mamba_no_buffer"])
        )
        environment = tuple(
            RankEnvironment(
                e["variable"],
                e["value"],
                self.releases(f"rank_environment[{i}]", e["flashinfer"], "flashinfer"),
                tuple(e["compute_caps"]),
                self.releases(f"rank_environment[{i}]", e["compiler"], "compiler"),
                e["why"],
                self.cites(f"rank_environment[{i}]", e["source"]),
                e.get("driver_below"),
            )
            for i, e in enumerate(raw["rank_environment"])
        )
        routers = {
            number: RouterRelease(
                number,
                r["list_workers"],
                r["remove_worker"],
                r["add_worker"],
                r["why"],
                self.cites(f"routers.{number}", r["source"]),
            )
            for number, r in raw.get("routers", {}).items()
        }
        self.problems += [
            f"sources.{sid}: cited by nothing" for sid in self.sources if sid not in self.cited
        ]
        return Knowledge(
            sources=MappingProxyType(self.sources),
            gpus=MappingProxyType(gpus),
            lanes=MappingProxyType(lanes),
            releases=MappingProxyType(releases),
            architectures=MappingProxyType(architectures),
            models=MappingProxyType(models),
            attention_backends=MappingProxyType(backends),
            hybrid_attention_backends=hybrid,
            auto_attention_backend=auto,
            flags=flags,
            speculative=speculative,
            mamba_no_buffer=no_buffer,
            rank_environment=environment,
            routers=MappingProxyType(routers),
        )

    def release(self, number: str, raw: RawRelease, lanes: Mapping[str, Lane]) -> Release:
        where = f"releases.{number}"
        shared = tuple(
            self.override(f"{where}.overrides[{i}]", o)
            for i, o in enumerate(raw.get("overrides", []))
        )
        builds = []
        for lane_name, build in raw["builds"].items():
            at = f"{where}.builds.{lane_name}"
            lane = lanes.get(lane_name)
            if lane is None:
                self.problems.append(f"{at}: unknown lane {lane_name!r}")
                continue
            packages = tuple(
                PackageBuild(
                    name=canonicalize_name(name),
                    version=p["version"],
                    index=p["index"],
                    index_lane=p.get("index_lane", lane_name),
                    source=self.cites(f"{at}.packages.{name}", p["source"]),
                )
                for name, p in build["packages"].items()
            )
            own = tuple(
                self.override(f"{at}.overrides[{i}]", o)
                for i, o in enumerate(build.get("overrides", []))
            )
            unproven = tuple(
                Unproven(u["what"], self.cites(f"{at}.unproven[{i}]", u["source"]))
                for i, u in enumerate(build.get("unproven", []))
            )
            excludes = tuple(
                Exclude(
                    canonicalize_name(x["package"]),
                    x["replaces"],
                    self.cites(f"{at}.excludes[{i}]", x["source"]),
                )
                for i, x in enumerate(build.get("excludes", []))
            )
            builds.append(LaneBuild(lane, packages, shared + own, unproven, excludes))
        return Release(
            version=number,
            glibc=raw["glibc"],
            python=PythonSupport(
                versions=tuple(raw["python"]["versions"]),
                why=raw["python"]["why"],
                source=self.cites(f"{where}.python", raw["python"]["source"]),
            ),
            requires=tuple(raw["requires"]),
            builds=tuple(builds),
            source=self.cites(where, raw["source"]),
        )

    def override(self, where: str, raw: RawOverride) -> Override:
        return Override(raw["requirement"], raw["replaces"], self.cites(where, raw["source"]))

    def backend(self, name: str, raw: RawBackend) -> AttentionBackend:
        where = f"attention_backends.{name}"
        runs_on = raw.get("runs_on")
        chips = GpuRule(
            runs_on=tuple(runs_on) if runs_on is not None else None,
            refused_on=tuple(raw.get("refused_on", [])),
            reason=raw.get("reason", ""),
            source=self.cites(where, raw["source"]),
        )
        by_release = tuple(
            GpuRule(
                runs_on=tuple(r["runs_on"]),
                refused_on=(),
                reason=r["reason"],
                source=self.cites(f"{where}.by_release[{i}]", r["source"]),
                releases=self.releases(f"{where}.by_release[{i}]", r["releases"]),
            )
            for i, r in enumerate(raw.get("by_release", []))
        )
        return AttentionBackend(name, chips, by_release)

    def flag(self, setting: str) -> Flag:
        where = f"flags.{setting}"
        return Flag(
            setting,
            tuple(
                Spelling(
                    self.releases(f"{where}[{i}]", s["releases"]),
                    s["option"],
                    s.get("note"),
                    self.cites(f"{where}[{i}]", s["source"]),
                )
                for i, s in enumerate(self.raw["flags"][setting])
            ),
        )


def _limits(raw: RawLimits) -> NoBufferLimits:
    return NoBufferLimits(
        tuple(raw.get("attention_backends", [])), raw.get("page_size_other_than_1", False)
    )


def _cross_problems(kb: Knowledge) -> Iterator[str]:
    """Cross-references a schema cannot express: names that must exist, ranges that must
    cover every release once, spellings and backends the release's own parser must accept."""
    for number, release in kb.releases.items():
        yield from (f"releases.{number}: {p}" for p in _release_problems(kb, release))
    tables = {number: load_cli_table("sglang", number) for number in kb.releases}
    for number, table in tables.items():
        if table is None:
            yield f"releases.{number}: no CLI table {cli_table_path('sglang', number)}"

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


def cli_table_path(package: str, release: str, directory: Path = CLI_DIR) -> Path:
    return directory / f"{package}-{release}.json"


@cache
def load_cli_table(package: str, release: str, directory: Path = CLI_DIR) -> CliTable | None:
    """The release's option table from `directory` (knowledge/cli/ unless a test passes
    another); None when it has none."""
    path = cli_table_path(package, release, directory)
    if not path.exists():
        return None
    raw = cast(RawCliTable, json.loads(path.read_text()))
    if (raw["package"], raw["version"]) != (package, release):
        raise KnowledgeError(
            f"{path}: its header says {raw['package']} {raw['version']}; "
            f"the file name says {package} {release}"
        )
    options = {
        name: CliOption(
            dest=o["dest"],
            takes_value=o["takes_value"],
            nargs=o["nargs"],
            choices=tuple(o["choices"]) if o["choices"] is not None else None,
            deprecated=o["deprecated"],
        )
        for name, o in raw["options"].items()
    }
    return CliTable(package=package, version=release, options=MappingProxyType(options))


def build(data: object) -> Knowledge:
    """Typed knowledge from the data of knowledge/sglang.yaml, checked against schema.json and
    its cross-references; KnowledgeError names every broken key."""
    schema = json.loads((KNOWLEDGE_DIR / "schema.json").read_text())
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path)
    )
    if errors:
        lines = [f"{'.'.join(map(str, e.path)) or '<top>'}: {e.message}" for e in errors]
        raise KnowledgeError("knowledge/sglang.yaml is invalid:\n  " + "\n  ".join(lines))
    reader = _Reader(cast(RawKnowledge, data))  # the schema has checked this shape
    kb = reader.read()
    problems = reader.problems + list(_cross_problems(kb))
    if problems:
        raise KnowledgeError("knowledge/sglang.yaml is inconsistent:\n  " + "\n  ".join(problems))
    return kb


@cache
def load() -> Knowledge:
    return build(yaml.safe_load((KNOWLEDGE_DIR / "sglang.yaml").read_text()))
