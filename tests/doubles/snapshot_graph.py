"""The real package graph the e2e indexes serve: what `uv lock` of the engine's production
project resolves against the captured index metadata (tests/fixtures/index-snapshot/), for each
(release, lane) build the e2e tests deploy, on the containers' Python.

    graph = e2e_graph()                        # locked once per snapshot, cached
    for pin in graph.builds["0.5.11-cu128"].pins: pin.index, pin.name, pin.version
    captured("torch", "2.11.0+cu128").requires_dist   # the snapshot's METADATA of one file

Every double wheel (tests/doubles/wheels.py) takes its METADATA from `captured(...)`: the
snapshot's file (PyPI's own METADATA, or the capture's cited reconstruction for PyTorch's +lane
builds and SGLang's kernel index, tests/fixtures/index-snapshot/SOURCE.md and citations.json).

The e2e tests' pin-change target, 0.5.19 on cu128, does not lock against the snapshot as
captured (tests/unit/test_real_metadata.py KNOWN_FAILURES: its kernel pin 0.4.6.post1+cu129 is
not in the captured kernel index, so uv never asked the capture for its torch 2.13.0+cu128, its
torchvision 0.28.0+cu128, or what that torch names). What we chose: the e2e locks it against a
copy of the snapshot (`overlay`, never the fixture itself) with the RECONSTRUCTED files added,
each made the way the capture script makes every file it does not read, and each cited:

- the kernel: its PyPI twin's METADATA (0.4.6.post1), Version set to the index's;
- torchvision: the captured +cu130 build's (PyPI's own), Version set;
- torch: the captured 2.13.0+cu130 (PyPI's own), Version set, its CUDA lines replaced by the
  capture script's TORCH_CUDA[('2.13.0', '12.8')] (INFERRED there);
- nvidia-cudnn-cu12 9.20.0.48 and nvidia-nccl-cu12 2.29.7, which that torch names: INFERRED
  from the captured 9.19.0.56 and 2.28.9, Version set (their -cu13 twins at both versions name
  the same requirements).

So the 0.5.19/cu128 graph is the real one everywhere but those five files; the day the snapshot
holds them (a newer sgl-project/whl capture), RECONSTRUCTED goes, as KNOWN_FAILURES does.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "index-snapshot"
CAPTURE_SCRIPT = ROOT / "scripts" / "capture_index_snapshot.py"
KNOWLEDGE_FILE = ROOT / "operations" / "kb" / "knowledge" / "sglang.yaml"
# What else decides the production project's pins: the flashinfer-jit-cache pin comes from
# caches.yaml and the default of the setting flashinfer_jit_cache.
PIN_FILES = (
    ROOT / "operations" / "kb" / "knowledge" / "caches.yaml",
    ROOT / "operations" / "settings" / "settings.schema.json",
)
# The containers' Python (Debian 12): an engine is locked for the host's Python alone.
E2E_PYTHON = "3.11"
# The (release, lane) builds the e2e tests deploy: 0.5.11 and its pin-change target 0.5.19 on
# CT200's cu128 lane, and 0.5.11 on cu130 (the 580-driver host).
E2E_BUILDS = (("0.5.11", "cu128"), ("0.5.19", "cu128"), ("0.5.11", "cu130"))
# The wheel tags a file's METADATA is read from, best first, for E2E_PYTHON on Linux x86_64.
_PREFERRED = ("cp311-cp311", "abi3", "py3-none", "py2.py3-none")


@dataclass(frozen=True)
class Captured:
    """The METADATA of one file of one index, as the snapshot (or RECONSTRUCTED) holds it."""

    index: str  # main, pytorch-<lane>, sglang-<lane>, flashinfer-<lane>: the snapshot's folder
    filename: str  # the wheel it is the METADATA of
    metadata: str
    source: str  # the snapshot file it copies, relative to the repository, or the reconstruction

    @property
    def name(self) -> str:
        return str(canonicalize_name(parse_wheel_filename(self.filename)[0]))

    @property
    def version(self) -> str:
        return str(parse_wheel_filename(self.filename)[1])

    def fields(self, key: str) -> list[str]:
        return metadata_fields(self.metadata).get(key, [])

    @property
    def requires_dist(self) -> list[str]:
        return self.fields("Requires-Dist")

    @property
    def requires_python(self) -> str | None:
        found = self.fields("Requires-Python")
        return found[0] if found else None


def metadata_fields(text: str) -> dict[str, list[str]]:
    """A METADATA file's header fields (the part before the first blank line): key -> values,
    in order. Continuation lines (a leading space or tab) belong to the field above."""
    fields: dict[str, list[str]] = {}
    last: str | None = None
    for line in text.split("\n\n", 1)[0].splitlines():
        if line[:1] in (" ", "\t") and last is not None:
            fields[last][-1] += "\n" + line
            continue
        key, _, value = line.partition(":")
        last = key.strip()
        fields.setdefault(last, []).append(value.strip())
    return fields


# -- the reconstructed files (see the module docstring) -------------------------------------


@dataclass(frozen=True)
class Reconstruction:
    index: str
    filename: str
    base: str  # the snapshot file whose METADATA it starts from, relative to SNAPSHOT
    torch_lane: str | None  # torch: the lane whose CUDA requirements replace the base's
    why: str


RECONSTRUCTED = (
    Reconstruction(
        "sglang-cu129",
        "sglang_kernel-0.4.6.post1+cu129-cp310-abi3-manylinux2014_x86_64.whl",
        "main/sglang-kernel/sglang_kernel-0.4.6.post1-cp310-abi3-manylinux2014_x86_64.whl.metadata",
        None,
        "the kernel index's pinned wheel takes its PyPI twin's METADATA, Version set to the "
        "index's (the capture's rule, SOURCE.md `sglang-<lane>/`); 0.4.6.post1+cu129 itself is "
        "not in the captured kernel index (github.com/sgl-project/whl at 2504c0ad)",
    ),
    Reconstruction(
        "pytorch-cu128",
        "torchvision-0.28.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",
        "pytorch-cu130/torchvision/torchvision-0.28.0+cu130-cp311-cp311-manylinux_2_28_x86_64"
        ".whl.metadata",
        None,
        "PyPI's torchvision 0.28.0 METADATA as captured for +cu130, Version set to +cu128 "
        "(torchvision names torch without a local tag on every lane, SOURCE.md)",
    ),
    Reconstruction(
        "pytorch-cu128",
        "torch-2.13.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",
        "pytorch-cu130/torch/torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl.metadata",
        "cu128",
        "PyPI's torch 2.13.0 METADATA as captured for +cu130, Version set to +cu128, its CUDA "
        "lines replaced by scripts/capture_index_snapshot.py TORCH_CUDA[('2.13.0', '12.8')] "
        "(INFERRED there, not read from PyTorch's build matrix)",
    ),
    # What that torch names and uv never asked the capture for (its lock failed first):
    Reconstruction(
        "main",
        "nvidia_cudnn_cu12-9.20.0.48-py3-none-manylinux_2_27_x86_64.whl",
        "main/nvidia-cudnn-cu12/nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"
        ".metadata",
        None,
        "INFERRED, not read: PyPI's nvidia-cudnn-cu12 9.19.0.56 METADATA as captured, Version "
        "set to 9.20.0.48 (the captured -cu13 9.19.0.56 and 9.20.0.48 name the same "
        "requirements)",
    ),
    Reconstruction(
        "main",
        "nvidia_nccl_cu12-2.29.7-py3-none-manylinux_2_18_x86_64.whl",
        "main/nvidia-nccl-cu12/nvidia_nccl_cu12-2.28.9-py3-none-manylinux_2_18_x86_64.whl.metadata",
        None,
        "INFERRED, not read: PyPI's nvidia-nccl-cu12 2.28.9 METADATA as captured, Version set "
        "to 2.29.7 (the captured -cu13 2.28.9 and 2.29.7 name the same requirements: none)",
    ),
)


def _reconstruct(entry: Reconstruction) -> str:
    text = (SNAPSHOT / entry.base).read_text()
    version = str(parse_wheel_filename(entry.filename)[1])
    text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1)
    if entry.torch_lane is not None:
        from operations import kb as kb_module

        script = script_module("capture_index_snapshot")  # its TORCH_CUDA table and rule
        sources = script.Sources(kb=kb_module.load(), whl_repo=Path())
        text, _ = sources._torch_cuda(text, version.split("+")[0], entry.torch_lane)
    return text


@cache
def reconstructed() -> dict[tuple[str, str], Captured]:
    """(index, filename) -> the RECONSTRUCTED file's METADATA."""
    return {
        (e.index, e.filename): Captured(
            e.index, e.filename, _reconstruct(e), f"RECONSTRUCTED from {e.base}: {e.why}"
        )
        for e in RECONSTRUCTED
    }


