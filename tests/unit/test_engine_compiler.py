"""The engine's compiler with a REAL nvcc: the cu130 lane's five PyPI wheels (nvcc 13.0.88 and
nvvm, crt, runtime headers and cccl of the same toolkit), as the knowledge base lists them,
unpacked by the host's install script (operations/files/cuda_toolkit.py) and used by the engine
check's compile step (operations/files/engine_check.py) to build a kernel for sm_120a on this
machine, which has no GPU: compiling needs none.

The wheels (~105 MB) are downloaded once into the testbed cache outside the repository
(tests/e2e/index.py pypi_wheel) and checked against the knowledge base's sha256 before use.
The CUDA 12 lanes' archives are NVIDIA's, not on PyPI: tests/e2e/test_engine.py proves that
path with a double of them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from operations import kb as kbmod
from operations.engine import parse_probe
from operations.engine_spec import Toolkit, toolkit
from operations.files import cuda_toolkit, engine_check
from operations.settings import Layer, load
from tests.e2e.index import pypi_wheel

CHECK = Path(engine_check.__file__)
ARCH = "sm_120a"  # CT200's: compute capability 12.0 with the arch-specific suffix


def cu130_toolkit() -> Toolkit:
    settings = load("t", [Layer("t", {"model_source": "/mnt/m", "cuda_lane": "cu130"})])
    compiler = kbmod.load().lanes["cu130"].compiler
    assert compiler is not None
    return toolkit(compiler, settings)


@pytest.fixture(scope="module")
def redist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline cuda-redist/ directory: the real wheels, by file name."""
    if shutil.which("g++") is None:
        pytest.skip("nvcc needs a host compiler (g++) on this machine")
    out = tmp_path_factory.mktemp("cuda-redist")
    for archive in cu130_toolkit().archives:
        wheel = pypi_wheel(archive.name, archive.version)
        assert wheel.name == archive.file_name
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == archive.sha256
        shutil.copyfile(wheel, out / wheel.name)
    return out


def install_args(tools: Toolkit, home: Path, source: Path) -> dict[str, object]:
    return {
        "home": str(home),
        "source": str(source),
        "root": tools.root,
        "archives": [{"path": a.path, "sha256": a.sha256, "size": a.size} for a in tools.archives],
        "marker": {"version": tools.version},
    }


@pytest.fixture(scope="module")
def cuda_home(redist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tools = cu130_toolkit()
    home = tmp_path_factory.mktemp("engine-root") / "cuda" / tools.name
    said = cuda_toolkit.install(install_args(tools, home, redist))
    assert "release 13.0, V13.0.88" in said, said
    return home


def test_the_install_script_makes_a_complete_cuda_home_from_the_real_wheels(
    cuda_home: Path,
) -> None:
    assert (cuda_home / cuda_toolkit.MARKER).is_file()
    for path in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h"):
        assert (cuda_home / path).is_file(), path
    assert (cuda_home / "include/crt/host_config.h").is_file()
    assert (cuda_home / "lib64").resolve() == (cuda_home / "lib").resolve()
    assert (cuda_home / "lib/libcudart.so").resolve().name == "libcudart.so.13"
    assert not list(cuda_home.parent.glob("*.partial-*"))


def test_the_engine_checks_compile_step_builds_for_sm120a_with_the_real_nvcc(
    cuda_home: Path, tmp_path: Path
) -> None:
    said, cubin = engine_check.compile_kernel(str(cuda_home), ARCH, str(tmp_path))
    assert said == "ok" and cubin is not None
    assert cubin[:4] == b"\x7fELF"
    # The cubin names its target: nvcc built machine code for sm_120a, not PTX.
    assert b"sm_120a" in cubin or b"sm_120" in cubin


def test_the_check_script_reports_the_compile_without_a_gpu(cuda_home: Path) -> None:
    # This venv has no torch: the check reports the failed import and still compiles.
    argument = {"packages": {}, "gpu_count": 0, "cuda_home": str(cuda_home), "arch": ARCH}
    run = subprocess.run(
        [sys.executable, str(CHECK), json.dumps(argument)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    probe = parse_probe(run.stdout)
    assert probe.compile == "ok", run.stdout + run.stderr
    assert probe.kernel_runs == ()


def test_a_kernel_for_an_arch_nvcc_lacks_fails_naming_nvccs_error(
    cuda_home: Path, tmp_path: Path
) -> None:
    said, cubin = engine_check.compile_kernel(str(cuda_home), "sm_35", str(tmp_path))
    assert cubin is None
    assert said.startswith(f"{cuda_home}/bin/nvcc -arch=sm_35 exited 1")
    assert "sm_35" in said


def test_an_archive_that_is_not_the_manifests_is_never_unpacked(
    redist: Path, tmp_path: Path
) -> None:
    tools = cu130_toolkit()
    args = install_args(tools, tmp_path / "cuda" / tools.name, redist)
    archives = args["archives"]
    assert isinstance(archives, list)
    archives[0] = {**archives[0], "sha256": "0" * 64}
    with pytest.raises(cuda_toolkit.Refused, match="expected sha256 0000"):
        cuda_toolkit.install(args)
    assert list((tmp_path / "cuda").iterdir()) == []
