#!/usr/bin/env python3
"""Refresh tests/fixtures/index-snapshot/: the real index metadata every engine lock meets.

For every (release, lane) build of the knowledge base and every Python the release claims (and
the negative cases of tests/unit/test_real_metadata.py), writes the engine project exactly as
production does (engine_spec + project_toml) and runs the real `uv lock` against a recording
proxy on 127.0.0.1:

- `main/`: PyPI's simple API, file URLs rewritten to the proxy, every wheel announced with
  `data-core-metadata` so uv reads only the PEP 658 `.metadata` file (PyPI's own; for a wheel
  PyPI has none for, the wheel's METADATA read with HTTP range requests), never a wheel;
- `pytorch-<lane>/`: torch, torchvision, torchaudio `+<lane>` builds the knowledge base pins,
  reconstructed (download.pytorch.org is unreachable here): PyPI's METADATA of the same version,
  the version given its local tag, and for torch the CUDA requirements of the lane (TORCH_CUDA,
  below, or the build matrix given with --build-matrix);
- `sglang-<lane>/`: the kernel index's real file list with its sha256s, from a checkout of
  github.com/sgl-project/whl (--whl-repo), each pinned wheel's METADATA that of its PyPI twin;
- `flashinfer-<lane>/`: flashinfer-jit-cache, the x86_64 wheels of FlashInfer's per-lane index
  (https://flashinfer.ai/whl/<lane>/, unreachable here) with the sha256 its pages give
  (JIT_CACHE_SHA256, below), each METADATA reconstructed from the project's pyproject.toml.

Then keeps only what uv asked for (the pages it read, at the versions whose metadata it read,
Linux x86_64 / abi3 / none-any files for CPython 3.10-3.13, and sdists), writes the tree, and
replays every lock against the written tree: each must give the same uv.lock (or fail the same
way) as against the live proxy. Run by hand, with PyPI reachable:

    .venv/bin/python scripts/capture_index_snapshot.py --whl-repo /path/to/sgl-project-whl.git

`--release VERSION` (repeatable) captures only that release's locks (the one `operations.kb
intake` just added: minutes, not the hour of all of them) and merges them into the snapshot:
a page keeps the files it had and gains the new ones. Every other lock is replayed against the
snapshot before and after the merge and must come out the same.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import html
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packaging.requirements import Requirement  # noqa: E402
from packaging.tags import parse_tag  # noqa: E402
from packaging.utils import (  # noqa: E402
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version  # noqa: E402

from operations import kb as kb_module  # noqa: E402
from operations.kb import Knowledge  # noqa: E402
from tests.snapshot_index import (  # noqa: E402
    NEGATIVE_CASES,
    SNAPSHOT,
    LockCase,
    SnapshotIndex,
    build_cases,
    find_python,
    lock,
)

PYPI_SIMPLE = "https://pypi.org/simple"
WHL_COMMIT = "2504c0ad5d878f1f1cfdda5cf560b7209ea13fee"  # tests/fixtures/sglang-whl/SOURCE.md
CPYTHONS = {f"cp3{m}" for m in range(10, 14)}
INTERPRETERS = CPYTHONS | {"py3", "py2"} | {f"py3{m}" for m in range(14)}
RANGE_BLOCK = 256 * 1024

# flashinfer-jit-cache on FlashInfer's per-lane indexes, as github.com/flashinfer-ai/whl serves
# them (cu128/flashinfer-jit-cache/index.html at 0d4607bec2167913df112b73d3fdc3f65f9ba086;
# cu129/ and cu130/ at 0bdc76f9fd04ac28035e164e6cac74b3d7bfd753): the sha256 of the x86_64
# wheel `flashinfer_jit_cache-<V>+<lane>-cp39-abi3-manylinux_2_28_x86_64.whl` of each build
# operations/kb/knowledge/caches.yaml marks available for a FlashInfer a release pins.
JIT_CACHE_SHA256 = {
    ("cu128", "0.6.3"): "21eb1e549754b83edaa3fbaad312e52a2522776c08d7329ca2285740b9d02ba3",
    ("cu128", "0.6.7.post2"): "7872403ba5c848b81f6b49c770453f990a94c96782251090742e0070d66fc0c9",
    ("cu128", "0.6.7.post3"): "759d388d8b1796b877bc3c716aacedfa035db2f82a9db6ad835ccb61c75abdd7",
    ("cu128", "0.6.8.post1"): "0616d524434c0b4617726877bd27d1ce5456a322f5677eaf7bb617d3875722ca",
    ("cu128", "0.6.11.post1"): "6fc9dddf55034f74263503eb63e34581cc07dfff1a07cbe6468f83afc92a7150",
    ("cu128", "0.6.12"): "5b9f19ff8715b272cba99400384dfb700be19ba19bee10025d921a040963b615",
    ("cu128", "0.6.14"): "ed406f6b3447f43e9c5ce22769bdeb078cb8f441a69dceda3e901495cbea5830",
    ("cu128", "0.6.15.post1"): "1af314fdf5a879b187a3e85c48c71a1f32c4d982ce520666b0d2795060b3e62b",
    ("cu129", "0.6.18"): "e3bf1721ab19a7d8e64ae9df2596e9a4b6bbbf3808f243e37d03025137267040",
    ("cu130", "0.6.8.post1"): "d060f085318d1f55278ce42724fd58e2d4fa2e34b6135e7f6982e1ea374fac6a",
    ("cu130", "0.6.11.post1"): "fd689b3662521af9c38f77c33b4d8165037964d3adcd770da435f874089942f1",
    ("cu130", "0.6.12"): "c7800a4d43bf53f0e11df627f249c13fc1e28b4a39e6ca2f237a01969ba16292",
    ("cu130", "0.6.14"): "22b666dffe4cca7de0ea67668c16c0be819e8a67cdb34c404cf89abeb3d2b510",
    ("cu130", "0.6.15.post1"): "2473dbb78f65002267c221be4d75eb50dbcde51acd5242542f5aea7d1bff1b23",
    ("cu130", "0.6.17"): "e7dd1deecc7f348d41b1eb56217d945d4f1630f447ff9b0b9e7919b0e07c01f0",
    ("cu130", "0.6.18"): "428a47a554ade93c30a818e142b781df58582bf056bab94611fb4c906cc366bf",
}
JIT_CACHE_SOURCE = (
    "RECONSTRUCTED from flashinfer-ai/flashinfer v0.6.12 flashinfer-jit-cache/pyproject.toml: :7 "
    "name, :11 requires-python >=3.9, :31 dependencies = [] (no Requires-Dist; the same at "
    "v0.6.3, v0.6.8.post1, v0.6.17, v0.6.18rc7); the version is FlashInfer's plus the lane "
    "(build_backend.py:51-54, .github/workflows/release.yml:192)"
)


def jit_cache_metadata(version: str) -> bytes:
    """flashinfer-jit-cache's METADATA as its pyproject.toml defines it: no requirements."""
    return (
        f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version}\n"
        "Requires-Python: >=3.9\n"
    ).encode()