def _rank(filename: str) -> int:
    tags = filename[:-4].split("-", 2)[2] if filename.endswith(".whl") else ""
    return next((i for i, t in enumerate(_PREFERRED) if t in tags), len(_PREFERRED))


def captured(name: str, version: str, index: str | None = None) -> Captured:
    """The captured METADATA of project `name` at `version` (on `index`, else the one index
    that has it), from the file best suited to E2E_PYTHON on Linux x86_64."""
    project = canonicalize_name(name)
    wanted = Version(version)
    found: list[Captured] = [
        c
        for (i, _), c in reconstructed().items()
        if (index in (None, i)) and c.name == project and Version(c.version) == wanted
    ]
    folders = [SNAPSHOT / index / project] if index else sorted(SNAPSHOT.glob(f"*/{project}"))
    for folder in folders:
        for path in sorted(folder.glob("*.whl.metadata")):
            filename = path.name[: -len(".metadata")]
            if parse_wheel_filename(filename)[1] == wanted:
                found.append(
                    Captured(
                        folder.parent.name,
                        filename,
                        path.read_text(),
                        str(path.relative_to(ROOT)),
                    )
                )
    if not found:
        raise LookupError(
            f"{name} {version}: no METADATA in {SNAPSHOT.relative_to(ROOT)}"
            + (f"/{index}" if index else "")
            + " (refresh it with scripts/capture_index_snapshot.py)"
        )
    if len({c.index for c in found}) > 1:
        raise LookupError(f"{name} {version}: on {sorted({c.index for c in found})}, name one")
    return min(found, key=lambda c: _rank(c.filename))


