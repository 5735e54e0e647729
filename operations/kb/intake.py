"""The next SGLang release in one command: its knowledge-base entry drafted from what can be read.

    python -m operations.kb intake VERSION     # fetch, table, draft; print what is undecided
    python -m operations.kb --check VERSION    # exit 1 when the committed entry differs

What a draft is derived from (each a file the intake writes, or a committed fixture it reads):
- the release's METADATA (tests/fixtures/metadata/sglang-<v>.txt; `intake` reads it from the
  wheel on the main index with `pip download --no-deps`);
- SGLang's per-lane kernel indexes as captured (tests/fixtures/sglang-whl/<lane>/<project>.txt,
  the newest fetchable snapshot of github.com/sgl-project/whl: docs.sglang.io is unreachable
  here);
- the torchvision METADATA fixtures (which torchvision goes with which torch);
- the release's CLI table (operations/kb/knowledge/cli/sglang-<v>.json, by
  scripts/gen_cli_table.py, no torch needed) and the previous release's, diffed for renamed and
  removed options.

The facts compared by `--check` are the derivable ones: `requires` (as a set), glibc, the Python
minors, the lanes, each lane's packages (name, version, index, index lane), overrides and
excludes. Sources, `why` texts and `unproven` notes are a person's to word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from operations.kb.raw import (
    KNOWLEDGE_DIR,
    RawBuild,
    RawExclude,
    RawOverride,
    RawPackage,
    RawPython,
    RawRelease,
    RawUnproven,
)

REPO = KNOWLEDGE_DIR.parents[2]
METADATA_DIR = REPO / "tests" / "fixtures" / "metadata"
WHL_DIR = REPO / "tests" / "fixtures" / "sglang-whl"

# The requirements of a release that decide a CUDA build (the rest are ordinary PyPI packages).
# nvidia-cutlass-dsl and humming-kernels count only with an extra: their base packages are
# CUDA-neutral (sources flashinfer-metadata, package-indexes-reference).
CUDA_BEARING = {
    "torch", "torchvision", "torchaudio", "sglang-kernel", "sgl-kernel", "flashinfer-python",
    "cuda-python", "cuda-tile", "sgl-deep-ep", "sgl-deep-gemm", "nvshmem4py-cu13",
    "sgl-flash-mla",
}  # fmt: skip
CUDA_BEARING_WITH_EXTRA = {"nvidia-cutlass-dsl", "humming-kernels"}
# SGLang's CUDA 12 lane ended after 0.5.19 (sgl-project/sglang#38404, merged: "v0.5.19 is the
# last release with a CUDA 12 lane").
LAST_CUDA12 = Version("0.5.19")
CUDA12_BINDINGS = "cuda-python==12.9.4"  # source: cuda-python-metadata, torch-cu12-cuda-bindings
# cuda-tile's rc pins are sdists that download their wheel at build time (cuda-tile-pypi-files).
CUDA_TILE_FINAL = {"1.6.0rc5": "1.6.0"}
PYTHON_WHY = (
    "outlines==0.1.11 needs outlines-core==0.1.26, which has no cp313 wheel (sdists are "
    "never built)"
)


# PyPI's sglang-kernel builds whose shared objects were read and link libcudart.so.13 (sources
# sglang-kernel-pypi-cu13, sglang-kernel-pypi-wheel); any other PyPI pin on cu130 is unproven.
READ_CU13_KERNELS = {"0.4.2", "0.4.6.post1", "0.4.10"}


class IntakeError(Exception):
    """One line: what could not be read, and where."""


@dataclass
class Draft:
    """A release's entry as intake derives it, and what it left for a person to decide."""

    version: str
    entry: RawRelease
    undecided: list[str]


@dataclass(frozen=True)
class Pins:
    """What the release's METADATA pins for every lane: torch and its companions, the kernel."""

    torch: str
    vision: str | None  # None: no torchvision METADATA fixture requires that torch
    audio: str
    kernel_name: str  # sglang-kernel, or sgl-kernel before its rename
    kernel: str | None


class LaneFacts(TypedDict):
    """A lane's derivable facts: (name, version, index, index lane) per package, and the
    (requirement, replaces) of each override and (package, replaces) of each exclude."""

    packages: list[tuple[str, str, str, str]]
    overrides: list[tuple[str, str]]
    excludes: list[tuple[str, str]]


class EntryFacts(TypedDict):
    """What `--check` compares: the derivable facts of an entry."""

    requires: list[str]
    python: list[str]
    overrides: list[tuple[str, str]]
    lanes: dict[str, LaneFacts]


