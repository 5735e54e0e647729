"""Compile caches and start-up levers by release: knowledge/caches.yaml (Triton's and
FlashInfer's own behaviour, the registries) joined with what each release's wheel says
(knowledge/startup/, operations.kb.startup) and its real command line (knowledge/cli/).
Loaded once into frozen dataclasses and checked; every problem is named by its key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NotRequired, TypedDict, cast, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from operations.kb.cli_tables import load_cli_table
from operations.kb.raw import KNOWLEDGE_DIR, KnowledgeError, RawCites, RawSource, parse_yaml
from operations.kb.startup import load_startup
from operations.kb.types import Knowledge

CACHES_FILE = KNOWLEDGE_DIR / "caches.yaml"

JitCache = Literal["available", "absent", "unverified"]
JIT_CACHE: tuple[JitCache, ...] = get_args(JitCache)


class RawTorchPin(TypedDict):
    requires: str
    resolves: str
    source: RawCites


class RawAutotune(TypedDict):
    variable: str
    since: str
    why: str
    source: RawCites


class RawTriton(TypedDict):
    autotune_cache: RawAutotune
    torch_pins: dict[str, RawTorchPin]


class RawFlashinferVersion(TypedDict):
    cubin_on_pypi: bool
    jit_cache: dict[str, str]
    jit_cache_source: NotRequired[RawCites]


class RawJitCache(TypedDict):
    project: str
    module: str
    source: RawCites
    download_gb: dict[str, str]
    download_source: RawCites


class RawFlashinfer(TypedDict):
    workspace_variable: str
    workspace_default: str
    cache_under_base: str
    source: RawCites
    versions: dict[str, RawFlashinferVersion]
    versions_source: RawCites
    jit_cache: RawJitCache


class RawWatchdog(TypedDict):
    seconds: float
    why: str
    source: RawCites


class RawOverlap(TypedDict):
    architectures: list[str]
    why: str
    source: RawCites


class RawLevers(TypedDict):
    watchdog_timeout: RawWatchdog
    weight_load_overlap: RawOverlap


class RawCaches(TypedDict):
    sources: dict[str, RawSource]
    triton: RawTriton
    flashinfer: RawFlashinfer
    levers: RawLevers


@dataclass(frozen=True)
class AutotuneCache:
    variable: str  # TRITON_CACHE_AUTOTUNING
    since: Version
    why: str
    source: tuple[str, ...]


@dataclass(frozen=True)
class FlashinferPrebuilt:
    cubin_on_pypi: bool
    jit_cache: Mapping[str, JitCache]  # lane -> available | absent | unverified
    jit_cache_source: tuple[str, ...]  # the sources of its available and absent cells


@dataclass(frozen=True)
class JitCacheProject:
    """flashinfer-jit-cache: FlashInfer's prebuilt JIT modules, one wheel per lane."""

    project: str  # flashinfer-jit-cache
    module: str  # flashinfer_jit_cache, what flashinfer looks for
    source: tuple[str, ...]  # what the wheel is and how flashinfer uses it
    download_gb: Mapping[str, str]  # lane -> the wheel's size, as read
    download_source: tuple[str, ...]


@dataclass(frozen=True)
class Lever:
    """A start-up lever the plan decides: its value (seconds, or the architectures it admits)."""

    seconds: float | None
    architectures: tuple[str, ...]
    why: str
    source: tuple[str, ...]


@dataclass(frozen=True)
class CacheKnowledge:
    autotune: AutotuneCache
    torch_triton: Mapping[str, str]  # torch release -> the Triton it installs
    flashinfer_workspace_variable: str
    flashinfer_cache_under_base: str
    flashinfer: Mapping[str, FlashinferPrebuilt]
    jit_cache: JitCacheProject
    sources: Mapping[str, RawSource]
    watchdog_timeout: Lever
    weight_load_overlap: Lever


@dataclass(frozen=True)
class ReleaseCaches:
    """What one release's rank start compiles and tunes, and the levers it offers."""

    release: str
    flashinfer: str | None  # the FlashInfer the release pins
    flashinfer_cubin_pinned: bool  # flashinfer-cubin is a requirement of the release
    flashinfer_cubin_on_pypi: bool
    flashinfer_jit_cache: Mapping[str, JitCache]  # lane -> status
    flashinfer_jit_cache_source: tuple[str, ...]  # the sources of those statuses
    torch: str | None
    triton: str | None  # the Triton its torch installs
    triton_autotune_cache: bool  # that Triton reads TRITON_CACHE_AUTOTUNING
    sglang_cache_dir: str | None  # SGLANG_CACHE_DIR's default; None: no such variable
    redirected: Mapping[str, str]  # variable -> "{base}/..." setdefault under SGLANG_CACHE_DIR
    weight_load_modes: tuple[str, ...]  # --startup-weight-load-mode choices; () without it
    watchdog_timeout: float | None  # --watchdog-timeout's default
    watchdog_timeout_source: str | None  # "sglang/srt/...py:LINE" in its wheel
    cuda_graph_max_bs: Mapping[str, bool]  # every --cuda-graph-max-bs* spelling -> deprecated


