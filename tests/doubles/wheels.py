"""TEST DOUBLES as real wheels, each carrying its package's whole captured METADATA.

Every double is a genuine, installable wheel (METADATA, WHEEL, RECORD with hashes, written with
zipfile), named and versioned as the real one (py3-none-any), whose METADATA is the one the
index snapshot holds for that project and version (tests/fixtures/index-snapshot/: PyPI's own,
or the capture's cited reconstruction for PyTorch's +lane builds and SGLang's kernel index; see
tests/doubles/snapshot_graph.py): every Requires-Dist and Requires-Python line, so uv meets the
graph tests/unit/test_real_metadata.py meets. Only the Summary changes: it says TEST DOUBLE and
names the snapshot file the METADATA copies.

Three kinds of wheel stand in the e2e indexes (tests/e2e/deploying.py make_indexes):

- GPU doubles, with double code: what the engine check (operations/programs/engine_check.py) or the
  server double imports and what needs a GPU: torch, torchvision, torchaudio, the SGLang kernel
  package, flashinfer, cuda-python (its `cuda.bindings.driver` double; the real one ships it in
  cuda-bindings, which is an index double here), sglang (its launch_server double) and, where
  the knowledge base lists one for the release's FlashInfer on the lane, flashinfer-jit-cache
  (the prebuilt modules the rank-start double loads instead of building them). The
  sources live in tests/doubles/packages/; the values of one build (version, CUDA build,
  architectures) go into a generated `_double_build.py`, and the sglang wheel embeds the
  release's real option table from operations/kb/knowledge/cli/.
- REAL wheels from PyPI (tests/e2e/index.py pypi_wheel), for what the doubles or the deploy
  really import on the host: the OpenAI client and its closure in the lock (httpx, which
  operations/programs/smoke.py imports, anyio, pydantic, ...). REAL names the roots.
- Index doubles (`index_double`): everything else the lock pulls in (the nvidia-*-cu12 and
  cuda-toolkit libraries, triton, transformers, outlines, ...): the captured METADATA and an
  empty package (nothing but its .dist-info). Nothing imports them: they are GPU libraries or
  code the doubles never execute, and the real ones cost gigabytes per container.

    paths = release_wheels(outdir, "0.5.11", "cu128")   # the GPU doubles of one build
    torch_wheel(outdir, "2.11.0+cu130", cuda="13.0")     # a wrong-lane torch
    index_double(outdir, captured("triton", "3.7.1"))    # a package no double imports
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import random
import re
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.doubles.snapshot_graph import (
    Captured,
    double_metadata,
    metadata_fields,
    newest,
)
from tests.doubles.startup_lines import startup_json

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = Path(__file__).resolve().parent / "packages"
KNOWLEDGE = ROOT / "operations" / "kb" / "knowledge"
# Fixed timestamps make a rebuilt wheel byte-identical, so index hashes stay stable.
ZIP_DATE = (2020, 1, 1, 0, 0, 0)
# What torch 2.x cu12.8+ builds list in torch.cuda.get_arch_list() on x86_64 (sm_120 included).
DEFAULT_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def dist_name(name: str) -> str:
    """The wheel file name form of a project name (PEP 427/503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(
    outdir: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    requires: list[str] | None = None,
    requires_python: str | None = None,
    summary: str = "TEST DOUBLE",
    metadata: Captured | None = None,
) -> Path:
    """Write `name-version-py3-none-any.whl` holding `files` (archive path -> bytes). With
    `metadata`, its METADATA is that captured file's, whole, its Summary replaced by
    `summary` and the file it copies; else one of `requires` and `requires_python` alone."""
    outdir.mkdir(parents=True, exist_ok=True)
    base = f"{dist_name(name)}-{version}"
    info = f"{base}.dist-info"
    if metadata is not None:
        text = _copied_metadata(metadata, summary)
    else:
        lines = [
            "Metadata-Version: 2.1",
            f"Name: {name}",
            f"Version: {version}",
            f"Summary: {summary}",
        ]
        if requires_python:
            lines.append(f"Requires-Python: {requires_python}")
        lines += [f"Requires-Dist: {r}" for r in requires or []]
        text = "\n".join(lines) + "\n"
    entries = dict(sorted(files.items()))
    entries[f"{info}/METADATA"] = text.encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sglang-deploy tests/doubles/wheels.py\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in entries.items()]
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = outdir / f"{base}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries.items():
            zinfo = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
            zinfo.external_attr = 0o644 << 16
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zinfo, data)
    return path


