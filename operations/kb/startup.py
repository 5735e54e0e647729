"""Each release's start-up, as its wheel says it (knowledge/startup/sglang-<v>.json, written by
scripts/gen_startup_lines.py): the log lines that mark each phase of a rank's start, with a regex
that finds them and, where the line tells it, the phase's own seconds; the compile caches the
release redirects under SGLANG_CACHE_DIR; its pins and start-up defaults. Loaded once, checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypedDict, cast, get_args

from operations.kb.raw import KNOWLEDGE_DIR, KnowledgeError
from operations.kb.types import Knowledge

STARTUP_DIR = KNOWLEDGE_DIR / "startup"

Phase = Literal[
    "parallel_init_begin",
    "parallel_init_end",
    "weight_load_begin",
    "weight_load_end",
    "graph_capture_begin",
    "graph_capture_end",
    "flashinfer_autotune_begin",
    "flashinfer_autotune_end",
    "warmup_end",
    "ready",
]
PHASES: tuple[Phase, ...] = get_args(Phase)
# Phases every release logs, each line with its own duration where it is timed.
REQUIRED: tuple[Phase, ...] = ("weight_load_end", "graph_capture_end", "ready")
TIMED: tuple[Phase, ...] = ("parallel_init_end", "weight_load_end", "graph_capture_end")


class RawLine(TypedDict):
    format: str
    regex: str
    sources: list[str]
    style: str
    timed: bool


class RawStartup(TypedDict):
    package: str
    version: str
    source: str
    generated_by: str
    phases: dict[str, list[RawLine]]
    caches: dict[str, object]
    pins: dict[str, str | None]
    defaults: dict[str, dict[str, object]]


@dataclass(frozen=True)
class PhaseLine:
    """One log call that marks a phase: its message as written, where, and its regex."""

    format: str
    regex: re.Pattern[str]
    sources: tuple[str, ...]  # "sglang/srt/...py:LINE" in the release's wheel
    style: Literal["f-string", "percent", "plain"]
    timed: bool  # the regex has a `seconds` group


@dataclass(frozen=True)
class ThirdPartyCaches:
    """What `third_party_cache_defaults` setdefaults under SGLANG_CACHE_DIR (0.5.18+)."""

    variables: Mapping[str, str]  # variable -> "{base}/triton" ({base}: SGLANG_CACHE_DIR)
    source: str
    applied_by: str | None


@dataclass(frozen=True)
class StartupLines:
    release: str
    phases: Mapping[Phase, tuple[PhaseLine, ...]]
    sglang_cache_dir: str | None  # its default; None: the release has no SGLANG_CACHE_DIR
    sglang_cache_dir_source: str | None  # "sglang/srt/environ.py:LINE" in its wheel
    third_party_caches: ThirdPartyCaches | None
    pins: Mapping[str, str | None]  # flashinfer-python, flashinfer-cubin, torch
    defaults: Mapping[str, object]  # watchdog_timeout, startup_weight_load_mode (0.5.18+)
    default_sources: Mapping[str, str]  # the same keys -> "sglang/srt/...py:LINE"

    def phase_of(self, line: str) -> Phase | None:
        """The phase a log line marks; None for any other line."""
        for phase, entries in self.phases.items():
            if any(e.regex.search(line) for e in entries):
                return phase
        return None

    def seconds(self, phase: Phase, line: str) -> float | None:
        """The phase's own duration as the line tells it; None if it tells none."""
        for entry in self.phases.get(phase, ()):
            m = entry.regex.search(line)
            if m is not None and entry.timed:
                return float(m["seconds"])
        return None


def startup_path(release: str, directory: Path = STARTUP_DIR) -> Path:
    return directory / f"sglang-{release}.json"


@cache
def load_startup(release: str, directory: Path = STARTUP_DIR) -> StartupLines | None:
    """The release's start-up lines; None when it has none. Broken data raises KnowledgeError
    naming the file and the entry."""
    path = startup_path(release, directory)
    if not path.exists():
        return None
    raw = cast(RawStartup, json.loads(path.read_text()))
    problems = list(_problems(path, release, raw))
    if problems:
        raise KnowledgeError("\n".join(problems))
    phases: dict[Phase, tuple[PhaseLine, ...]] = {}
    for name in PHASES:
        phases[name] = tuple(
            PhaseLine(
                format=e["format"],
                regex=re.compile(e["regex"]),
                sources=tuple(e["sources"]),
                style=cast(Literal["f-string", "percent", "plain"], e["style"]),
                timed=e["timed"],
            )
            for e in raw["phases"].get(name, [])
        )
    caches = raw["caches"]
    home = cast(dict[str, str] | None, caches.get("sglang_cache_dir"))
    third = cast(dict[str, object] | None, caches.get("third_party"))
    return StartupLines(
        release=release,
        phases=MappingProxyType(phases),
        sglang_cache_dir=home["default"] if home else None,
        sglang_cache_dir_source=home["source"] if home else None,
        third_party_caches=(
            ThirdPartyCaches(
                variables=MappingProxyType(dict(cast(dict[str, str], third["variables"]))),
                source=cast(str, third["source"]),
                applied_by=cast(str | None, third["applied_by"]),
            )
            if third
            else None
        ),
        pins=MappingProxyType(dict(raw["pins"])),
        defaults=MappingProxyType({k: v["value"] for k, v in raw["defaults"].items()}),
        default_sources=MappingProxyType({k: str(v["source"]) for k, v in raw["defaults"].items()}),
    )


def _problems(path: Path, release: str, raw: RawStartup) -> Iterator[str]:
    if (raw.get("package"), raw.get("version")) != ("sglang", release):
        yield (
            f"{path}: its header says {raw.get('package')} {raw.get('version')}; "
            f"the file name says sglang {release}"
        )
    unknown = sorted(set(raw["phases"]) - set(PHASES))
    if unknown:
        yield f"{path}: phases {unknown} are not among {list(PHASES)}"
    for required in REQUIRED:
        if not raw["phases"].get(required):
            yield f"{path}: phases.{required} is empty (every release logs it)"
    for name, entries in raw["phases"].items():
        for i, e in enumerate(entries):
            where = f"{path}: phases.{name}[{i}] ({', '.join(e['sources'])})"
            try:
                pattern = re.compile(e["regex"])
            except re.error as exc:
                yield f"{where}: regex does not compile: {exc}"
                continue
            if e["timed"] != ("seconds" in pattern.groupindex):
                yield f"{where}: timed is {e['timed']}, the regex says otherwise"
            if name in TIMED and not e["timed"]:
                yield f"{where}: a {name} line must give its seconds"
            if e["style"] not in ("f-string", "percent", "plain"):
                yield f"{where}: style {e['style']!r} is not f-string, percent or plain"


def startup_problems(knowledge: Knowledge, directory: Path = STARTUP_DIR) -> list[str]:
    """Every release of the knowledge base has its start-up lines, and the pins they were read
    with are the release's own (`requires` in sglang.yaml)."""
    problems = []
    for release, entry in knowledge.releases.items():
        lines = load_startup(release, directory)
        if lines is None:
            problems.append(
                f"releases.{release}: no {startup_path(release, directory).name}; "
                f"run scripts/gen_startup_lines.py {release}"
            )
            continue
        pinned = entry.pin("flashinfer-python")
        if lines.pins.get("flashinfer-python") != pinned:
            problems.append(
                f"releases.{release}: requires flashinfer-python {pinned}; its start-up file was "
                f"read from a wheel that pins {lines.pins.get('flashinfer-python')}"
            )
    return problems
