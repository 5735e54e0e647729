"""The nvcc double answers as the real nvcc of its release, offline.

tests/doubles/nvcc, as tests/doubles/cuda_redist.py writes it into a CUDA 12 lane's cuda_nvcc
archive and the host's install script (operations/programs/cuda_toolkit.py) unpacks it, is run
here as the deploy runs it: its `--version` and the `-arch=` targets it takes must be what the
real tools of that release said, captured from PyPI's wheels into tests/fixtures/nvcc/
(scripts/capture_nvcc.py; SOURCE.md there names each wheel, its URL and sha256). PyPI's CUDA 12
nvcc wheels hold ptxas and no nvcc: for those releases the double answers with their ptxas's
lines and targets, and the tests below hold that rule to the release whose wheel holds both
(13.0.88). Then the captured facts are held to the knowledge base: each lane's compiler is its
CUDA release, and takes the arch the engine check compiles for on every chip the lane targets.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.version import Version

from operations import kb as kbmod
from operations.plan.engine_spec import EngineSpec, read_redist_manifest, toolkit
from operations.programs import cuda_toolkit
from operations.settings import Layer, load
from tests.doubles import cuda_redist
from tests.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvcc"
KB = kbmod.load()
COMPILERS = {name: lane.compiler for name, lane in KB.lanes.items() if lane.compiler is not None}
REDIST_LANES = sorted(n for n, c in COMPILERS.items() if c.origin == "nvidia-redist")
CAPTURED = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
WITH_NVCC = [v for v in CAPTURED if (FIXTURES / v / "nvcc-version.txt").is_file()]
DOUBLE_BUILT_ON = "Built on (TEST DOUBLE of the cuda_nvcc archive)"
UNSUPPORTED = "nvcc fatal   : Unsupported gpu architecture"


def read(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


def ptxas_sm(version: str) -> set[str]:
    """The sm_ targets `ptxas --help` allows for --gpu-name (its default not counted twice)."""
    allowed = read(version, "ptxas-gpu-name.txt").split("Allowed values for this option:")[1]
    return set(re.findall(r"'(sm_\d+[af]?)'", allowed.split("Default value:")[0]))


def ptxas_compute(version: str) -> set[str]:
    allowed = read(version, "ptxas-gpu-name.txt").split("Allowed values for this option:")[1]
    return set(re.findall(r"'(compute_\d+)'", allowed))


def nvcc_arch(version: str) -> dict[str, str]:
    """nvcc-arch.txt: -arch target -> what the real nvcc said ("ok" or its error)."""
    lines = read(version, "nvcc-arch.txt").splitlines()
    return dict(line.split(": ", 1) for line in lines)


def takes(version: str) -> set[str]:
    """The -arch targets the release's nvcc takes: its own answers where captured, else its
    ptxas's targets (the rule the tests of the 13.0.88 capture hold)."""
    if version in WITH_NVCC:
        return {arch for arch, said in nvcc_arch(version).items() if said == "ok"}
    return ptxas_sm(version)


def candidates() -> list[str]:
    """sm_XY, sm_XYa, sm_XYf for every architecture any captured ptxas names, and sm_35."""
    bases = {35} | {int(re.sub(r"\D", "", t)) for v in CAPTURED for t in ptxas_sm(v)}
    return [f"sm_{b}{s}" for b in sorted(bases) for s in ("", "a", "f")]


def release_line(version: str) -> str:
    text = read(version, "nvcc-version.txt" if version in WITH_NVCC else "ptxas-version.txt")
    return next(line for line in text.splitlines() if "release" in line)