def metadata_path(release: str) -> Path:
    return METADATA_DIR / f"sglang-{release}.txt"


def read_requires(text: str) -> tuple[list[str], str | None]:
    """The unconditional Requires-Dist lines and Requires-Python of a METADATA text."""
    requires, python = [], None
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            value = line.split(":", 1)[1].strip()
            if ";" not in value:
                requires.append(value)
        elif line.startswith("Requires-Python:"):
            python = line.split(":", 1)[1].strip()
    return requires, python


def cuda_requires(requires: list[str]) -> list[str]:
    found = []
    for text in requires:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in CUDA_BEARING or (name in CUDA_BEARING_WITH_EXTRA and req.extras):
            found.append(text)
    return found


def index_files(lane: str, project: str, whl_dir: Path = WHL_DIR) -> set[str]:
    """The versions (with local tags) of `project` on SGLang's `lane` kernel index as captured."""
    path = whl_dir / lane / f"{project}.txt"
    if not path.exists():
        return set()
    norm = project.replace("-", "_")
    versions = set()
    for line in path.read_text().split():
        m = re.match(rf"{norm}-([^-]+)-", line)
        if m:
            versions.add(m.group(1))
    return versions


def torchvision_for(torch: str, metadata_dir: Path = METADATA_DIR) -> str | None:
    """The torchvision whose METADATA fixture requires this torch (torchvision-pypi-metadata)."""
    for path in sorted(metadata_dir.glob("torchvision-*.txt")):
        tv = path.stem.split("-", 1)[1]
        reqs, _ = read_requires(path.read_text())
        for text in reqs:
            req = Requirement(text)
            if canonicalize_name(req.name) == "torch" and req.specifier.contains(torch):
                return tv
    return None


def _pin(reqs: Mapping[str, Requirement], name: str) -> str | None:
    req = reqs.get(name)
    if req is None:
        return None
    for spec in req.specifier:
        if spec.operator == "==":
            return spec.version
    return None


def draft(release: str, metadata: str, glibc: str = "2.34", whl_dir: Path = WHL_DIR) -> Draft:
    """The release's entry as far as its METADATA and the kernel indexes decide it."""
    try:
        number = Version(release)
    except InvalidVersion as exc:
        raise IntakeError(f"{release!r} is not a release number") from exc
    try:
        requires, python_spec = read_requires(metadata)
        bearing = cuda_requires(requires)
    except InvalidRequirement as exc:
        raise IntakeError(f"sglang {release}'s METADATA: {exc}") from exc
    reqs: dict[str, Requirement] = {
        str(canonicalize_name(Requirement(r).name)): Requirement(r) for r in bearing
    }
    undecided: list[str] = []
    torch = _pin(reqs, "torch")
    if torch is None:
        raise IntakeError(f"sglang {release}'s METADATA pins no torch==X: nothing to build")
    vision = torchvision_for(torch)
    if vision is None:
        undecided.append(f"no torchvision METADATA fixture requires torch=={torch}")
    # The kernel's project: sglang-kernel, or sgl-kernel before its rename (0.5.9).
    kernel_name = "sglang-kernel" if "sglang-kernel" in reqs else "sgl-kernel"
    pins = Pins(
        torch, vision, _pin(reqs, "torchaudio") or torch, kernel_name, _pin(reqs, kernel_name)
    )
    bindings = reqs.get("cuda-python")
    cuda12_release = bindings is not None and any(
        s.operator == "==" and s.version.startswith("12.") for s in bindings.specifier
    )
    release_overrides: list[RawOverride] = []
    tile = reqs.get("cuda-tile")
    if tile is not None:
        rc = _pin(reqs, "cuda-tile")
        if rc in CUDA_TILE_FINAL:
            release_overrides.append(
                {
                    "requirement": f"cuda-tile=={CUDA_TILE_FINAL[rc]}",
                    "replaces": str(_text(bearing, "cuda-tile")),
                    "source": "cuda-tile-pypi-files",
                }
            )
    lanes: dict[str, RawBuild] = {}
    if number <= LAST_CUDA12:
        lanes["cu128"] = _cuda12_build(bearing, reqs, pins, whl_dir, undecided)
    else:
        undecided.append(
            f"no CUDA 12 lane: SGLang's CUDA 12 lane ended after {LAST_CUDA12} "
            "(sgl-project/sglang#38404)"
        )
    if not cuda12_release:
        lanes["cu130"] = _cuda13_build(pins, whl_dir)
    python: RawPython = {
        "versions": ["3.11", "3.12"],
        "why": PYTHON_WHY,
        "source": ["outlines-core-files", "real-metadata-snapshot"],
    }
    source = ["sglang-wheel", "sglang-pypi-files"]
    # The keys in the order a person reads them: the release's overrides before its builds.
    entry: RawRelease = (
        {
            "glibc": glibc,
            "python": python,
            "requires": bearing,
            "source": source,
            "overrides": release_overrides,
            "builds": lanes,
        }
        if release_overrides
        else {
            "glibc": glibc,
            "python": python,
            "requires": bearing,
            "source": source,
            "builds": lanes,
        }
    )
    if "outlines==0.1.11" not in requires:
        undecided.append("outlines is not pinned to 0.1.11: check the Python minors")
    if python_spec and python_spec not in (">=3.10", ">=3.11"):
        undecided.append(f"Requires-Python {python_spec}: check the Python minors")
    return Draft(release, entry, undecided)