def _cites(raw: RawCites) -> tuple[str, ...]:
    return (raw,) if isinstance(raw, str) else tuple(raw)


def _problems(raw: RawCaches, knowledge: Knowledge) -> Iterator[str]:
    sources = raw["sources"]
    cited = [
        ("triton.autotune_cache", raw["triton"]["autotune_cache"]["source"]),
        ("flashinfer", raw["flashinfer"]["source"]),
        ("flashinfer.versions_source", raw["flashinfer"]["versions_source"]),
        ("flashinfer.jit_cache", raw["flashinfer"]["jit_cache"]["source"]),
        ("flashinfer.jit_cache.download_source", raw["flashinfer"]["jit_cache"]["download_source"]),
        *(
            (f"flashinfer.versions.{v}.jit_cache_source", e["jit_cache_source"])
            for v, e in raw["flashinfer"]["versions"].items()
            if "jit_cache_source" in e
        ),
        *((f"triton.torch_pins.{t}", p["source"]) for t, p in raw["triton"]["torch_pins"].items()),
        ("levers.watchdog_timeout", raw["levers"]["watchdog_timeout"]["source"]),
        ("levers.weight_load_overlap", raw["levers"]["weight_load_overlap"]["source"]),
    ]
    for key, cites in cited:
        for name in _cites(cites):
            if name not in sources:
                yield f"caches.yaml {key}: source {name!r} is not a key of sources"
    for torch, pin in raw["triton"]["torch_pins"].items():
        try:
            if not SpecifierSet(pin["requires"]).contains(Version(pin["resolves"])):
                yield (
                    f"caches.yaml triton.torch_pins.{torch}: resolves {pin['resolves']} does not "
                    f"satisfy requires {pin['requires']}"
                )
        except (InvalidSpecifier, InvalidVersion) as exc:
            yield f"caches.yaml triton.torch_pins.{torch}: {exc}"
    for fi, prebuilt in raw["flashinfer"]["versions"].items():
        for lane, status in prebuilt["jit_cache"].items():
            if lane not in knowledge.lanes:
                yield f"caches.yaml flashinfer.versions.{fi}.jit_cache: {lane} is not a lane"
            if status not in JIT_CACHE:
                yield (
                    f"caches.yaml flashinfer.versions.{fi}.jit_cache.{lane}: {status!r}; "
                    f"accepted: {', '.join(JIT_CACHE)}"
                )
            else:
                yield from _jit_cache_cited(raw, fi, lane, status)
    for lane in raw["flashinfer"]["jit_cache"]["download_gb"]:
        if lane not in knowledge.lanes:
            yield f"caches.yaml flashinfer.jit_cache.download_gb: {lane} is not a lane"
    for release, entry in knowledge.releases.items():
        pinned = entry.pin("flashinfer-python")
        if pinned is not None and pinned not in raw["flashinfer"]["versions"]:
            yield (
                f"releases.{release} pins flashinfer-python {pinned}: caches.yaml has no entry "
                "for it"
            )
        torch_pin = entry.pin("torch")
        if torch_pin is not None and torch_pin not in raw["triton"]["torch_pins"]:
            yield (
                f"releases.{release} pins torch {torch_pin}: caches.yaml triton.torch_pins lacks it"
            )


def _jit_cache_cited(raw: RawCaches, fi: str, lane: str, status: str) -> Iterator[str]:
    """An available or absent cell cites a source; an available one a source whose text names
    that version and that lane (what was read, not a guess)."""
    if status == "unverified":
        return
    key = f"caches.yaml flashinfer.versions.{fi}"
    cites = _cites(raw["flashinfer"]["versions"][fi].get("jit_cache_source", []))
    if not cites:
        yield f"{key}.jit_cache.{lane}: {status} without a jit_cache_source"
        return
    if status == "available":
        texts = [raw["sources"][c]["what"] for c in cites if c in raw["sources"]]
        if not any(re.search(rf"{re.escape(fi)}\b", t) and lane in t for t in texts):
            yield (
                f"{key}.jit_cache.{lane}: available, but no source of {', '.join(cites)} names "
                f"{fi} on {lane}; cite the index page that lists it, or mark it unverified"
            )


