#!/usr/bin/env python3
"""Refresh tests/fixtures/nvcc/: what the real CUDA compiler of every lane says.

For every compiler the knowledge base pins (operations/kb/knowledge/sglang.yaml
lanes.<lane>.compiler: the version of its cuda_nvcc archive or nvidia-cuda-nvcc wheel), takes
PyPI's wheel of that nvcc version (nvidia-cuda-nvcc-cu12 for 12.x, nvidia-cuda-nvcc from 13.0),
checks it against the sha256 PyPI lists for it, unpacks it and runs what it holds:

- `ptxas --version` -> `<version>/ptxas-version.txt`;
- `ptxas --help`, its `--gpu-name` entry verbatim (the targets this release compiles for)
  -> `<version>/ptxas-gpu-name.txt`;
- where the wheel holds nvcc (PyPI's CUDA 12 nvcc wheels hold only ptxas, libnvvm and
  libdevice; 13.x the whole driver): `nvcc --version`, `nvcc --list-gpu-arch` and
  `nvcc --list-gpu-code` -> `<version>/nvcc-version.txt`, `nvcc-list-gpu-arch.txt`,
  `nvcc-list-gpu-code.txt`, and `<version>/nvcc-arch.txt`: for each `-arch=sm_XY`, `sm_XYa`,
  `sm_XYf` (XY: every architecture any captured ptxas names, and 35) what
  `nvcc -arch=... -cubin -o k.cubin k.cu --dryrun` says: `ok`, or its first line on stderr.

and writes `SOURCE.md` naming each wheel with its URL and sha256. The nvcc test double
(tests/doubles/nvcc, filled in by tests/doubles/cuda_redist.py) answers from these files, and
tests/unit/test_nvcc_double.py checks it against them offline. Run by hand, with PyPI reachable:

    .venv/bin/python scripts/capture_nvcc.py
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operations import kb as kb_module  # noqa: E402
from scripts.capture_index_snapshot import fetch  # noqa: E402
from tests.doubles.cuda_redist import NVCC_FIXTURES, ptxas_targets  # noqa: E402
from tests.e2e.index import pypi_wheel  # noqa: E402

PYPI_SIMPLE = "https://pypi.org/simple"
SUFFIXES = ("", "a", "f")
OLD_ARCH = 35  # one no captured release compiles for: how each says no
KERNEL = 'extern "C" __global__ void k(int *out) { *out = 1; }\n'

# nvcc's own `--version` of the CUDA 12 releases is not on PyPI; as pasted in READMEs of public
# repositories (found by code search), it says what ptxas of the same release says, but for its
# first line and the minutes of "Built on" (as the 13.0.88 wheel's nvcc and ptxas do here).
PUBLIC_NVCC_VERSION = {
    "12.8.93": (
        "nvcc: NVIDIA (R) Cuda compiler driver",
        "Copyright (c) 2005-2025 NVIDIA Corporation",
        "Built on Fri_Feb_21_20:23:50_PST_2025",
        "Cuda compilation tools, release 12.8, V12.8.93",
        "Build cuda_12.8.r12.8/compiler.35583870_0",
    ),
    "12.9.86": (
        "nvcc: NVIDIA (R) Cuda compiler driver",
        "Copyright (c) 2005-2025 NVIDIA Corporation",
        "Built on Tue_May_27_02:21:03_PDT_2025",
        "Cuda compilation tools, release 12.9, V12.9.86",
        "Build cuda_12.9.r12.9/compiler.36037853_0",
    ),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Wheel:
    project: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int
    path: Path  # the downloaded copy (the testbed's wheel cache)


def project_for(version: str) -> str:
    """PyPI's nvcc wheel of a CUDA version: `-cu12` for 12.x, unsuffixed from 13.0."""
    return "nvidia-cuda-nvcc-cu12" if version.startswith("12.") else "nvidia-cuda-nvcc"


