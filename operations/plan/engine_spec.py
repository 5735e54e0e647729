"""What an engine environment holds, decided from the settings and the knowledge base: the pins
with their builds and indexes, the overrides, the project uv locks, and its name. Pure: the
resolver computes it once per host (ResolvedHost.engine) and the engine step carries it out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from operations.kb import PLACEHOLDER, Compiler, CompilerArchive, Knowledge, cite
from operations.layout import EngineTree
from operations.plan import jit_cache
from operations.programs.exact_pins import exact
from operations.settings import Settings, controller_files
from operations.settings.controller_files import ControllerFile

HASH_LENGTH = 8
# The Python module each CUDA-bearing project installs: what the engine check imports.
MODULES = {
    "torch": "torch",
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "sgl-kernel": "sgl_kernel",
    "sglang-kernel": "sgl_kernel",
    "flashinfer-python": "flashinfer",
    "flashinfer-jit-cache": "flashinfer_jit_cache",  # FlashInfer's prebuilt JIT modules
}
# The marker on which the lock is resolved: the hosts this tool provisions (Linux on x86_64,
# the only platform sglang's CUDA lanes publish for every package) keep the lock small.
LOCK_ENVIRONMENT = "sys_platform == 'linux' and platform_machine == 'x86_64'"


class EngineError(Exception):
    """The engine cannot be planned for this host (a bug upstream or bad data)."""


# -- the compiler every engine of a lane gets: pure ------------------------------------------


class ArchiveJson(TypedDict):
    name: str
    version: str
    path: str
    sha256: str
    size: int


class ToolkitJson(TypedDict):
    version: str
    origin: str
    release: str | None
    root: str
    url: str
    archives: list[ArchiveJson]
    checksums: str


@dataclass(frozen=True)
class Toolkit:
    """The CUDA compiler of an engine: archives unpacked into ENGINE_ROOT/cuda/<name>, shared by
    every engine of the same compiler, and the CUDA_HOME its ranks and its check use."""

    version: str  # nvcc's
    origin: str  # "nvidia-redist" or "pypi"
    release: str | None  # NVIDIA's redistrib_<release>.json
    root: str  # the folder of each archive that becomes CUDA_HOME; "*": its one top folder
    url: str  # where `path`s are found online
    archives: tuple[CompilerArchive, ...]
    checksums: str  # where the sha256 values come from, for the plan

    def __post_init__(self) -> None:
        archives = tuple(
            a if isinstance(a, CompilerArchive) else CompilerArchive(**a) for a in self.archives
        )
        object.__setattr__(self, "archives", archives)

    @property
    def name(self) -> str:
        """ "12.8.93-1a2b3c4d": the version, and a hash of exactly the archives unpacked."""
        canonical = json.dumps(sorted((a.name, a.sha256) for a in self.archives))
        return f"{self.version}-{hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]}"

    def home(self, engine_root: str) -> str:
        return EngineTree(engine_root).toolkit(self.name)

    @property
    def placeholder(self) -> bool:
        return any(a.sha256.startswith(PLACEHOLDER) for a in self.archives)

    def to_json(self) -> ToolkitJson:
        return {
            "version": self.version,
            "origin": self.origin,
            "release": self.release,
            "root": self.root,
            "url": self.url,
            "archives": [cast(ArchiveJson, dataclasses.asdict(a)) for a in self.archives],
            "checksums": self.checksums,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Toolkit:
        archives = data.get("archives")
        if not isinstance(archives, list) or not all(isinstance(a, Mapping) for a in archives):
            raise EngineError(f"toolkit: archives is {archives!r}, not a list of archives")
        release = data.get("release")
        return cls(
            version=_text(data, "version"),
            origin=_text(data, "origin"),
            release=_text(data, "release") if release is not None else None,
            root=_text(data, "root"),
            url=_text(data, "url"),
            archives=tuple(
                CompilerArchive(
                    _text(a, "name"),
                    _text(a, "version"),
                    _text(a, "path"),
                    _text(a, "sha256"),
                    _int(a, "size"),
                )
                for a in archives
            ),
            checksums=_text(data, "checksums"),
        )


def redist_manifest(file: ControllerFile) -> Mapping[str, object]:
    """A redistrib_<release>.json on the controller (setting cuda_redist_manifest), from its
    text as the settings loader read it (settings/controller_files.py)."""
    try:
        if file.text is None:
            raise ValueError(file.error)
        data = json.loads(file.text)
    except ValueError as exc:
        raise EngineError(
            f"cuda_redist_manifest {file.path}: cannot be read as JSON: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise EngineError(f"cuda_redist_manifest {file.path}: not a JSON object")
    return data


def read_redist_manifest(path: str) -> Mapping[str, object]:
    """The manifest at `path`, read now (scripts/fill_wheelhouse.py; a deploy's plan takes the
    one the settings loader read)."""
    return redist_manifest(controller_files.read(path, expand=False))


def toolkit(
    compiler: Compiler,
    settings: Settings,
    manifest: Mapping[str, object] | None = None,
    manifest_path: str | None = None,
) -> Toolkit:
    """The lane's compiler as the engine installs it. With a manifest in NVIDIA's redistrib
    format (setting cuda_redist_manifest), its relative_path, sha256 and size replace the
    knowledge base's for each archive it lists at the same version."""
    url = (
        settings.cuda_redist_url if compiler.origin == "nvidia-redist" else settings.cuda_wheels_url
    )
    archives = []
    for a in compiler.archives:
        archive = a
        entry = manifest.get(a.name) if manifest is not None else None
        if manifest is not None:
            if not isinstance(entry, Mapping) or entry.get("version") != a.version:
                raise EngineError(
                    f"cuda_redist_manifest {manifest_path}: lists no {a.name} {a.version} "
                    "(the version the knowledge base pins)"
                )
            files = entry.get("linux-x86_64")
            if not isinstance(files, Mapping):
                raise EngineError(
                    f"cuda_redist_manifest {manifest_path}: {a.name} has no linux-x86_64 archive"
                )
            size = files.get("size")
            archive = CompilerArchive(
                a.name,
                a.version,
                _text(files, "relative_path"),
                _text(files, "sha256"),
                int(size) if isinstance(size, (int, str)) and str(size).isdigit() else 0,
            )
        archives.append(archive)
    if manifest is not None:
        checksums = f"{manifest_path} (setting cuda_redist_manifest)"
    elif compiler.origin == "nvidia-redist":
        checksums = f"the knowledge base, copied from NVIDIA's redistrib_{compiler.release}.json"
    else:
        checksums = "the knowledge base, copied from PyPI's file list"
    return Toolkit(
        compiler.version,
        compiler.origin,
        compiler.release,
        compiler.root,
        url.rstrip("/"),
        tuple(archives),
        checksums,
    )


