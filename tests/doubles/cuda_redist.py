"""TEST DOUBLE of NVIDIA's CUDA redistributable archives: a CUDA 12 lane's compiler (cuda_nvcc,
cuda_cudart, cuda_cccl) as the engine step downloads, checks and unpacks it, with a manifest in
NVIDIA's redistrib JSON format.

The real ones (operations/kb/knowledge/sglang.yaml lanes.<lane>.compiler, sources
nvidia-redist-12.8.1 and nvidia-redist-12.9.1: redistrib_<release>.json as NixOS/nixpkgs vendors
it) are laid out as

    <component>/linux-x86_64/<component>-linux-x86_64-<version>-archive.tar.xz

under https://developer.download.nvidia.com/compute/cuda/redist, each a tar.xz whose one top
folder `<component>-linux-x86_64-<version>-archive/` holds bin/, include/, lib/, nvvm/, ...; the
manifest lists, per component, "version" and for "linux-x86_64" its "relative_path", "sha256",
"md5" and "size" (a string). The doubles keep the names, versions, layout and manifest format
and replace the contents: bin/nvcc is tests/doubles/nvcc (a script that takes the deploy's two
command lines; its `--version` and the -arch targets it takes are the release's real tools' own,
captured in tests/fixtures/nvcc/<version>/, see nvcc_answers), ptxas and cicc are stubs, the
headers are empty, libcudart is a stub. Their sha256 and size are the doubles' own, so a deploy
takes them through the manifest (setting cuda_redist_manifest), the same path a mirror that
repackages the archives takes.

    redist = build(tmp / "redist", "cu128")   # the tree to serve, and its manifest
    redist.manifest                            # tmp/redist/redistrib_12.8.1.json
    flat(redist, tmp / "cuda-redist")          # the offline directory beside a wheelhouse
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.doubles.wheels import knowledge

NVCC = Path(__file__).resolve().parent / "nvcc"
# What the real tools of each pinned release said (scripts/capture_nvcc.py; SOURCE.md there).
NVCC_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvcc"
# nvcc's own first line of `nvcc --version` (tests/fixtures/nvcc/13.0.88/nvcc-version.txt; the
# same in the CUDA 12 outputs pasted in public READMEs, tests/fixtures/nvcc/SOURCE.md).
NVCC_FIRST_LINE = "nvcc: NVIDIA (R) Cuda compiler driver"
DOUBLE_BUILT_ON = "Built on (TEST DOUBLE of the cuda_nvcc archive)"
MTIME = 1577836800  # 2020-01-01: a rebuilt archive is byte-identical
STUB = b"#!/bin/sh\necho 'TEST DOUBLE: not NVIDIA's {tool}' >&2\nexit 1\n"


@dataclass(frozen=True)
class Redist:
    root: Path  # serve this directory as cuda_redist_url
    manifest: Path  # redistrib_<release>.json inside it
    archives: tuple[Path, ...]


def ptxas_targets(gpu_name_entry: str) -> list[str]:
    """The sm_ targets of ptxas --help's --gpu-name entry (ptxas-gpu-name.txt), each once."""
    allowed = gpu_name_entry.split("Allowed values for this option:", 1)[1]
    allowed = allowed.split("Default value:", 1)[0]
    return list(dict.fromkeys(re.findall(r"'(sm_\d+[af]?)'", allowed)))


def nvcc_arch_targets(answers: str) -> list[str]:
    """The -arch values the real nvcc took (nvcc-arch.txt: `<target>: ok` or its error)."""
    return [line.split(":", 1)[0] for line in answers.splitlines() if line.endswith(": ok")]


def nvcc_answers(version: str) -> tuple[str, list[str]]:
    """What the real nvcc `version` says to `--version` ("Built on" marked as the double's) and
    the -arch targets it takes, from its captured outputs: its own where PyPI's wheel holds
    nvcc (13.x), else its release's ptxas's (PyPI's CUDA 12 wheels hold ptxas and no nvcc; the
    nvcc double says why that stands)."""
    folder = NVCC_FIXTURES / version
    if not (folder / "ptxas-version.txt").is_file():
        raise FileNotFoundError(
            f"{folder}: no captured outputs of nvcc {version} (run scripts/capture_nvcc.py)"
        )
    if (folder / "nvcc-version.txt").is_file():
        lines = (folder / "nvcc-version.txt").read_text().splitlines()
        targets = nvcc_arch_targets((folder / "nvcc-arch.txt").read_text())
    else:
        lines = (folder / "ptxas-version.txt").read_text().splitlines()
        lines[0] = NVCC_FIRST_LINE
        targets = ptxas_targets((folder / "ptxas-gpu-name.txt").read_text())
    lines = [DOUBLE_BUILT_ON if line.startswith("Built on ") else line for line in lines]
    return "\n".join(lines) + "\n", targets