@cache
def _read(path: Path) -> RawCaches:
    return cast(RawCaches, parse_yaml(path.read_text()))


# Checked once per process for each knowledge (hashed by identity) and file, however many of the
# plan's steps ask (a plan asked 21 times, each check ~2 ms: bench/serve_bench.py).
@cache
def load_caches(knowledge: Knowledge, path: Path = CACHES_FILE) -> CacheKnowledge:
    """caches.yaml, checked against the knowledge base's releases and lanes."""
    raw = _read(path)
    problems = list(_problems(raw, knowledge))
    if problems:
        raise KnowledgeError("\n".join(problems))
    autotune = raw["triton"]["autotune_cache"]
    fi = raw["flashinfer"]
    watchdog = raw["levers"]["watchdog_timeout"]
    overlap = raw["levers"]["weight_load_overlap"]
    jit = fi["jit_cache"]
    return CacheKnowledge(
        autotune=AutotuneCache(
            variable=autotune["variable"],
            since=Version(autotune["since"]),
            why=autotune["why"],
            source=_cites(autotune["source"]),
        ),
        torch_triton=MappingProxyType(
            {t: p["resolves"] for t, p in raw["triton"]["torch_pins"].items()}
        ),
        flashinfer_workspace_variable=fi["workspace_variable"],
        flashinfer_cache_under_base=fi["cache_under_base"],
        flashinfer=MappingProxyType(
            {
                v: FlashinferPrebuilt(
                    cubin_on_pypi=e["cubin_on_pypi"],
                    jit_cache=MappingProxyType(
                        {lane: cast(JitCache, s) for lane, s in e["jit_cache"].items()}
                    ),
                    jit_cache_source=_cites(e.get("jit_cache_source", [])),
                )
                for v, e in fi["versions"].items()
            }
        ),
        jit_cache=JitCacheProject(
            project=jit["project"],
            module=jit["module"],
            source=_cites(jit["source"]),
            download_gb=MappingProxyType(dict(jit["download_gb"])),
            download_source=_cites(jit["download_source"]),
        ),
        sources=MappingProxyType(dict(raw["sources"])),
        watchdog_timeout=Lever(
            float(watchdog["seconds"]), (), watchdog["why"], _cites(watchdog["source"])
        ),
        weight_load_overlap=Lever(
            None, tuple(overlap["architectures"]), overlap["why"], _cites(overlap["source"])
        ),
    )


def release_caches(knowledge: Knowledge, release: str) -> ReleaseCaches:
    """One release's caches and levers, from caches.yaml, its start-up file and its CLI
    table; KnowledgeError if the release lacks either file."""
    caches = load_caches(knowledge)
    entry = knowledge.releases[release]
    lines = load_startup(release)
    table = load_cli_table("sglang", release)
    if lines is None or table is None:
        raise KnowledgeError(f"releases.{release}: no start-up file or no CLI table")
    fi = entry.pin("flashinfer-python")
    prebuilt = caches.flashinfer.get(fi) if fi is not None else None
    torch = entry.pin("torch")
    triton = caches.torch_triton.get(torch) if torch is not None else None
    mode = table.get("--startup-weight-load-mode")
    watchdog = lines.defaults.get("watchdog_timeout")
    third = lines.third_party_caches
    return ReleaseCaches(
        release=release,
        flashinfer=fi,
        flashinfer_cubin_pinned=lines.pins.get("flashinfer-cubin") is not None,
        flashinfer_cubin_on_pypi=prebuilt.cubin_on_pypi if prebuilt else False,
        flashinfer_jit_cache=prebuilt.jit_cache if prebuilt else MappingProxyType({}),
        flashinfer_jit_cache_source=prebuilt.jit_cache_source if prebuilt else (),
        torch=torch,
        triton=triton,
        triton_autotune_cache=triton is not None and Version(triton) >= caches.autotune.since,
        sglang_cache_dir=lines.sglang_cache_dir,
        redirected=third.variables if third else MappingProxyType({}),
        weight_load_modes=(mode.choices or ()) if mode is not None else (),
        watchdog_timeout=float(watchdog) if isinstance(watchdog, int | float) else None,
        watchdog_timeout_source=lines.default_sources.get("watchdog_timeout"),
        cuda_graph_max_bs=MappingProxyType(
            {
                name: option.deprecated
                for name, option in sorted(table.options.items())
                if name.startswith("--cuda-graph-max-bs")
            }
        ),
    )
