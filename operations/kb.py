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
from packaging.specifiers import SpecifierSet
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


class Knowledge:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.sources: dict[str, dict[str, str]] = data["sources"]
        self.gpus: dict[str, dict[str, Any]] = data["gpus"]
        self.lanes: dict[str, dict[str, Any]] = data["lanes"]
        self.releases: dict[str, dict[str, Any]] = data["releases"]
        self.architectures: dict[str, dict[str, Any]] = data["architectures"]
        self.models: dict[str, dict[str, Any]] = data["models"]
        self.attention_backends: dict[str, dict[str, Any]] = data["attention_backends"]
        self.hybrid_attention_backends: list[dict[str, Any]] = data["hybrid_attention_backends"]
        self.auto_attention_backend: list[dict[str, Any]] = data["auto_attention_backend"]
        self.flags: dict[str, list[dict[str, Any]]] = data["flags"]
        self.speculative: dict[str, Any] = data["speculative"]

    def cite(self, source: str | list[str]) -> str:
        """'source: <url> (<what>)' for one or several source ids."""
        ids = [source] if isinstance(source, str) else source
        return "; ".join(self.sources[i]["url"] for i in ids)

    def supported_releases(self) -> list[str]:
        return sorted(self.releases, key=version)

    def lanes_for_release(self, release: str) -> list[str]:
        return [name for name, lane in self.lanes.items() if in_range(release, lane["releases"])]

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
    for release in kb.releases:
        if load_cli_table("sglang", release) is None:
            problems.append(f"releases.{release}: no CLI table {cli_table_path('sglang', release)}")
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