def double_metadata(name: str, version: str) -> Captured:
    """The METADATA a double of `name` `version` carries: the captured file of that version;
    where the snapshot holds none (another lane's build that only a unit test of a double
    builds: torch or torchaudio 2.11.0+cu129, PyPI's plain sglang-kernel 0.4.2), its twin's,
    the captured build of the same public version with the Version set, as the capture makes
    every index file it does not read (SOURCE.md), and its source says so (for torch the CUDA
    lines are then the twin's lane's). Every e2e double is a captured file
    (tests/unit/test_engine_doubles.py)."""
    try:
        return captured(name, version)
    except LookupError:
        pass
    public = Version(version).public
    project = canonicalize_name(name)
    twins = sorted(
        (p for p in SNAPSHOT.glob(f"*/{project}/*.whl.metadata")),
        key=lambda p: _rank(p.name[: -len(".metadata")]),
    )
    for path in twins:
        filename = path.name[: -len(".metadata")]
        if parse_wheel_filename(filename)[1].public == public:
            twin = captured(name, str(parse_wheel_filename(filename)[1]), path.parent.parent.name)
            text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", twin.metadata, count=1)
            own = filename.replace(f"-{parse_wheel_filename(filename)[1]}-", f"-{version}-", 1)
            source = f"{twin.source}, Version set to {version} (a twin: this build is not captured)"
            return Captured(twin.index, own, text, source)
    raise LookupError(f"{name} {version}: no METADATA of {public} in the snapshot")


def newest(name: str, specifier: str, index: str = "main") -> str:
    """The newest version of `name` on a snapshot index that `specifier` admits (what uv picks
    for a requirement nothing else narrows)."""
    folder = SNAPSHOT / index / canonicalize_name(name)
    versions = {
        parse_wheel_filename(p.name[: -len(".metadata")])[1] for p in folder.glob("*.whl.metadata")
    }
    admitted = sorted(SpecifierSet(specifier).filter(versions))
    if not admitted:
        raise LookupError(f"{name}{specifier}: nothing on {index} in the snapshot")
    return str(admitted[-1])


def overlay(target: Path) -> Path:
    """A copy of the snapshot at `target` with the RECONSTRUCTED files added to their pages
    (PEP 658 `data-core-metadata`, as the capture writes them)."""
    shutil.copytree(SNAPSHOT, target)
    for (index, filename), entry in reconstructed().items():
        folder = target / index / entry.name
        folder.mkdir(parents=True, exist_ok=True)
        data = entry.metadata.encode()
        (folder / f"{filename}.metadata").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        attrs = [f'href="{html.escape(urllib.parse.quote(filename))}"']
        if entry.requires_python:
            attrs.append(f'data-requires-python="{html.escape(entry.requires_python)}"')
        attrs += [
            f'data-core-metadata="sha256={digest}"',
            f'data-dist-info-metadata="sha256={digest}"',
        ]
        link = f"<a {' '.join(attrs)}>{html.escape(filename)}</a><br/>\n"
        page = folder / "index.html"
        text = (
            page.read_text() if page.exists() else "<!DOCTYPE html>\n<html><body>\n</body></html>\n"
        )
        page.write_text(text.replace("</body>", link + "</body>", 1))
    return target