def _text(bearing: list[str], name: str) -> str | None:
    return next((r for r in bearing if canonicalize_name(Requirement(r).name) == name), None)


def _torch_trio(pins: Pins, lane: str) -> dict[str, RawPackage]:
    return {
        "torch": {"version": f"{pins.torch}+{lane}", "index": "torch", "source": "pytorch-indexes"},
        "torchvision": {
            "version": f"{pins.vision or 'UNKNOWN'}+{lane}",
            "index": "torch",
            "source": ["pytorch-indexes", "torchvision-pypi-metadata"],
        },
        "torchaudio": {
            "version": f"{pins.audio}+{lane}",
            "index": "torch",
            "source": ["pytorch-indexes", "sglang-wheel"],
        },
    }


def _build(
    packages: dict[str, RawPackage],
    overrides: list[RawOverride],
    excludes: list[RawExclude],
    unproven: list[RawUnproven],
) -> RawBuild:
    """A lane's build, with only the lists that have something in them."""
    build: RawBuild = {"packages": packages}
    if overrides:
        build["overrides"] = overrides
    if excludes:
        build["excludes"] = excludes
    if unproven:
        build["unproven"] = unproven
    return build


def _cuda12_build(
    bearing: list[str],
    reqs: Mapping[str, Requirement],
    pins: Pins,
    whl_dir: Path,
    undecided: list[str],
) -> RawBuild:
    packages = _torch_trio(pins, "cu128")
    unproven: list[RawUnproven] = []
    name, kernel = pins.kernel_name, pins.kernel
    if kernel is not None:
        have = index_files("cu129", name, whl_dir)
        tagged = f"{kernel}+cu129"
        chosen = tagged if tagged in have or kernel not in have else kernel
        packages[name] = {
            "version": chosen,
            "index": "kernel",
            "index_lane": "cu129",
            "source": "sglang-whl-index",
        }
        if chosen not in have:
            unproven.append(
                {
                    "what": f"{name} {tagged} is not on SGLang's cu129 kernel index as "
                    "captured (github.com/sgl-project/whl at 2504c0ad, newest 0.4.4+cu129): "
                    "a CUDA 12 build of this kernel is unproven until a newer snapshot lists it",
                    "source": ["sglang-whl-index", "sglang-cuda12-retired"],
                }
            )
            undecided.append(f"cu128: {name} {tagged} not in the kernel index snapshot")
        else:
            unproven.append(
                {
                    "what": f"{name} {chosen} is a CUDA 12.9 build: whether all its "
                    "kernels load on sm_120 under a 12.8 driver",
                    "source": "package-indexes-open-questions",
                }
            )
    overrides: list[RawOverride] = []
    excludes: list[RawExclude] = []
    for text in bearing:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if req.extras and "cu13" in req.extras:
            base = "flashinfer-python" if name == "flashinfer-python" else name
            source = {
                "flashinfer-python": "flashinfer-metadata",
                "nvidia-cutlass-dsl": "package-indexes-reference",
            }.get(name, "sglang-wheel")
            overrides.append(
                {"requirement": f"{base}{req.specifier}", "replaces": text, "source": source}
            )
        elif name == "cuda-python" and any(s.version.startswith("13") for s in req.specifier):
            overrides.append(
                {
                    "requirement": CUDA12_BINDINGS,
                    "replaces": text,
                    "source": [
                        "torch-cu12-cuda-bindings",
                        "cuda-python-metadata",
                        "sglang-cuda12-install",
                    ],
                }
            )
        elif name == "sgl-deep-gemm":
            pin = _pin(reqs, name)
            if pin is not None and f"{pin}+cu129" in index_files("cu129", "sgl-deep-gemm", whl_dir):
                packages["sgl-deep-gemm"] = {
                    "version": f"{pin}+cu129",
                    "index": "kernel",
                    "index_lane": "cu129",
                    "source": "sgl-deep-cu13",
                }
            else:
                excludes.append(
                    {
                        "package": name,
                        "replaces": text,
                        "source": ["sgl-deep-cu13", "sglang-cuda12-install"],
                    }
                )
        elif name in ("sgl-deep-ep", "nvshmem4py-cu13", "sgl-flash-mla"):
            excludes.append(
                {
                    "package": name,
                    "replaces": text,
                    "source": ["sgl-deep-cu13", "sglang-cuda12-install"],
                }
            )
    if excludes:
        unproven.append(
            {
                "what": "left out (CUDA 13 builds only): "
                + ", ".join(x["package"] for x in excludes)
                + "; the paths that use them are unavailable",
                "source": "sgl-deep-cu13",
            }
        )
    return _build(packages, overrides, excludes, unproven)


