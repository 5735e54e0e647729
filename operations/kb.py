"""The compatibility knowledge base: loads knowledge/sglang.yaml and the CLI tables, checks them,
and answers the questions the resolver asks. It holds data and lookups, never decisions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
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
    options: dict[str, CliOption]

    def get(self, option: str) -> CliOption | None:
        return self.options.get(option)


Source = tuple[str, ...]  # source ids (keys of `sources`)


@dataclass(frozen=True)
class Gpu:
    cap: str
    arch: str  # "sm_120"
    family: str
    min_cuda: str  # the first CUDA toolkit that targets the chip
    source: Source


@dataclass(frozen=True)
class Lane:
    name: str  # "cu128"
    cuda: str  # what torch.version.cuda says for the lane's builds
    min_driver: str
    source: Source


@dataclass(frozen=True)
class PackageBuild:
    """One CUDA-bearing package of a release on a lane: its exact build and where it comes from."""

    name: str  # canonical project name
    version: str  # with its local build tag, e.g. "2.11.0+cu128"
    index: str  # "torch", "kernel" or "main"
    index_lane: str  # the lane the index URL is filled with (the kernel on cu128 reads cu129)
    source: Source

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Override:
    """A requirement of the release replaced for an install (uv's override-dependencies)."""

    requirement: str
    replaces: str
    source: Source


@dataclass(frozen=True)
class Unproven:
    what: str
    source: Source


@dataclass(frozen=True)
class LaneBuild:
    lane: Lane
    packages: tuple[PackageBuild, ...]
    overrides: tuple[Override, ...]
    unproven: tuple[Unproven, ...]


@dataclass(frozen=True)
class Release:
    version: str
    glibc: str
    python: str  # specifier of the supported Pythons
    requires: tuple[str, ...]  # the CUDA-bearing requirements of the release's METADATA
    builds: tuple[LaneBuild, ...]
    source: Source

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


def _ids(source: str | list[str]) -> Source:
    return (source,) if isinstance(source, str) else tuple(source)


def _release(number: str, raw: dict[str, Any], lanes: dict[str, Lane]) -> Release:
    shared = tuple(
        Override(o["requirement"], o["replaces"], _ids(o["source"]))
        for o in raw.get("overrides", [])
    )
    builds = []
    for lane_name, build in raw["builds"].items():
        packages = tuple(
            PackageBuild(
                name=canonicalize_name(name),
                version=p["version"],
                index=p["index"],
                index_lane=p.get("index_lane", lane_name),
                source=_ids(p["source"]),
            )
            for name, p in build["packages"].items()
        )
        own = tuple(
            Override(o["requirement"], o["replaces"], _ids(o["source"]))
            for o in build.get("overrides", [])
        )
        unproven = tuple(Unproven(u["what"], _ids(u["source"])) for u in build.get("unproven", []))
        builds.append(LaneBuild(lanes[lane_name], packages, shared + own, unproven))
    return Release(
        version=number,
        glibc=raw["glibc"],
        python=raw["python"],
        requires=tuple(raw["requires"]),
        builds=tuple(builds),
        source=_ids(raw["source"]),
    )


class Knowledge:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.sources: dict[str, dict[str, str]] = data["sources"]
        self.gpus: dict[str, Gpu] = {
            cap: Gpu(cap, g["arch"], g["family"], g["min_cuda"], _ids(g["source"]))
            for cap, g in data["gpus"].items()
        }
        self.lanes: dict[str, Lane] = {
            name: Lane(name, lane["cuda"], lane["min_driver"], _ids(lane["source"]))
            for name, lane in data["lanes"].items()
        }
        self.releases: dict[str, Release] = {
            number: _release(number, raw, self.lanes) for number, raw in data["releases"].items()
        }
        self.architectures: dict[str, dict[str, Any]] = data["architectures"]
        self.models: dict[str, dict[str, Any]] = data["models"]
        self.attention_backends: dict[str, dict[str, Any]] = data["attention_backends"]
        self.hybrid_attention_backends: list[dict[str, Any]] = data["hybrid_attention_backends"]
        self.auto_attention_backend: list[dict[str, Any]] = data["auto_attention_backend"]
        self.flags: dict[str, list[dict[str, Any]]] = data["flags"]
        self.speculative: dict[str, Any] = data["speculative"]
        self.mamba_no_buffer: list[dict[str, Any]] = data["mamba_no_buffer"]

    def cite(self, source: str | list[str] | Source) -> str:
        """The URLs of one or several source ids, for a message."""
        ids = [source] if isinstance(source, str) else source
        return "; ".join(self.sources[i]["url"] for i in ids)

    def supported_releases(self) -> list[str]:
        return sorted(self.releases, key=version)

    def lanes_for_release(self, release: str) -> list[str]:
        entry = self.releases.get(release)
        return entry.lanes if entry is not None else []

    def backend_rule(self, backend: str, release: str) -> dict[str, Any] | None:
        """The backend's GPU rule for `release`: a matching `by_release` entry, else its own."""
        entry = self.attention_backends.get(backend)
        if entry is None:
            return None
        for rule in entry.get("by_release", []):
            if in_range(release, rule["releases"]):
                return dict(rule)
        return entry

    def no_buffer_rule(self, release: str) -> dict[str, Any] | None:
        for rule in self.mamba_no_buffer:
            if in_range(release, rule["releases"]):
                return rule
        return None

    def hybrid_backends(self, release: str) -> dict[str, Any] | None:
        for rule in self.hybrid_attention_backends:
            if in_range(release, rule["releases"]):
                return rule
        return None

    def auto_rule(self, compute_cap: str) -> dict[str, Any] | None:
        for rule in self.auto_attention_backend:
            if compute_cap in rule["compute_caps"]:
                return rule
        return None

    def flag(self, setting: str, release: str) -> dict[str, Any] | None:
        for rule in self.flags[setting]:
            if in_range(release, rule["releases"]):
                return rule
        return None

    def cli_table(self, package: str, release: str) -> CliTable | None:
        return load_cli_table(package, release)


def _check_references(kb: Knowledge) -> list[str]:
    """Cross-references a schema cannot express: every id named must exist."""
    problems: list[str] = []

    def sources_of(where: str, entry: dict[str, Any]) -> None:
        src = entry.get("source")
        for sid in [src] if isinstance(src, str) else (src or []):
            if sid not in kb.sources:
                problems.append(f"{where}: unknown source {sid!r}")

    for section in ("gpus", "lanes", "releases", "architectures", "models", "attention_backends"):
        for key, entry in kb.data[section].items():
            sources_of(f"{section}.{key}", entry)
    for name, entry in kb.attention_backends.items():
        for i, rule in enumerate(entry.get("by_release", [])):
            sources_of(f"attention_backends.{name}.by_release[{i}]", rule)
    for i, rule in enumerate(kb.mamba_no_buffer):
        sources_of(f"mamba_no_buffer[{i}]", rule)
    for number, entry in kb.releases.items():
        problems += [f"releases.{number}: {p}" for p in _release_problems(kb, entry)]
    for section in ("hybrid_attention_backends", "auto_attention_backend"):
        for i, entry in enumerate(kb.data[section]):
            sources_of(f"{section}[{i}]", entry)
            for backend in entry.get("backends", []) + entry.get("prefer", []):
                if backend not in kb.attention_backends:
                    problems.append(f"{section}[{i}]: unknown backend {backend!r}")
    for name, rules in kb.flags.items():
        for i, rule in enumerate(rules):
            sources_of(f"flags.{name}[{i}]", rule)
    sources_of("speculative", kb.speculative)
    for name, model in kb.models.items():
        if model["architecture"] not in kb.architectures:
            problems.append(f"models.{name}: unknown architecture {model['architecture']!r}")
    for number in kb.releases:
        if load_cli_table("sglang", number) is None:
            problems.append(f"releases.{number}: no CLI table {cli_table_path('sglang', number)}")
    return problems


def _release_problems(kb: Knowledge, release: Release) -> list[str]:
    """A release's builds must be what the release asks for, with one CUDA build of torch and
    its companions per lane, from indexes and lanes that exist."""
    problems: list[str] = []
    asked: dict[str, Requirement] = {
        canonicalize_name(Requirement(r).name): Requirement(r) for r in release.requires
    }
    sourced = [o.source for b in release.builds for o in b.overrides]
    sourced += [u.source for b in release.builds for u in b.unproven]
    sourced += [p.source for b in release.builds for p in b.packages]
    problems += [f"unknown source {i!r}" for s in sourced for i in s if i not in kb.sources]
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
    return problems


def cli_table_path(package: str, release: str) -> Path:
    return CLI_DIR / f"{package}-{release}.json"


@cache
def load_cli_table(package: str, release: str) -> CliTable | None:
    path = cli_table_path(package, release)
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    options = {
        name: CliOption(
            dest=o["dest"],
            takes_value=o["takes_value"],
            nargs=o["nargs"],
            choices=tuple(o["choices"]) if o["choices"] is not None else None,
            deprecated=o.get("deprecated", False),
        )
        for name, o in raw["options"].items()
    }
    return CliTable(package=raw["package"], version=raw["version"], options=options)


def build(data: dict[str, Any]) -> Knowledge:
    """Check knowledge data against schema.json and its cross-references."""
    schema = json.loads((KNOWLEDGE_DIR / "schema.json").read_text())
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path)
    )
    if errors:
        lines = [f"{'.'.join(map(str, e.path)) or '<top>'}: {e.message}" for e in errors]
        raise KnowledgeError("knowledge/sglang.yaml is invalid:\n  " + "\n  ".join(lines))
    kb = Knowledge(data)
    problems = _check_references(kb)
    if problems:
        raise KnowledgeError("knowledge/sglang.yaml is inconsistent:\n  " + "\n  ".join(problems))
    return kb


@cache
def load() -> Knowledge:
    return build(yaml.safe_load((KNOWLEDGE_DIR / "sglang.yaml").read_text()))