def _copied_metadata(metadata: Captured, summary: str) -> str:
    """The captured METADATA with its Summary saying TEST DOUBLE and naming what it copies."""
    head, sep, body = metadata.metadata.partition("\n\n")
    lines = head.split("\n")
    said = f"Summary: {summary}; METADATA copied from {metadata.source}"
    at = next((i for i, line in enumerate(lines) if line.startswith("Summary:")), None)
    if at is None:
        at = next(i for i, line in enumerate(lines) if line.startswith("Version:"))
        lines.insert(at + 1, said)
    else:
        # A folded Summary continues on lines that start with whitespace.
        end = at + 1
        while end < len(lines) and lines[end][:1] in (" ", "\t"):
            end += 1
        lines[at:end] = [said]
    return "\n".join(lines) + sep + body


def index_double(outdir: Path, metadata: Captured) -> Path:
    """A package no double imports: its captured METADATA and nothing else."""
    return build_wheel(
        outdir,
        metadata.name,
        metadata.version,
        {},
        summary="TEST DOUBLE (empty)",
        metadata=metadata,
    )


def _package_files(
    package: str, build: dict[str, Any], source: str | None = None
) -> dict[str, bytes]:
    """The double's sources for import package `package`, plus its _double_build.py."""
    src = PACKAGES / (source or package)
    files = {
        f"{package}/{p.relative_to(src).as_posix()}": p.read_bytes()
        for p in sorted(src.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    lines = ['"""Generated by tests/doubles/wheels.py: the values of this TEST DOUBLE build."""']
    lines += [f"{key} = {value!r}" for key, value in build.items()]
    files[f"{package}/_double_build.py"] = ("\n".join(lines) + "\n").encode()
    return files


@cache
def knowledge() -> dict[str, Any]:
    """The knowledge base as YAML, read once (callers only read it)."""
    data: dict[str, Any] = yaml.safe_load((KNOWLEDGE / "sglang.yaml").read_text())
    return data


def cli_table(release: str) -> bytes:
    path = KNOWLEDGE / "cli" / f"sglang-{release}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the sglang double embeds the release's real option table "
            f"(run scripts/gen_cli_table.py sglang {release})"
        )
    return path.read_bytes()


def lane_cuda(tag: str) -> str:
    """The CUDA version of a build tag (cu128 -> 12.8), as the knowledge base's lanes say."""
    lane: str = knowledge()["lanes"][tag]["cuda"]
    return lane


def _tag(version: str) -> str | None:
    return version.partition("+")[2] or None


def torch_wheel(
    outdir: Path,
    version: str,
    cuda: str | None = None,
    archs: tuple[str, ...] = DEFAULT_ARCHS,
    padding_bytes: int = 0,
) -> Path:
    """torch `version` (its build tag included, "2.11.0+cu128"); `cuda` is what
    torch.version.cuda says (default: the tag's lane). Its METADATA is the snapshot's for that
    build (the +cu128 build's `cuda-bindings<13,>=12.9.4` included).

    padding_bytes adds an incompressible blob (as the real wheel's CUDA libraries are), for
    benchmarks that should move bytes; it is seeded, so the wheel stays reproducible."""
    tag = _tag(version)
    cuda = cuda or (lane_cuda(tag) if tag else "13.0")
    build = {"VERSION": version, "CUDA": cuda, "ARCH_LIST": list(archs)}
    files = _package_files("torch", build)
    if padding_bytes:
        rng = random.Random(0)
        chunks = [
            rng.randbytes(min(2**20, padding_bytes - i)) for i in range(0, padding_bytes, 2**20)
        ]
        files["torch/lib/_double_padding.bin"] = b"".join(chunks)
    return build_wheel(
        outdir,
        "torch",
        version,
        files,
        summary=f"TEST DOUBLE of torch (CUDA {cuda} as torch.version.cuda)",
        metadata=double_metadata("torch", version),
    )


def companion_wheel(outdir: Path, name: str, version: str, cuda: str) -> Path:
    """torchvision or torchaudio of one CUDA build, with its captured METADATA (torchvision
    names torch without a local tag, as PyTorch's own builds do)."""
    files = _package_files(name, {"VERSION": version, "CUDA": cuda})
    return build_wheel(
        outdir, name, version, files, summary=f"TEST DOUBLE of {name}",
        metadata=double_metadata(name, version),
    )  # fmt: skip


def kernel_wheel(
    outdir: Path, package: str, version: str, cuda: str, *, captured_metadata: bool = True
) -> Path:
    """The SGLang kernel package (sgl-kernel or sglang-kernel) of one CUDA build, with its
    captured METADATA; `captured_metadata=False` for an index entry the snapshot does not hold
    and the engine must never read (its requirements are then none)."""
    files = _package_files("sgl_kernel", {"VERSION": version, "CUDA": cuda})
    if not captured_metadata:
        summary = "TEST DOUBLE of an index entry no lock may read (no captured METADATA)"
        return build_wheel(outdir, package, version, files, summary=summary)
    return build_wheel(
        outdir, package, version, files, summary=f"TEST DOUBLE of {package} (CUDA {cuda})",
        metadata=double_metadata(package, version),
    )  # fmt: skip


def flashinfer_wheel(outdir: Path, version: str) -> Path:
    files = _package_files("flashinfer", {"VERSION": version})
    return build_wheel(
        outdir, "flashinfer-python", version, files, summary="TEST DOUBLE of flashinfer",
        metadata=double_metadata("flashinfer-python", version),
    )  # fmt: skip


def _startup_modules() -> tuple[str, ...]:
    """The FlashInfer modules the rank-start double JIT-compiles (its MODULES), read from its
    source: the jit-cache double holds exactly those."""
    source = (PACKAGES / "sglang" / "_startup_double.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULES":
            found: tuple[str, ...] = ast.literal_eval(node.value)
            return found
    raise LookupError("the rank-start double names no MODULES")


def jit_cache_wheel(outdir: Path, version: str) -> Path:
    """flashinfer-jit-cache `version` ("0.6.8.post1+cu128"): the captured METADATA (as the real
    one, no Requires-Dist) and the AOT module of every module the rank-start double builds,
    at jit_cache/<name>/<name>.so (flashinfer jit/core.py:256-257)."""
    files = _package_files("flashinfer_jit_cache", {"VERSION": version})
    for name in _startup_modules():
        files[f"flashinfer_jit_cache/jit_cache/{name}/{name}.so"] = (
            f"TEST DOUBLE of FlashInfer's prebuilt module {name} ({version})\n".encode()
        )
    return build_wheel(
        outdir, "flashinfer-jit-cache", version, files,
        summary="TEST DOUBLE of flashinfer-jit-cache (FlashInfer's prebuilt JIT modules)",
        metadata=double_metadata("flashinfer-jit-cache", version),
    )  # fmt: skip


def cuda_python_wheel(outdir: Path, version: str) -> Path:
    """cuda-python with the CUDA driver API the engine check calls (`cuda.bindings.driver`,
    tests/doubles/packages/cuda: the testbed's GPUs as the torch double sees them). The real
    cuda-python is a metapackage whose cuda-bindings ships that module; here cuda-bindings is
    an index double (its METADATA, no files), so the module is this wheel's alone."""
    files = _package_files("cuda", {"VERSION": version})
    return build_wheel(
        outdir, "cuda-python", version, files, summary="TEST DOUBLE of cuda-python's driver API",
        metadata=double_metadata("cuda-python", version),
    )  # fmt: skip


def plain_wheel(outdir: Path, name: str, version: str, summary: str = "TEST DOUBLE") -> Path:
    """A project with nothing but its version (an index's dev build of sglang, which the
    snapshot does not hold: no lock may read it)."""
    module = dist_name(name)
    return build_wheel(outdir, name, version, {f"{module}/__init__.py": b""}, summary=summary)


# The roots of what the doubles or the deploy really import on the host, served as the REAL
# wheels from PyPI with everything they need in the lock: the OpenAI client (the real sglang
# requires it; operations/programs/smoke.py sends through its transport, httpx).
REAL = ("openai", "httpx")
# The packages with double code (release_wheels' roles by project); every other package of a
# lock is REAL or an index double.
DOUBLED = ("sglang", "torch", "torchvision", "torchaudio", "sgl-kernel", "sglang-kernel",
           "flashinfer-python", "cuda-python", "flashinfer-jit-cache")  # fmt: skip


def sglang_wheel(outdir: Path, release: str) -> Path:
    """sglang `release` with its captured METADATA (every requirement of PyPI's wheel) and a
    launch_server double."""
    files = _package_files("sglang", {"VERSION": release})
    files["sglang/_cli_table.json"] = cli_table(release)
    files["sglang/_startup_lines.json"] = startup_json(release)
    return build_wheel(
        outdir,
        "sglang",
        release,
        files,
        summary="TEST DOUBLE of SGLang (launch_server is a stdlib HTTP double)",
        metadata=double_metadata("sglang", release),
    )


def release_wheels(
    outdir: Path, release: str, lane: str, torch_padding_bytes: int = 0
) -> dict[str, Path]:
    """Every double wheel one release needs on one lane, by role: the lane's builds of torch,
    torchvision, torchaudio and the kernel (each with its `index` and `index_lane` in
    `placement`), and sglang, flashinfer and cuda-python for the main index."""
    pins = knowledge()["releases"][release]
    build = pins["builds"][lane]["packages"]
    torch = build["torch"]["version"]
    cuda = lane_cuda(lane)
    out: dict[str, Path] = {
        "sglang": sglang_wheel(outdir, release),
        "torch": torch_wheel(outdir, torch, padding_bytes=torch_padding_bytes),
    }
    for name in ("torchvision", "torchaudio"):
        out[name] = companion_wheel(outdir, name, build[name]["version"], cuda)
    kernel = next(n for n in build if n in ("sgl-kernel", "sglang-kernel"))
    entry = build[kernel]
    kernel_cuda = lane_cuda(_tag(entry["version"]) or entry.get("index_lane", lane))
    out["kernel"] = kernel_wheel(outdir, kernel, entry["version"], kernel_cuda)
    # The version a lane's override takes (cuda-python==12.9.4 on CUDA 12 lanes,
    # flashinfer-python==0.6.18 for 0.5.19's), else the release's own pin, else the newest the
    # snapshot holds that the release's requirement admits (cuda-python>=13.0: what uv picks).
    overrides = [
        o["requirement"]
        for o in [*pins.get("overrides", []), *pins["builds"][lane].get("overrides", [])]
    ]
    for role, project in (("flashinfer", "flashinfer-python"), ("cuda-python", "cuda-python")):
        version = _pin(overrides, project) or _pin(pins["requires"], project)
        if not version:
            version = newest(project, _specifier(pins["requires"], project))
        maker = flashinfer_wheel if role == "flashinfer" else cuda_python_wheel
        out[role] = maker(outdir, version)
    jit = jit_cache_version(release, lane)
    if jit is not None:
        out["flashinfer-jit-cache"] = jit_cache_wheel(outdir, jit)
    return out


def jit_cache_version(release: str, lane: str) -> str | None:
    """The flashinfer-jit-cache an engine of `release` on `lane` pins with the default settings
    (operations/plan/jit_cache.py decides it): None where it pins none."""
    from operations import kb
    from operations.plan.jit_cache import jit_cache_choice
    from operations.settings import Layer, load

    settings = load("doubles", [Layer("doubles", {"model_source": "/m", "cuda_lane": lane})])
    choice = jit_cache_choice(settings, kb.load(), release, lane)
    return choice.version if choice.used else None


def _specifier(requires: list[str], project: str) -> str:
    for requirement in requires:
        parsed = Requirement(requirement)
        if canonicalize_name(parsed.name) == canonicalize_name(project):
            return str(parsed.specifier)
    raise LookupError(f"the release does not require {project}")


def placement(release: str, lane: str) -> dict[str, tuple[str, str]]:
    """role -> (index, index lane) of the lane's builds, from the knowledge base."""
    build = knowledge()["releases"][release]["builds"][lane]["packages"]
    found = {}
    for name, entry in build.items():
        role = "kernel" if name in ("sgl-kernel", "sglang-kernel") else name
        found[role] = (entry["index"], entry.get("index_lane", lane))
    return found


def _pin(requires: list[str], prefix: str) -> str:
    for requirement in requires:
        if requirement.replace("_", "-").startswith(prefix) and "==" in requirement:
            return requirement.split("==", 1)[1]
    return ""


def metadata_of(wheel: Path) -> dict[str, list[str]]:
    """METADATA header fields of a wheel (for tests): field -> values, in order."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return metadata_fields(zf.read(name).decode())


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "wheels")
    print(json.dumps({k: str(v) for k, v in release_wheels(out, "0.5.11", "cu128").items()}))