# -- the locked graph ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """One package of a lock: where it came from and the file whose METADATA stands for it."""

    index: str
    name: str
    version: str
    filename: str
    dependencies: tuple[str, ...]


@dataclass(frozen=True)
class Build:
    release: str
    lane: str
    pins: tuple[Pin, ...]

    def pin(self, name: str) -> Pin:
        project = canonicalize_name(name)
        return next(p for p in self.pins if p.name == project)

    def closure(self, roots: tuple[str, ...]) -> set[str]:
        """The projects `roots` need in this lock, themselves included."""
        by_name = {p.name: p for p in self.pins}
        seen: set[str] = set()
        todo = [str(canonicalize_name(r)) for r in roots if canonicalize_name(r) in by_name]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += by_name[name].dependencies
        return seen


@dataclass(frozen=True)
class Graph:
    builds: dict[str, Build]  # "0.5.11-cu128" -> its lock

    def build(self, release: str, lane: str) -> Build:
        return self.builds[f"{release}-{lane}"]


def _pins(lock_text: str) -> tuple[Pin, ...]:
    pins = []
    for package in tomllib.loads(lock_text)["package"]:
        registry = package["source"].get("registry")
        if registry is None:  # the virtual project itself
            continue
        index = registry.rstrip("/").rsplit("/", 1)[1]
        names = [urllib.parse.unquote(w["url"].rsplit("/", 1)[1]) for w in package["wheels"]]
        pins.append(
            Pin(
                index,
                package["name"],
                package["version"],
                min(names, key=_rank),
                tuple(sorted({d["name"] for d in package.get("dependencies", [])})),
            )
        )
    return tuple(pins)


def _key() -> str:
    """What the graph depends on: the snapshot, the knowledge base (overrides, pins, the
    jit-cache's availability and setting), this module and the capture script (the
    reconstructions), and uv."""
    from tests.snapshot_index import uv_binary

    digest = hashlib.sha256()
    files = sorted(p for p in SNAPSHOT.rglob("*") if p.is_file())
    for path in [*files, KNOWLEDGE_FILE, *PIN_FILES, Path(__file__), CAPTURE_SCRIPT]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    uv = subprocess.run([uv_binary(), "--version"], capture_output=True, check=True, timeout=60)
    digest.update(uv.stdout)
    digest.update(json.dumps(E2E_BUILDS).encode())
    return digest.hexdigest()[:20]


def _lock_all(work: Path) -> dict[str, Build]:
    from operations import kb as kb_module
    from tests.snapshot_index import LockCase, SnapshotIndex, lock

    kb = kb_module.load()
    builds = {}
    with SnapshotIndex(overlay(work / "snapshot"), log=work / "http.log") as index:
        for release, lane in E2E_BUILDS:
            project = work / f"{release}-{lane}"
            proc = lock(LockCase(release, lane, E2E_PYTHON), index.base, project, work / "uv", kb)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{release} on {lane} does not lock against the snapshot (with "
                    f"RECONSTRUCTED): {proc.stderr[-2000:]}"
                )
            pins = _pins((project / "uv.lock").read_text())
            builds[f"{release}-{lane}"] = Build(release, lane, pins)
    return builds


def _to_json(builds: dict[str, Build]) -> str:
    return json.dumps(
        {
            key: [[p.index, p.name, p.version, p.filename, list(p.dependencies)] for p in b.pins]
            for key, b in builds.items()
        },
        indent=1,
    )


def _from_json(text: str) -> dict[str, Build]:
    builds = {}
    for key, rows in json.loads(text).items():
        release, lane = key.rsplit("-", 1)
        builds[key] = Build(
            release, lane, tuple(Pin(i, n, v, f, tuple(d)) for i, n, v, f, d in rows)
        )
    return builds


@cache
def e2e_graph() -> Graph:
    """Every E2E_BUILDS lock against the snapshot (with RECONSTRUCTED), made once per content
    of what it depends on and cached under the testbed cache (about 10 s to make)."""
    from tests.testbed.rootfs import CACHE_DIR

    path = CACHE_DIR / "index-doubles" / f"graph-{_key()}.json"
    if path.exists():
        return Graph(_from_json(path.read_text()))
    with tempfile.TemporaryDirectory(prefix="snapshot-graph-") as work:
        text = _to_json(_lock_all(Path(work)))
    try:  # kept for the next session; a cache this user cannot write only costs the lock
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)
    except OSError:
        pass
    return Graph(_from_json(text))