def nvcc_script(version: str) -> str:
    """tests/doubles/nvcc with `version`'s answers filled in."""
    banner, targets = nvcc_answers(version)
    text = NVCC.read_text()
    for placeholder, value in (
        ('"@BANNER@"', json.dumps(banner)),
        ('"@TARGETS@"', json.dumps(" ".join(targets))),
        ("@VERSION@", version),
    ):
        if placeholder not in text:
            raise ValueError(f"{NVCC}: no {placeholder} to fill in")
        text = text.replace(placeholder, value)
    return text


def _contents(component: str, version: str) -> dict[str, bytes | str]:
    """Archive member (under the top folder) -> bytes, or a str: a symlink's target."""
    license_text = f"TEST DOUBLE of NVIDIA's {component} {version}: not NVIDIA's software\n"
    files: dict[str, bytes | str] = {"LICENSE": license_text.encode()}
    if component == "cuda_nvcc":
        files["bin/nvcc"] = nvcc_script(version).encode()
        files["bin/ptxas"] = STUB.replace(b"{tool}", b"ptxas")
        files["nvvm/bin/cicc"] = STUB.replace(b"{tool}", b"cicc")
        files["include/crt/host_config.h"] = b"/* TEST DOUBLE */\n"
    elif component == "cuda_cudart":
        files["include/cuda_runtime.h"] = b"/* TEST DOUBLE of cuda_runtime.h */\n"
        files[f"lib/libcudart.so.{version}"] = b"TEST DOUBLE: not a shared library\n"
        files["lib/libcudart.so.12"] = f"libcudart.so.{version}"
        files["lib/libcudart.so"] = "libcudart.so.12"
    elif component == "cuda_cccl":
        files["include/cub/cub.cuh"] = b"/* TEST DOUBLE */\n"
        files["include/thrust/version.h"] = b"/* TEST DOUBLE */\n"
    return files


def archive_bytes(component: str, version: str) -> bytes:
    """One archive, reproducible: fixed times and owners, members in order."""
    top = f"{component}-linux-x86_64-{version}-archive"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:xz") as tar:
        folders = {top}
        for member in _contents(component, version):
            parts = member.split("/")[:-1]
            folders |= {"/".join([top, *parts[: i + 1]]) for i in range(len(parts))}
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
            tar.addfile(info)
        for member, data in sorted(_contents(component, version).items()):
            info = tarfile.TarInfo(f"{top}/{member}")
            info.mtime = MTIME
            if isinstance(data, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, data, 0o777
                tar.addfile(info)
                continue
            executable = member.startswith(("bin/", "nvvm/bin/"))
            info.size, info.mode = len(data), 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build(outdir: Path, lane: str) -> Redist:
    """The lane's archives at their relative paths under `outdir`, and the manifest listing
    them (only the linux-x86_64 entry of each component the knowledge base names)."""
    compiler = knowledge()["lanes"][lane]["compiler"]
    if compiler["from"] != "nvidia-redist":
        raise ValueError(f"{lane}'s compiler is not NVIDIA's redist ({compiler['from']})")
    release = compiler["release"]
    manifest: dict[str, object] = {
        "release_date": "2020-01-01",
        "release_label": release,
        "release_product": "cuda",
    }
    written = []
    for component, entry in compiler["archives"].items():
        data = archive_bytes(component, entry["version"])
        path = outdir / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
        manifest[component] = {
            "name": f"TEST DOUBLE of {component}",
            "license": "CUDA Toolkit",
            "license_path": f"{component}/LICENSE.txt",
            "version": entry["version"],
            "linux-x86_64": {
                "relative_path": entry["path"],
                "sha256": hashlib.sha256(data).hexdigest(),
                "md5": hashlib.md5(data).hexdigest(),  # NVIDIA lists it too
                "size": str(len(data)),
            },
        }
    path = outdir / f"redistrib_{release}.json"
    path.write_text(json.dumps(manifest, indent=4) + "\n")
    return Redist(outdir, path, tuple(written))


def flat(redist: Redist, dest: Path) -> Path:
    """The offline `cuda-redist/` directory: the archives by file name, as `wget` of the
    manifest's URLs leaves them (docs/how-it-works/engine.md)."""
    dest.mkdir(parents=True, exist_ok=True)
    for archive in redist.archives:
        shutil.copyfile(archive, dest / archive.name)
    return dest