def pinned_versions() -> dict[str, list[str]]:
    """nvcc version -> the lanes whose compiler it is."""
    found: dict[str, list[str]] = {}
    for name, lane in kb_module.load().lanes.items():
        if lane.compiler is not None:
            found.setdefault(lane.compiler.version, []).append(name)
    return found


def wheel(version: str) -> Wheel:
    """PyPI's manylinux x86_64 wheel of nvcc `version`, downloaded once into the testbed's cache
    (tests/e2e/index.py pypi_wheel, as tests/unit/test_engine_compiler.py takes the cu130 lane's)
    and checked against the sha256 PyPI's JSON simple API lists."""
    project = project_for(version)
    body = fetch(f"{PYPI_SIMPLE}/{project}/", {"Accept": "application/vnd.pypi.simple.v1+json"})
    if body is None:
        raise SystemExit(f"capture_nvcc: PyPI has no project {project}")
    page = json.loads(body)
    listed = [
        f
        for f in page["files"]
        if f["filename"].startswith(f"{project.replace('-', '_')}-{version}-")
        and f["filename"].endswith(".whl")
        and "x86_64" in f["filename"]
    ]
    if len(listed) != 1:
        raise LookupError(f"{project} {version}: {len(listed)} x86_64 wheels on PyPI")
    entry = listed[0]
    path = pypi_wheel(project, version)
    if path.name != entry["filename"]:
        raise LookupError(f"{project} {version}: downloaded {path.name}, PyPI lists {entry}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        raise LookupError(f"{path}: sha256 {digest}, PyPI lists {entry['hashes']['sha256']}")
    return Wheel(
        project, version, path.name, entry["url"], digest, path.stat().st_size, path.resolve()
    )


def unpack(w: Wheel, dest: Path) -> dict[str, Path]:
    """The wheel's bin/ tools by name (nvidia/cuda_nvcc/bin/ptxas, nvidia/cu13/bin/nvcc)."""
    tools = {}
    with zipfile.ZipFile(w.path) as archive:
        for member in archive.namelist():
            parts = member.split("/")
            if len(parts) >= 2 and parts[-2] == "bin" and parts[-1] in ("nvcc", "ptxas"):
                target = Path(archive.extract(member, dest))
                target.chmod(0o755)
                tools[parts[-1]] = target
    return tools


def say(command: list[str]) -> str:
    run = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {run.returncode}: {run.stderr}")
    return run.stdout


def gpu_name_entry(help_text: str) -> str:
    """ptxas --help's entry for --gpu-name, verbatim: from its line to the blank line after."""
    found = re.search(r"^--gpu-name .*?\n\n", help_text, re.M | re.S)
    if found is None:
        raise LookupError("ptxas --help has no --gpu-name entry")
    return found.group(0)[:-1]


def arch_answers(nvcc: Path, bases: list[int], work: Path) -> str:
    """What nvcc says to each -arch=sm_XY[a|f] for a cubin (--dryrun: the targets are checked,
    nothing runs)."""
    source = work / "k.cu"
    source.write_text(KERNEL)
    lines = []
    for base in bases:
        for suffix in SUFFIXES:
            arch = f"sm_{base}{suffix}"
            command = [str(nvcc), f"-arch={arch}", "-cubin", "-o", str(work / "k.cubin")]
            run = subprocess.run(
                [*command, str(source), "--dryrun"],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            said = "ok" if run.returncode == 0 else run.stderr.strip().splitlines()[0]
            lines.append(f"{arch}: {said}")
    return "\n".join(lines) + "\n"


def source_md(wheels: list[Wheel], lanes: dict[str, list[str]], with_nvcc: set[str]) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    out = [
        "# The real nvcc of every lane, as PyPI ships it",
        "",
        f"Captured {stamp} (UTC) by `scripts/capture_nvcc.py` (run it again to refresh): for each",
        "compiler version the knowledge base pins (operations/kb/knowledge/sglang.yaml",
        "`lanes.<lane>.compiler`), PyPI's wheel of that nvcc version, its sha256 checked against",
        "PyPI's, unpacked, and its own tools run on Linux x86_64. The files are their stdout as",
        "printed (`ptxas-gpu-name.txt`: the `--gpu-name` entry of `ptxas --help`; `nvcc-arch.txt`:",
        "`nvcc -arch=<target> -cubin -o k.cubin k.cu --dryrun`, `ok` or its first line on stderr).",
        "",
        "| nvcc | lanes | wheel | sha256 | size | what ran |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for w in wheels:
        ran = "ptxas, nvcc" if w.version in with_nvcc else "ptxas (the wheel holds no nvcc)"
        out.append(
            f"| {w.version} | {', '.join(lanes[w.version])} | [{w.filename}]({w.url}) "
            f"| `{w.sha256}` | {w.size} | {ran} |"
        )
    missing = [w.version for w in wheels if w.version not in with_nvcc]
    if missing:
        out += [
            "",
            f"PyPI's CUDA 12 nvcc wheels ({', '.join(missing)}) hold `bin/ptxas`,",
            "`nvvm/lib64/libnvvm.so` and `nvvm/libdevice/libdevice.10.bc`, no `bin/nvcc`: their",
            "nvcc's own answers are not on PyPI (the lanes take NVIDIA's cuda_nvcc archives,",
            "which are not reachable here). What stands for them, and what shows it may:",
            "",
            "- `ptxas --version` of the same release: where a wheel holds both (13.0.88), nvcc's",
            "  `--version` says the same but for its first line and the minutes of `Built on`;",
            "- the `--gpu-name` targets of that ptxas: where a wheel holds both, its `sm_` targets",
            "  are exactly the `-arch` values nvcc takes (`nvcc-arch.txt`) and its unsuffixed",
            "  `compute_` ones exactly `nvcc --list-gpu-arch` (in another order).",
            "",
            "nvcc's own `--version` of these releases as pasted in READMEs of public repositories",
            "(found by code search), which agrees:",
        ]
        for version in missing:
            pasted = PUBLIC_NVCC_VERSION.get(version)
            if pasted:
                out += ["", f"    # nvcc {version}", *(f"    {line}" for line in pasted)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=NVCC_FIXTURES)
    args = parser.parse_args(argv)
    lanes = pinned_versions()
    wheels = [wheel(v) for v in sorted(lanes)]
    if args.out.is_dir():  # a version no lane pins any more
        for stale in sorted(p for p in args.out.iterdir() if p.is_dir() and p.name not in lanes):
            shutil.rmtree(stale)
    with_nvcc: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="capture-nvcc-") as tmp:
        work = Path(tmp)
        tools = {w.version: unpack(w, work / w.version) for w in wheels}
        entries = {}
        for w in wheels:
            ptxas = str(tools[w.version]["ptxas"])
            entries[w.version] = gpu_name_entry(say([ptxas, "--help"]))
            folder = args.out / w.version
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            (folder / "ptxas-version.txt").write_text(say([ptxas, "--version"]))
            (folder / "ptxas-gpu-name.txt").write_text(entries[w.version])
            log(f"{w.version}: {w.filename}: {len(ptxas_targets(entries[w.version]))} sm_ targets")
        named = {t for entry in entries.values() for t in ptxas_targets(entry)}
        bases = sorted({int(re.sub(r"\D", "", t)) for t in named} | {OLD_ARCH})
        for w in wheels:
            nvcc = tools[w.version].get("nvcc")
            if nvcc is None:
                log(f"{w.version}: {w.filename} holds no nvcc")
                continue
            with_nvcc.add(w.version)
            folder = args.out / w.version
            (folder / "nvcc-version.txt").write_text(say([str(nvcc), "--version"]))
            (folder / "nvcc-list-gpu-arch.txt").write_text(say([str(nvcc), "--list-gpu-arch"]))
            (folder / "nvcc-list-gpu-code.txt").write_text(say([str(nvcc), "--list-gpu-code"]))
            (folder / "nvcc-arch.txt").write_text(arch_answers(nvcc, bases, work))
            log(f"{w.version}: nvcc answered")
    (args.out / "SOURCE.md").write_text(source_md(wheels, lanes, with_nvcc))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