# The CUDA requirements PyTorch writes into a torch wheel built for a CUDA version
# (PYTORCH_EXTRA_INSTALL_REQUIREMENTS of .github/scripts/generate_binary_build_matrix.py at the
# release tag), for the builds whose PyPI twin is another CUDA's. --build-matrix replaces an
# entry with the file itself. Each entry: (lines, source).
TORCH_CUDA: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("2.11.0", "12.8"): (
        (
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,"
            'nvrtc,nvtx]==12.8.1; platform_system == "Linux"',
            'cuda-bindings<13,>=12.9.4; platform_system == "Linux"',
            'nvidia-cudnn-cu12==9.19.0.56; platform_system == "Linux"',
            'nvidia-cusparselt-cu12==0.7.1; platform_system == "Linux"',
            'nvidia-nccl-cu12==2.28.9; platform_system == "Linux"',
            'nvidia-nvshmem-cu12==3.4.5; platform_system == "Linux"',
        ),
        "torch-2.11.0+cu128.dist-info/METADATA as installed from download.pytorch.org/whl/cu128"
        " (its Linux Requires-Dist, quoted in public install scripts found by code search); pip's"
        " report in sgl-project/sglang#25069: 'torch 2.11.0+cu128 depends on cuda-bindings<13"
        " and >=12.9.4'; markers as PyPI's 2.11.0",
    ),
    ("2.13.0", "12.8"): (
        (
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,"
            'nvrtc,nvtx]==12.8.1; platform_system == "Linux"',
            'cuda-bindings<13,>=12.9.4; platform_system == "Linux" and python_version < "3.15"',
            'nvidia-cudnn-cu12==9.20.0.48; platform_system == "Linux"',
            'nvidia-cusparselt-cu12==0.7.1; platform_system == "Linux"',
            'nvidia-nccl-cu12==2.29.7; platform_system == "Linux"',
            'nvidia-nvshmem-cu12==3.4.5; platform_system == "Linux"',
        ),
        "INFERRED, not read: PyPI's torch 2.13.0 (the CUDA 13.0 build) with each cu13 line"
        " replaced as 2.11.0's cu128 build replaces it (cuda-toolkit 12.8.1, cuda-bindings"
        " >=12.9.4,<13, the same cuDNN/NCCL/NVSHMEM versions as -cu12, cusparselt-cu12 0.7.1);"
        " refresh with --build-matrix 2.13.0=<v2.13.0's generate_binary_build_matrix.py>",
    ),
    ("2.13.0", "12.9"): (
        (
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,"
            'nvrtc,nvtx]==12.9.1; platform_system == "Linux"',
            'cuda-bindings<13,>=12.9.4; platform_system == "Linux" and python_version < "3.15"',
            'nvidia-cudnn-cu12==9.20.0.48; platform_system == "Linux"',
            'nvidia-cusparselt-cu12==0.7.1; platform_system == "Linux"',
            'nvidia-nccl-cu12==2.29.7; platform_system == "Linux"',
            'nvidia-nvshmem-cu12==3.4.5; platform_system == "Linux"',
        ),
        "INFERRED, not read: as for 2.13.0 cu128, with cuda-toolkit 12.9.1 (CUDA 12.9's last"
        " cuda-toolkit on PyPI); refresh with --build-matrix",
    ),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- upstream ---------------------------------------------------------------------------------