# -- what to install: pure ------------------------------------------------------------------


class PinJson(TypedDict):
    name: str
    version: str
    index: str
    index_lane: str


class EngineSpecJson(TypedDict):
    """An EngineSpec as JSON: pyinfra's serialisation of operation arguments, op fixtures."""

    release: str
    lane: str
    cuda: str
    min_driver: str
    python: str
    pins: list[PinJson]
    overrides: list[str]
    arch: str | None
    compute_cap: str
    gpu_count: int
    unproven: list[str]
    excludes: list[str]
    name: str
    toolkit: NotRequired[ToolkitJson | None]


class EngineMarker(TypedDict):
    """What an environment's marker records (the engine step writes it after the check)."""

    release: str
    lane: str
    python: str
    requirements: list[str]
    overrides: list[str]


@dataclass(frozen=True)
class Pin:
    """One CUDA-bearing package as the engine installs it, and the index it may come from."""

    name: str
    version: str
    index: str  # "torch", "kernel", "flashinfer" or "main"
    index_lane: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def index_name(self) -> str | None:
        """The uv index it is pinned to (None: the main index)."""
        prefix = {"torch": "pytorch", "kernel": "sglang", "flashinfer": "flashinfer"}.get(
            self.index
        )
        return f"{prefix}-{self.index_lane}" if prefix else None