# -- the double, installed as the deploy installs it, against the captured outputs -------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Each CUDA 12 lane's compiler from the archive doubles (its manifest as setting
    cuda_redist_manifest), unpacked by the host's install script: lane -> (CUDA_HOME, what the
    script said, from `bin/nvcc --version`)."""
    found = {}
    for lane in REDIST_LANES:
        out = tmp_path_factory.mktemp(lane)
        redist = cuda_redist.build(out / "redist", lane)
        settings = load("t", [Layer("t", {"model_source": "/mnt/m", "cuda_lane": lane})])
        manifest = read_redist_manifest(str(redist.manifest))
        tools = toolkit(COMPILERS[lane], settings, manifest, str(redist.manifest))
        home = out / "cuda" / tools.name
        said = cuda_toolkit.install(
            {
                "home": str(home),
                "source": str(cuda_redist.flat(redist, out / "cuda-redist")),
                "root": tools.root,
                "archives": [
                    {"path": a.path, "sha256": a.sha256, "size": a.size} for a in tools.archives
                ],
                "marker": {"version": tools.version},
            }
        )
        found[lane] = (home, said)
    return found


def nvcc(home: Path, *args: str, python: str | None = None) -> subprocess.CompletedProcess[str]:
    """The double run as the deploy runs it (its `#!/usr/bin/env python3`), or by `python`."""
    command = [str(home / "bin" / "nvcc"), *args]
    return subprocess.run(
        [python, *command] if python else command, capture_output=True, text=True, timeout=60
    )


def test_every_compiler_the_knowledge_base_pins_is_captured_and_no_other() -> None:
    assert sorted({c.version for c in COMPILERS.values()}) == CAPTURED
    assert REDIST_LANES, "no lane takes NVIDIA's archives: the double is never written"
    source = (FIXTURES / "SOURCE.md").read_text()
    for version in CAPTURED:
        assert re.search(rf"^\| {re.escape(version)} \| .*\| `[0-9a-f]{{64}}` \|", source, re.M)


@pytest.mark.integration
@pytest.mark.parametrize("lane", REDIST_LANES)
def test_the_doubles_version_is_the_releases_captured_lines(
    installed: dict[str, tuple[Path, str]], lane: str
) -> None:
    version = COMPILERS[lane].version
    run = nvcc(installed[lane][0], "--version")
    assert run.returncode == 0, run.stderr
    # nvcc's own first line, as every captured nvcc says it; then the release's ptxas's lines,
    # but "Built on", which says it is the double.
    first = {read(v, "nvcc-version.txt").splitlines()[0] for v in WITH_NVCC}
    assert len(first) == 1
    real = read(version, "ptxas-version.txt").splitlines()
    expected = [
        *first,
        *(DOUBLE_BUILT_ON if line.startswith("Built on ") else line for line in real[1:]),
    ]
    assert run.stdout == "\n".join(expected) + "\n"


@pytest.mark.integration  # the fixture runs the host's install script, which runs nvcc
@pytest.mark.parametrize("lane", REDIST_LANES)
def test_the_deploy_reads_the_lanes_release_from_the_double(
    installed: dict[str, tuple[Path, str]], lane: str
) -> None:
    home, said = installed[lane]
    version = COMPILERS[lane].version
    assert said == f"{home}: Cuda compilation tools, release {KB.lanes[lane].cuda}, V{version}"
    assert said.endswith(release_line(version))


@pytest.mark.integration
@pytest.mark.parametrize("lane", REDIST_LANES)
def test_the_double_takes_exactly_the_targets_its_release_takes(
    installed: dict[str, tuple[Path, str]], lane: str, tmp_path: Path
) -> None:
    home = installed[lane][0]
    out, source = str(tmp_path / "k.cubin"), str(tmp_path / "absent.cu")

    def answer(arch: str) -> tuple[str, str]:
        # The source is absent: a target the double takes fails after the target check. This
        # interpreter, not python3 from PATH (a version manager's shim starts ten times slower).
        said = nvcc(home, f"-arch={arch}", "-cubin", "-o", out, source, python=sys.executable)
        return arch, said.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        said = dict(pool.map(answer, candidates()))
    taken = {arch for arch, stderr in said.items() if UNSUPPORTED not in stderr}
    assert taken == takes(COMPILERS[lane].version)
    for arch in taken:
        assert "Could not open input file" in said[arch], said[arch]


# -- the rule the CUDA 12 answers stand on, held to the release whose wheel holds both ---------


def test_a_wheel_with_nvcc_was_captured() -> None:
    assert WITH_NVCC, "no captured nvcc: nothing shows that ptxas's answers stand for nvcc's"


@pytest.mark.parametrize("version", WITH_NVCC)
def test_nvcc_and_ptxas_of_one_release_differ_only_in_name_and_build_time(version: str) -> None:
    mine = read(version, "nvcc-version.txt").splitlines()
    theirs = read(version, "ptxas-version.txt").splitlines()
    assert len(mine) == len(theirs)
    assert mine[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
    assert theirs[0] == "ptxas: NVIDIA (R) Ptx optimizing assembler"
    for a, b in zip(mine[1:], theirs[1:], strict=True):
        assert a == b or (a.startswith("Built on ") and b.startswith("Built on ")), (a, b)


@pytest.mark.parametrize("version", WITH_NVCC)
def test_ptxas_targets_are_exactly_what_nvcc_takes_and_lists(version: str) -> None:
    answers = nvcc_arch(version)
    assert ptxas_sm(version) <= set(answers)
    assert {arch for arch, said in answers.items() if said == "ok"} == ptxas_sm(version)
    for arch, said in answers.items():
        assert said in ("ok", f"{UNSUPPORTED} '{arch}'"), (arch, said)
    listed = read(version, "nvcc-list-gpu-arch.txt").split()
    assert len(listed) == len(set(listed)) and set(listed) == ptxas_compute(version)
    code = read(version, "nvcc-list-gpu-code.txt").split()
    assert set(code) == {t for t in ptxas_sm(version) if re.fullmatch(r"sm_\d+", t)}


@pytest.mark.parametrize("version", sorted(set(CAPTURED) - set(WITH_NVCC)))
def test_nvccs_banner_pasted_in_public_agrees_with_the_releases_ptxas(version: str) -> None:
    pasted = script_module("capture_nvcc").PUBLIC_NVCC_VERSION[version]
    ptxas = read(version, "ptxas-version.txt").splitlines()
    assert pasted[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
    for a, b in zip(pasted[1:], ptxas[1:], strict=True):
        assert a == b or (a.startswith("Built on ") and b.startswith("Built on ")), (a, b)


# -- the captured facts against the knowledge base ---------------------------------------------


@pytest.mark.parametrize("lane", sorted(COMPILERS))
def test_each_lanes_compiler_is_its_cuda_release(lane: str) -> None:
    version = COMPILERS[lane].version
    assert release_line(version) == (
        f"Cuda compilation tools, release {KB.lanes[lane].cuda}, V{version}"
    )


@pytest.mark.parametrize("lane", sorted(COMPILERS))
def test_each_lanes_compiler_builds_for_sm_120_as_the_engine_check_asks(lane: str) -> None:
    # CT200's RTX PRO 6000s: compute capability 12.0, compiled as sm_120a (EngineSpec).
    assert {"sm_120", "sm_120a"} <= takes(COMPILERS[lane].version)
    for version in WITH_NVCC:
        assert "compute_120" in read(version, "nvcc-list-gpu-arch.txt").split()
        assert "sm_120" in read(version, "nvcc-list-gpu-code.txt").split()


def compile_arch(cap: str) -> str | None:
    """What the engine check compiles for on a chip (EngineSpec.compile_arch)."""
    spec = EngineSpec(
        release="r",
        lane="l",
        cuda="c",
        min_driver="0",
        python="3.11",
        pins=(),
        overrides=(),
        arch=KB.gpus[cap].arch,
        compute_cap=cap,
        gpu_count=1,
    )
    return spec.compile_arch


@pytest.mark.parametrize("cap", sorted(KB.gpus, key=lambda cap: Version(str(cap))))
def test_a_chip_compiles_on_exactly_the_lanes_its_min_cuda_allows(cap: str) -> None:
    gpu = KB.gpus[cap]
    for lane, compiler in sorted(COMPILERS.items()):
        taken = takes(compiler.version)
        if Version(KB.lanes[lane].cuda) >= Version(gpu.min_cuda):
            assert gpu.arch in taken and compile_arch(cap) in taken, (lane, cap)
        else:
            assert gpu.arch not in taken, (lane, cap)


def test_the_cu130_capture_is_the_wheel_the_deploy_installs() -> None:
    source = (FIXTURES / "SOURCE.md").read_text()
    for compiler in COMPILERS.values():
        if compiler.origin == "pypi":
            wheel = next(a for a in compiler.archives if a.name == "nvidia-cuda-nvcc")
            row = next(r for r in source.splitlines() if r.startswith(f"| {compiler.version} |"))
            assert wheel.file_name in row and f"`{wheel.sha256}`" in row