def fetch(url: str, headers: dict[str, str] | None = None) -> bytes | None:
    """The body at `url`; None on 404. Retries transient failures."""
    for attempt in range(4):
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            if attempt == 3:
                raise
        except (urllib.error.URLError, TimeoutError):
            if attempt == 3:
                raise
        time.sleep(2**attempt)
    raise AssertionError("unreachable")


class RangeFile(io.RawIOBase):
    """A remote file read with HTTP range requests, enough for zipfile to find one member."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * RANGE_BLOCK
            end = min(self.size, start + RANGE_BLOCK) - 1
            body = fetch(self.url, {"Range": f"bytes={start}-{end}"})
            assert body is not None and len(body) == end - start + 1, self.url
            self.blocks[index] = body
        return self.blocks[index]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.size, self.pos + size)
        out = bytearray()
        while self.pos < end:
            block = self._block(self.pos // RANGE_BLOCK)
            start = self.pos % RANGE_BLOCK
            piece = block[start : start + end - self.pos]
            out += piece
            self.pos += len(piece)
        return bytes(out)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def wheel_metadata(url: str, size: int | None) -> bytes:
    """A wheel's METADATA: PyPI's PEP 658 file, else the member itself, by range requests."""
    body = fetch(url + ".metadata")
    if body is not None:
        return body
    if size is None:
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=60) as response:
            size = int(response.headers["Content-Length"])
    with zipfile.ZipFile(RangeFile(url, size)) as archive:
        member = next(
            n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)
        )
        return archive.read(member)


# -- pages ------------------------------------------------------------------------------------


@dataclass
class File:
    filename: str
    upstream: str | None  # where its metadata is read (None: built here)
    sha256: str | None
    requires_python: str | None = None
    yanked: str | bool = False
    size: int | None = None

    @property
    def version(self) -> Version | None:
        """None for a name that does not parse (old uploads such as `x-0.1.0-rc1.tar.gz`)."""
        try:
            if self.filename.endswith(".whl"):
                return parse_wheel_filename(self.filename)[1]
            return parse_sdist_filename(self.filename)[1]
        except (InvalidSdistFilename, InvalidWheelFilename):
            return None


def kept(filename: str) -> bool:
    """Linux x86_64, abi3 or pure wheels for CPython 3.10-3.13, and sdists."""
    if not filename.endswith(".whl"):
        return filename.endswith((".tar.gz", ".zip"))
    try:
        tag_text = filename[:-4].split("-", 2)[2]
        if tag_text.count("-") > 2:  # a build tag
            tag_text = tag_text.split("-", 1)[1]
        tags = parse_tag(tag_text)
    except (ValueError, IndexError):
        return False
    return any(
        _python_ok(t.interpreter, t.abi)
        and (t.platform == "any" or ("linux" in t.platform and t.platform.endswith("x86_64")))
        for t in tags
    )


def _python_ok(interpreter: str, abi: str) -> bool:
    if abi == "abi3":  # a stable-ABI wheel serves every CPython from its own on
        return interpreter.startswith("cp3") and int(interpreter[3:] or 0) <= 13
    if abi == "none":
        return interpreter in INTERPRETERS
    return abi in CPYTHONS and interpreter == abi


def page_html(files: list[File], metadata: dict[str, bytes] | None) -> str:
    """A PEP 503 page; every wheel announces its metadata (PEP 658/714), with its sha256 when
    `metadata` holds it."""
    links = []
    for f in files:
        href = urllib.parse.quote(f.filename) + (f"#sha256={f.sha256}" if f.sha256 else "")
        attrs = [f'href="{html.escape(href)}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        if f.filename.endswith(".whl"):
            if metadata is None:
                value = "true"
            elif f.filename in metadata:
                value = "sha256=" + hashlib.sha256(metadata[f.filename]).hexdigest()
            else:
                value = ""
            if value:
                attrs += [f'data-core-metadata="{value}"', f'data-dist-info-metadata="{value}"']
        if f.yanked:
            reason = f.yanked if isinstance(f.yanked, str) else ""
            attrs.append(f'data-yanked="{html.escape(reason)}"')
        links.append(f"<a {' '.join(attrs)}>{html.escape(f.filename)}</a><br/>")
    return _page_of(links)


@dataclass
class Sources:
    """Where each index's pages come from."""

    kb: Knowledge
    whl_repo: Path
    build_matrix: dict[str, Path] = field(default_factory=dict)
    pypi_pages: dict[str, list[File] | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    citations: dict[str, str] = field(default_factory=dict)  # "index/file" -> source

    def pypi(self, project: str) -> list[File] | None:
        with self.lock:
            if project in self.pypi_pages:
                return self.pypi_pages[project]
        body = fetch(f"{PYPI_SIMPLE}/{project}/", {"Accept": "application/vnd.pypi.simple.v1+json"})
        files = None
        if body is not None:
            files = [
                File(
                    e["filename"],
                    e["url"],
                    e["hashes"].get("sha256"),
                    e.get("requires-python"),
                    e.get("yanked", False),
                    e.get("size"),
                )
                for e in json.loads(body)["files"]
                if kept(e["filename"])
            ]
        with self.lock:
            self.pypi_pages[project] = files
        return files

    def page(self, index: str, project: str) -> list[File] | None:
        if index == "main":
            return self.pypi(project)
        lane = index.split("-", 1)[1]
        if index.startswith("pytorch-"):
            return self._torch_page(lane, project)
        if index.startswith("flashinfer-"):
            return self._jit_cache_page(lane, project)
        return self._kernel_page(lane, project)

    def _jit_cache_page(self, lane: str, project: str) -> list[File] | None:
        if project != "flashinfer-jit-cache":
            return None
        return [
            File(f"flashinfer_jit_cache-{v}+{lane}-cp39-abi3-manylinux_2_28_x86_64.whl", None, h)
            for (on, v), h in JIT_CACHE_SHA256.items()
            if on == lane
        ]

    def _pins(self, kind: str, lane: str, project: str) -> set[str]:
        return {
            p.version
            for release in self.kb.releases.values()
            for build in release.builds
            for p in build.packages
            if p.index == kind and p.index_lane == lane and p.name == project
        }

    def _torch_page(self, lane: str, project: str) -> list[File] | None:
        # Only the builds the knowledge base pins are reconstructed; their file names are
        # PyPI's of the same version with the local tag PyTorch gives them.
        pins = self._pins("torch", lane, project)
        if not pins:
            return None
        files = []
        for pin in sorted(pins):
            public = pin.split("+")[0]
            for f in self.pypi(project) or []:
                if f.filename.endswith(".whl") and f.version == Version(public):
                    name = f.filename.replace(f"-{public}-", f"-{pin}-", 1)
                    files.append(File(name, f.upstream, None, f.requires_python))
        return files

    def _kernel_page(self, lane: str, project: str) -> list[File] | None:
        proc = subprocess.run(
            ["git", "-C", str(self.whl_repo), "show", f"{WHL_COMMIT}:{lane}/{project}/index.html"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            return None
        files = []
        for url, digest in re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', proc.stdout):
            name = urllib.parse.unquote(url.rsplit("/", 1)[1])
            if kept(name):
                files.append(File(name, None, digest))
        return files

    def metadata(self, index: str, project: str, f: File) -> bytes:
        if index == "main":
            assert f.upstream is not None
            return wheel_metadata(f.upstream, f.size)
        if index.startswith("flashinfer-"):
            self.citations[f"{index}/{f.filename}"] = JIT_CACHE_SOURCE
            return jit_cache_metadata(str(f.version))
        version = str(f.version)
        public = version.split("+")[0]
        twin = next(
            (
                t
                for t in self.pypi(project) or []
                if t.filename.endswith(".whl")
                and t.version == Version(public)
                and "x86_64" in t.filename
                and t.filename.split("-", 2)[2] == f.filename.split("-", 2)[2]
            ),
            None,
        )
        if twin is None or twin.upstream is None:
            raise LookupError(f"{index}/{f.filename}: no PyPI twin of {project} {public}")
        text = wheel_metadata(twin.upstream, twin.size).decode()
        text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1)
        source = f"PyPI's {twin.filename} METADATA, Version set to {version}"
        if project == "torch":
            text, cuda_source = self._torch_cuda(text, public, index.split("-", 1)[1])
            source += "; " + cuda_source
        self.citations[f"{index}/{f.filename}"] = source
        return text.encode()

    def _torch_cuda(self, text: str, version: str, lane: str) -> tuple[str, str]:
        """torch's METADATA with the lane's CUDA requirements in place of the PyPI build's."""
        lane_cuda = self.kb.lanes[lane].cuda
        head, sep, body = text.partition("\n\n")
        lines = head.split("\n")
        cuda_at = [i for i, line in enumerate(lines) if _is_cuda_requirement(line)]
        built_for = _cuda_of(lines[i] for i in cuda_at)
        if built_for == lane_cuda:
            return text, f"PyPI's torch {version} is itself the CUDA {lane_cuda} build"
        if version in self.build_matrix:
            wanted = _matrix_requirements(self.build_matrix[version], lane_cuda)
            source = (
                f"PYTORCH_EXTRA_INSTALL_REQUIREMENTS['{lane_cuda}'] of {self.build_matrix[version]}"
            )
        elif (version, lane_cuda) in TORCH_CUDA:
            wanted, source = TORCH_CUDA[(version, lane_cuda)]
        else:
            raise LookupError(f"torch {version} CUDA {lane_cuda}: no CUDA requirements known")
        new = [f"Requires-Dist: {r}" for r in wanted]
        lines = (
            lines[: cuda_at[0]]
            + new
            + [x for i, x in enumerate(lines) if i > cuda_at[0] and i not in cuda_at]
        )
        return "\n".join(lines) + sep + body, f"CUDA {lane_cuda} requirements: {source}"


def _requirement(line: str) -> Requirement | None:
    if not line.startswith("Requires-Dist:"):
        return None
    return Requirement(line.split(":", 1)[1].strip())


def _is_cuda_requirement(line: str) -> bool:
    req = _requirement(line)
    return req is not None and (
        req.name in ("cuda-toolkit", "cuda-bindings") or req.name.startswith("nvidia-")
    )


def _cuda_of(lines: object) -> str:
    for line in lines:  # type: ignore[attr-defined]
        req = _requirement(line)
        if req is not None and req.name in ("cuda-toolkit", "nvidia-cuda-runtime-cu12"):
            version = next(iter(req.specifier)).version
            return ".".join(version.split(".")[:2])
    return "?"


def _matrix_requirements(path: Path, cuda: str) -> tuple[str, ...]:
    """PYTORCH_EXTRA_INSTALL_REQUIREMENTS[cuda] of a build matrix script, read, never run."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PYTORCH_EXTRA_INSTALL_REQUIREMENTS"
            for t in node.targets
        ):
            table = ast.literal_eval(node.value)
            return tuple(r.strip() for r in table[cuda].split("|"))
    raise LookupError(f"{path}: no PYTORCH_EXTRA_INSTALL_REQUIREMENTS")


# -- the recording proxy ----------------------------------------------------------------------


@dataclass
class Recording:
    pages: dict[tuple[str, str], list[File] | None] = field(default_factory=dict)
    metadata: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)  # what uv asked for that was not there
    lock: threading.Lock = field(default_factory=threading.Lock)


def make_handler(sources: Sources, recording: Recording) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = [urllib.parse.unquote(p) for p in self.path.split("?")[0].split("/") if p]
            try:
                if len(parts) == 2:
                    self._page(parts[0], str(canonicalize_name(parts[1])))
                elif len(parts) == 3 and parts[2].endswith(".metadata"):
                    self._metadata(parts[0], str(canonicalize_name(parts[1])), parts[2][:-9])
                else:
                    with recording.lock:
                        recording.misses.append(self.path)
                    self._send(404, b"not recorded", "text/plain")
            except Exception as error:
                log(f"proxy: {self.path}: {error!r}")
                self._send(502, repr(error).encode(), "text/plain")

        def _page(self, index: str, project: str) -> None:
            files = sources.page(index, project)
            with recording.lock:
                recording.pages[(index, project)] = files
            if files is None:
                self._send(404, b"no such project", "text/plain")
                return
            self._send(200, page_html(files, None).encode(), "text/html")

        def _metadata(self, index: str, project: str, filename: str) -> None:
            files = sources.page(index, project) or []
            f = next((x for x in files if x.filename == filename), None)
            if f is None:
                self._send(404, b"no such file", "text/plain")
                return
            data = sources.metadata(index, project, f)
            with recording.lock:
                recording.metadata.setdefault((index, project), {})[filename] = data
            self._send(200, data, "application/octet-stream")

    return Handler


# -- the snapshot -----------------------------------------------------------------------------


def write_snapshot(recording: Recording, out: Path, merge: bool = False) -> int:
    """Write what uv asked for; returns the number of metadata files. With `merge`, what is
    already under `out` stays: a page keeps its files and gains the new ones."""
    if out.exists() and not merge:
        for child in out.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
    count = 0
    for (index, project), files in sorted(recording.pages.items()):
        if files is None:
            continue
        metadata = recording.metadata.get((index, project), {})
        asked = {parse_wheel_filename(name)[1] for name in metadata}
        folder = out / index / project
        page = folder / "index.html"
        had = _page_links(page.read_text()) if merge and page.exists() else {}
        keep = [f for f in files if f.version in asked and f.filename not in had]
        if not keep and not metadata:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        links = [*had.values(), *_page_links(page_html(keep, metadata)).values()]
        page.write_text(_page_of(links))
        for name, data in metadata.items():
            (folder / f"{name}.metadata").write_bytes(data)
            count += 1
    return count


_LINK = re.compile(r"^<a [^>]*>([^<]+)</a><br/>$", re.MULTILINE)


def _page_links(text: str) -> dict[str, str]:
    """A page's link lines (as page_html writes them) by file name."""
    return {html.unescape(m.group(1)): m.group(0) for m in _LINK.finditer(text)}


def _page_of(links: list[str]) -> str:
    body = "\n".join(links)
    return f"<!DOCTYPE html>\n<html><body>\n{body}\n</body></html>\n"


def normalised(text: str, base: str) -> str:
    return text.replace(base, "BASE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--whl-repo", type=Path, required=True, help="a git clone of sgl-project/whl"
    )
    parser.add_argument("--out", type=Path, default=SNAPSHOT)
    parser.add_argument(
        "--build-matrix",
        action="append",
        default=[],
        metavar="TORCH_VERSION=PATH",
        help="PyTorch's .github/scripts/generate_binary_build_matrix.py at that release tag",
    )
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="VERSION",
        help="capture only these releases' locks and merge them into --out (e.g. the one "
        "`operations.kb intake` just added); every other lock is replayed before and after",
    )
    args = parser.parse_args(argv)
    kb = kb_module.load()
    unknown = sorted(set(args.release) - set(kb.releases))
    if unknown:
        parser.error(f"--release {', '.join(unknown)}: not in the knowledge base")
    merge = bool(args.release)
    if merge and not (args.out / "main").is_dir():
        parser.error(f"--release merges into a snapshot: {args.out} holds none")
    matrix = {v: Path(p) for v, _, p in (m.partition("=") for m in args.build_matrix)}
    sources = Sources(kb, args.whl_repo, matrix)
    recording = Recording()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(sources, recording))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    live = f"http://127.0.0.1:{server.server_address[1]}"
    every = []
    for case in build_cases(kb) + [c for c in NEGATIVE_CASES if _applies(c, kb)]:
        if find_python(case.python) is None:
            log(f"{case.id}: no Python {case.python} here; skipped")
        else:
            every.append(case)
    cases = [c for c in every if not merge or c.release in args.release]
    kept = [c for c in every if c not in cases]  # merged into: what they lock must not change
    results: dict[str, tuple[int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="index-snapshot-") as tmp:
        work = Path(tmp)
        if kept:
            with SnapshotIndex(args.out) as before:
                for case in kept:
                    folder = work / "before" / case.id
                    proc = lock(case, before.base, folder, work / "cache-before", kb)
                    results[case.id] = (proc.returncode, _outcome(proc, folder, before.base))
            log(f"replayed the {len(kept)} other locks against {args.out} as it was")
        for case in cases:
            started = time.monotonic()
            proc = lock(case, live, work / "live" / case.id, work / "cache-live", kb)
            took = time.monotonic() - started
            text = _outcome(proc, work / "live" / case.id, live)
            results[case.id] = (proc.returncode, text)
            log(f"{case.id}: rc={proc.returncode} in {took:.0f}s")
            if proc.returncode != 0:
                log("  " + proc.stderr.strip().replace("\n", "\n  ")[-3000:])
        server.shutdown()
        count = write_snapshot(recording, args.out, merge)
        log(f"wrote {count} metadata files under {args.out}")
        citations = args.out / "citations.json"
        known = json.loads(citations.read_text()) if merge and citations.exists() else {}
        citations.write_text(
            json.dumps(dict(sorted({**known, **sources.citations}.items())), indent=1) + "\n"
        )
        replay_ok = True
        with SnapshotIndex(args.out) as replay:
            for case in every:
                proc = lock(case, replay.base, work / "replay" / case.id, work / "cache-replay", kb)
                text = _outcome(proc, work / "replay" / case.id, replay.base)
                if not _same(proc.returncode, text, *results[case.id]):
                    replay_ok = False
                    log(f"REPLAY DIFFERS {case.id}: rc={proc.returncode}\n{text[-2000:]}")
    log(f"misses: {sorted(set(recording.misses))[:20]}")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    log(f"captured {stamp}; replay {'identical' if replay_ok else 'DIFFERS'}")
    return 0 if replay_ok else 1


def _applies(case: LockCase, kb: Knowledge) -> bool:
    if case.without_override is None:
        return True
    build = kb.releases[case.release].build(case.lane)
    return build is not None and any(
        canonicalize_name(Requirement(o.requirement).name) == case.without_override
        for o in build.overrides
    )


# A package uv's explanation names: `name==1.0`, `name>=1`, `name[extra]`.
_NAMED = re.compile(r"\b([a-z0-9][a-z0-9._-]*)(?:==|>=|<=|\[)")


def _same(rc: int, text: str, live_rc: int, live_text: str) -> bool:
    """Whether a replay gave what the live lock gave. A lock: the same lines, in any order (the
    real cu129 page lists sgl_kernel 0.3.21 four times with different hashes, in an order the
    replay need not keep). A failure: the same status, and every package uv names is one the
    live failure named (the snapshot keeps only the versions uv read, so uv's explanation of
    the same conflict is shorter)."""
    if rc != live_rc:
        return False
    if rc == 0:
        return Counter(text.splitlines()) == Counter(live_text.splitlines())
    named = set(_NAMED.findall(text))
    return bool(named) and named <= set(_NAMED.findall(live_text))


def _outcome(proc: subprocess.CompletedProcess[str], project: Path, base: str) -> str:
    """What a lock produced: the lock file, or uv's error (paths and ports normalised)."""
    if proc.returncode == 0:
        return normalised((project / "uv.lock").read_text(), base)
    message = normalised(proc.stderr, base)
    return re.sub(r"\d+(\.\d+)?m?s\b", "", message)


if __name__ == "__main__":
    raise SystemExit(main())