@dataclass(frozen=True)
class EngineSpec:
    """The resolved set of one engine environment and what its check expects."""

    release: str
    lane: str
    cuda: str  # the lane's CUDA version, what torch.version.cuda must say
    min_driver: str  # the lane's driver floor, for the check's advice
    python: str  # the one CPython minor ("3.11") it is locked and built for: the host's
    pins: tuple[Pin, ...]
    overrides: tuple[str, ...]
    arch: str | None  # e.g. "sm_120": must be compiled into torch
    compute_cap: str  # what every GPU must report
    gpu_count: int  # how many GPUs torch must see
    unproven: tuple[str, ...] = ()  # what only the GPUs settle, each with its sources
    excludes: tuple[str, ...] = ()  # projects left out of the install (no build for the lane)
    # The lane's compiler: not in the name (engines of one compiler share it, and a compiler
    # fix does not rebuild an engine), installed and proven by the engine step.
    toolkit: Toolkit | None = None

    def __post_init__(self) -> None:
        # Built from JSON (op fixtures, FunctionCommand arguments): lists and dicts come back.
        pins = tuple(p if isinstance(p, Pin) else Pin(**p) for p in self.pins)
        object.__setattr__(self, "pins", pins)
        object.__setattr__(self, "overrides", tuple(self.overrides))
        object.__setattr__(self, "unproven", tuple(self.unproven))
        object.__setattr__(self, "excludes", tuple(self.excludes))
        if isinstance(self.toolkit, Mapping):
            object.__setattr__(self, "toolkit", Toolkit.from_json(self.toolkit))

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"sglang=={self.release}", *(p.requirement for p in self.pins))

    @property
    def digest(self) -> str:
        # Only what decides the environment's contents: two hosts (or two runs) with the same
        # pins get the same name, whatever index, mirror or wheelhouse the wheels came from.
        canonical = json.dumps(
            {
                "requirements": sorted(self.requirements),
                "overrides": sorted(self.overrides),
                "python": self.python,
                # Only when there are some: names of existing engines stay as they were.
                **({"excludes": sorted(self.excludes)} if self.excludes else {}),
            },
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]

    @property
    def python_tag(self) -> str:
        """ "cp311" for Python 3.11: in the name, so a lock says which Python it is for."""
        return "cp" + self.python.replace(".", "")

    @property
    def requires_python(self) -> str:
        """The project's requires-python: this one minor, so uv locks for it alone (a lock over
        a range must solve every Python in it, and a wheelhouse holds one Python's wheels)."""
        return f"=={self.python}.*"

    @property
    def name(self) -> str:
        return f"{self.release}-{self.lane}-{self.python_tag}-{self.digest}"

    @property
    def compile_arch(self) -> str | None:
        """What the JIT builds compile for: "sm_120a", the arch with its `a` (arch-specific)
        suffix, which NVIDIA defines from sm_90 on; an older arch as it is."""
        if not self.arch:
            return None
        major = int(self.compute_cap.split(".")[0])
        return f"{self.arch}a" if major >= 9 else self.arch

    def pin(self, project: str) -> Pin | None:
        wanted = canonicalize_name(project)
        return next((p for p in self.pins if p.name == wanted), None)

    @property
    def torch(self) -> str:
        pin = self.pin("torch")
        return pin.version if pin else "?"

    def modules(self) -> dict[str, str]:
        """project -> module the check imports (flashinfer too: it comes from the main index)."""
        projects = [p.name for p in self.pins if p.name in MODULES] + ["flashinfer-python"]
        return {p: MODULES[p] for p in projects}

    def to_json(self) -> EngineSpecJson:
        # pyinfra's serialisation hook (op fixtures, --debug-operations).
        return {
            "release": self.release,
            "lane": self.lane,
            "cuda": self.cuda,
            "min_driver": self.min_driver,
            "python": self.python,
            "pins": [
                {"name": p.name, "version": p.version, "index": p.index, "index_lane": p.index_lane}
                for p in self.pins
            ],
            "overrides": list(self.overrides),
            "arch": self.arch,
            "compute_cap": self.compute_cap,
            "gpu_count": self.gpu_count,
            "unproven": list(self.unproven),
            "excludes": list(self.excludes),
            "name": self.name,
            "toolkit": self.toolkit.to_json() if self.toolkit else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> EngineSpec:
        """Back from to_json's document (op fixtures, FunctionCommand arguments), checked."""
        pins = data.get("pins")
        if not isinstance(pins, list) or not all(isinstance(p, Mapping) for p in pins):
            raise EngineError(f"engine spec: pins is {pins!r}, not a list of pins")
        arch = data.get("arch")
        tools = data.get("toolkit")
        gpu_count = data.get("gpu_count")
        if not isinstance(gpu_count, int):
            raise EngineError(f"engine spec: gpu_count is {gpu_count!r}, not a number")
        return cls(
            release=_text(data, "release"),
            lane=_text(data, "lane"),
            cuda=_text(data, "cuda"),
            min_driver=_text(data, "min_driver"),
            python=_text(data, "python"),
            pins=tuple(
                Pin(
                    _text(p, "name"), _text(p, "version"), _text(p, "index"), _text(p, "index_lane")
                )
                for p in pins
            ),
            overrides=_texts(data, "overrides"),
            arch=_text(data, "arch") if arch is not None else None,
            compute_cap=_text(data, "compute_cap"),
            gpu_count=gpu_count,
            unproven=_texts(data, "unproven") if "unproven" in data else (),
            excludes=_texts(data, "excludes") if "excludes" in data else (),
            toolkit=Toolkit.from_json(tools) if isinstance(tools, Mapping) else None,
        )

    def marker(self) -> EngineMarker:
        return {
            "release": self.release,
            "lane": self.lane,
            "python": self.python,
            "requirements": list(self.requirements),
            "overrides": list(self.overrides),
        }


def _text(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise EngineError(f"engine spec: {key} is {value!r}, not a string")
    return value


def _int(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int):
        raise EngineError(f"engine spec: {key} is {value!r}, not a number")
    return value


def _texts(data: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EngineError(f"engine spec: {key} is {value!r}, not a list of strings")
    return tuple(value)


def engine_spec(
    settings: Settings,
    kb: Knowledge,
    python: str | None = None,
    manifest: Mapping[str, object] | None = None,
) -> EngineSpec:
    """The environment the settings ask for, from the knowledge base's build of the release on
    the lane, for `python` (the host's CPython minor, "3.11"; None when unknown, as on pyinfra's
    @fake hosts: the release's first). The resolver has already refused unknown pins and lanes
    with the user-facing message, and preflight a Python the release is not built for; this
    only guards against being called without them."""
    release = kb.releases.get(settings.sglang_version)
    build = release.build(settings.cuda_lane) if release is not None else None
    if release is None or build is None:
        raise EngineError(
            f"sglang {settings.sglang_version} on {settings.cuda_lane} is not in the knowledge "
            "base (the resolver should have refused this host)"
        )
    minor = python or release.python.versions[0]
    if minor not in release.python.versions:
        raise EngineError(
            f"sglang {release.version} is not built for Python {minor} (preflight should have "
            "refused this host)"
        )
    gpu = kb.gpus.get(settings.gpu_compute_cap)
    compiler = build.lane.compiler
    where = settings.cuda_redist_manifest
    tools = toolkit(compiler, settings, manifest, where) if compiler is not None else None
    pins = [Pin(p.name, p.version, p.index, p.index_lane) for p in build.packages]
    jit = jit_cache.jit_cache_choice(settings, kb, release.version, build.lane.name)
    if jit.used:  # FlashInfer's prebuilt JIT modules (operations/plan/jit_cache.py)
        pins.append(Pin(jit.project, jit.version, jit_cache.INDEX, build.lane.name))
    return EngineSpec(
        release=release.version,
        lane=build.lane.name,
        cuda=build.lane.cuda,
        min_driver=build.lane.min_driver,
        python=minor,
        pins=tuple(pins),
        overrides=tuple(o.requirement for o in build.overrides),
        arch=gpu.arch if gpu else None,
        compute_cap=settings.gpu_compute_cap,
        gpu_count=settings.gpu_count,
        unproven=tuple(f"{u.what} (source: {cite(u.source)})" for u in build.unproven),
        excludes=tuple(x.package for x in build.excludes),
        toolkit=tools,
    )


@dataclass(frozen=True)
class Index:
    name: str  # uv's name for it, e.g. "pytorch-cu128"
    url: str  # may hold credentials: only ever written to root-only files


def indexes(settings: Settings, spec: EngineSpec) -> list[Index]:
    """The explicit indexes the pins read: a template's `{lane}` is filled with each pin's own
    index lane (the kernel of the cu128 lane reads SGLang's cu129 index)."""
    templates = {
        "torch": settings.torch_index_url,
        "kernel": settings.kernel_index_url,
        jit_cache.INDEX: settings.flashinfer_index_url,
    }
    found: dict[str, Index] = {}
    for pin in spec.pins:
        if pin.index_name is not None and pin.index_name not in found:
            url = templates[pin.index].replace("{lane}", pin.index_lane)
            found[pin.index_name] = Index(pin.index_name, url)
    return list(found.values())


def _toml(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_toml(i) for i in items) + "]"


def project_toml(settings: Settings, spec: EngineSpec, wheelhouse_dir: str | None) -> str:
    """The engine's pyproject.toml: the pins, the overrides, and where each package comes from
    (or, offline, the wheelhouse alone). Builds from source are never run: an sdist-only pin
    fails the lock with uv's message instead of running someone's build script."""
    pinned = exact if wheelhouse_dir is not None else str  # offline: `===` (exact_pins.py)
    lines = [
        "# Written by sglang-deploy (operations/steps/engine.py); uv.lock beside it is the lock.",
        "[project]",
        'name = "sglang-engine"',
        'version = "0"',
        f"requires-python = {_toml(spec.requires_python)}",
        f"dependencies = {_toml_list([pinned(r) for r in spec.requirements])}",
        "",
        "[tool.uv]",
        "package = false",
        "no-build = true",
        f"environments = {_toml_list([LOCK_ENVIRONMENT])}",
    ]
    if spec.overrides:
        lines.append(f"override-dependencies = {_toml_list([pinned(o) for o in spec.overrides])}")
    if spec.excludes:
        lines.append(f"exclude-dependencies = {_toml_list(spec.excludes)}")
    if wheelhouse_dir is not None:
        lines += ["no-index = true", f"find-links = {_toml_list([wheelhouse_dir])}"]
        return "\n".join(lines) + "\n"
    if settings.package_index_url:
        lines += ["", "[[tool.uv.index]]", 'name = "main"']
        lines += [f"url = {_toml(settings.package_index_url)}", "default = true"]
    for index in indexes(settings, spec):
        lines += ["", "[[tool.uv.index]]", f"name = {_toml(index.name)}"]
        lines += [f"url = {_toml(index.url)}", "explicit = true"]
    lines += ["", "[tool.uv.sources]"]
    for pin in spec.pins:
        if pin.index_name is not None:
            lines.append(f"{pin.name} = {{ index = {_toml(pin.index_name)} }}")
    return "\n".join(lines) + "\n"


def pip_config(settings: Settings, wheelhouse_dir: str | None) -> str | None:
    """pip.conf for bootstrapping uv with the system Python's pip; None: pip's own default."""
    if wheelhouse_dir is not None:
        return f"[global]\nno-index = true\nfind-links = {wheelhouse_dir}\n"
    if settings.package_index_url:
        return f"[global]\nindex-url = {settings.package_index_url}\n"
    return None


def tools_uv_config(settings: Settings, wheelhouse_dir: str | None) -> str:
    """ENGINE_ROOT/uv.toml for what is installed beside the engine (sglang-router): the main
    index alone (none: the installer's default), or the wheelhouse alone."""
    lines = ["# Written by sglang-deploy: where sglang-router and its dependencies come from."]
    if wheelhouse_dir is not None:
        lines += ["no-index = true", f"find-links = {_toml_list([wheelhouse_dir])}"]
    elif settings.package_index_url:
        lines += ["[[index]]", 'name = "main"', f"url = {_toml(settings.package_index_url)}"]
        lines.append("default = true")
    return "\n".join(lines) + "\n"


def lock_path(settings: Settings, spec: EngineSpec) -> str:
    """The engine's lock on the controller."""
    return os.path.join(settings.engine_lock_dir, f"{spec.name}.lock")


def missing_wheels(requirements: tuple[str, ...], wheel_names: list[str]) -> list[str]:
    """The `name==version` requirements that no wheel file in `wheel_names` satisfies."""
    have: set[tuple[str, Version]] = set()
    for file_name in wheel_names:
        try:
            project, found, _, _ = parse_wheel_filename(file_name)
        except ValueError:
            continue
        have.add((canonicalize_name(project), found))
    pins = [(r, *r.partition("==")[::2]) for r in requirements]
    return [r for r, name, pin in pins if (canonicalize_name(name), Version(pin)) not in have]