def _cuda13_build(pins: Pins, whl_dir: Path) -> RawBuild:
    packages = _torch_trio(pins, "cu130")
    unproven: list[RawUnproven] = []
    name, kernel = pins.kernel_name, pins.kernel
    if kernel is not None:
        tagged = f"{kernel}+cu130"
        if tagged in index_files("cu130", name, whl_dir):
            packages[name] = {
                "version": tagged,
                "index": "kernel",
                "source": "sglang-whl-index",
            }
        else:
            packages[name] = {
                "version": kernel,
                "index": "main",
                "source": "sglang-kernel-pypi-cu13",
            }
            if kernel not in READ_CU13_KERNELS:
                unproven.append(
                    {
                        "what": f"PyPI's {name} {kernel} is taken as the CUDA 13 build, as "
                        "PyPI's 0.4.2, 0.4.6.post1 and 0.4.10 are (they link libcudart.so.13); "
                        f"{kernel}'s shared objects were not read",
                        "source": ["sglang-kernel-pypi-cu13", "package-indexes-open-questions"],
                    }
                )
    return _build(packages, [], [], unproven)


def _pairs(overrides: list[RawOverride] | None) -> list[tuple[str, str]]:
    return sorted((o["requirement"], o["replaces"]) for o in overrides or [])


def facts(entry: RawRelease) -> EntryFacts:
    """What `--check` compares: the derivable facts of an entry."""
    lanes: dict[str, LaneFacts] = {}
    for lane, build in entry["builds"].items():
        lanes[lane] = {
            "packages": sorted(
                (canonicalize_name(n), p["version"], p["index"], p.get("index_lane", lane))
                for n, p in build["packages"].items()
            ),
            "overrides": _pairs(build.get("overrides")),
            "excludes": sorted((x["package"], x["replaces"]) for x in build.get("excludes", [])),
        }
    return {
        "requires": sorted(entry["requires"]),
        "python": list(entry["python"]["versions"]),
        "overrides": _pairs(entry.get("overrides")),
        "lanes": lanes,
    }


def differences(committed: RawRelease, drafted: RawRelease) -> list[str]:
    a, b = facts(committed), facts(drafted)
    problems = [
        f"{key}: committed {mine}, derived {theirs}"
        for key, mine, theirs in (
            ("requires", a["requires"], b["requires"]),
            ("python", a["python"], b["python"]),
            ("overrides", a["overrides"], b["overrides"]),
        )
        if mine != theirs
    ]
    for lane in sorted(set(a["lanes"]) | set(b["lanes"])):
        if lane not in a["lanes"]:
            problems.append(f"builds.{lane}: derived, not committed")
        elif lane not in b["lanes"]:
            problems.append(f"builds.{lane}: committed, not derived")
        else:
            mine_lane, theirs_lane = a["lanes"][lane], b["lanes"][lane]
            for key, mine, theirs in (
                ("packages", mine_lane["packages"], theirs_lane["packages"]),
                ("overrides", mine_lane["overrides"], theirs_lane["overrides"]),
                ("excludes", mine_lane["excludes"], theirs_lane["excludes"]),
            ):
                if mine != theirs:
                    problems.append(f"builds.{lane}.{key}: committed {mine}, derived {theirs}")
    return problems
