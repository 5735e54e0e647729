"""The engine's compiler with a REAL nvcc: the cu130 lane's five PyPI wheels (nvcc 13.0.88 and
nvvm, crt, runtime headers and cccl of the same toolkit), as the knowledge base lists them,
unpacked by the host's install script (operations/programs/cuda_toolkit.py) and used by the engine
check's compile step (operations/programs/engine_check.py) to build a kernel for sm_120a on this
machine, which has no GPU: compiling needs none.

The wheels (~105 MB) are downloaded once into the testbed cache outside the repository
(tests/e2e/index.py pypi_wheel) and checked against the knowledge base's sha256 before use.
The CUDA 12 lanes' archives are NVIDIA's, not on PyPI: here and in the e2e tests a double of
them (tests/doubles/cuda_redist.py) takes their path. Whichever nvcc wrote it, the cubin is then
run the way the engine check runs it on each GPU, through cuda-python's driver API, here the
cuda-python double's (tests/doubles/packages/cuda), on CT200's GPUs as its nvidia-smi double
shows them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from operations import kb as kbmod
from operations.plan.engine_probe import parse_probe
from operations.plan.engine_spec import Toolkit, read_redist_manifest, toolkit
from operations.programs import cuda_toolkit, engine_check
from operations.settings import Layer, load
from tests.doubles import cuda_redist, wheels
from tests.e2e.index import pypi_wheel
from tests.needs import missing

pytestmark = pytest.mark.integration  # installs the real compiler wheels, runs nvcc and the check

CHECK = Path(engine_check.__file__)
TESTS = Path(__file__).resolve().parents[1]
DOUBLES, FIXTURES = TESTS / "doubles", TESTS / "fixtures"
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
        missing("nvcc needs a host compiler (g++) on this machine")
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


# -- the cubin on a GPU: the cuda-python double's driver API loads what the real nvcc wrote ----


@pytest.fixture(scope="module")
def driver_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cuda-python double (tests/doubles/packages/cuda) unpacked: a PYTHONPATH."""
    out = tmp_path_factory.mktemp("cuda-python")
    with zipfile.ZipFile(wheels.cuda_python_wheel(out, "13.0.3")) as zf:
        zf.extractall(out / "site")
    return out / "site"


def run_on_gpu(site: Path, cubin: bytes, tmp_path: Path, gpus: int = 1) -> str:
    """engine_check.run_kernel in a Python with the double and a GPU host's driver (the
    nvidia-smi double replaying CT200, `gpus` device nodes)."""
    (tmp_path / "twice.cubin").write_bytes(cubin)
    nodes = tmp_path / "dev"
    nodes.mkdir(exist_ok=True)
    for index in range(gpus):
        (nodes / f"nvidia{index}").touch()
    code = (
        "import sys\nfrom cuda.bindings import driver\n"
        f"driver.DEVICE_GLOB = {str(nodes / 'nvidia[0-9]*')!r}\n"
        f"sys.path.insert(0, {str(CHECK.parent)!r})\nimport engine_check\n"
        f"cubin = open({str(tmp_path / 'twice.cubin')!r}, 'rb').read()\n"
        "try:\n    print(engine_check.run_kernel(cubin, 0))\n"
        "except Exception as exc:\n    print(engine_check._error(exc))\n"
    )
    env = {**smi_driver(tmp_path), "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def smi_driver(tmp_path: Path) -> dict[str, str]:
    """PATH with the nvidia-smi double replaying CT200 (driver 570, 8 x compute 12.0)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shutil.copyfile(DOUBLES / "nvidia-smi", bindir / "nvidia-smi")
    (bindir / "nvidia-smi").chmod(0o755)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "NVIDIA_SMI_DOUBLE_DIR": str(FIXTURES / "nvidia-smi" / "rtx-pro-6000-x8"),
    }


def test_the_real_sm120a_cubin_runs_on_a_12_0_gpu_of_the_driver_double(
    cuda_home: Path, driver_site: Path, tmp_path: Path
) -> None:
    said, cubin = engine_check.compile_kernel(str(cuda_home), ARCH, str(tmp_path))
    assert said == "ok" and cubin is not None

    assert run_on_gpu(driver_site, cubin, tmp_path) == "ok"


def test_a_real_cubin_for_another_gpu_is_refused_as_the_driver_refuses_it(
    cuda_home: Path, driver_site: Path, tmp_path: Path
) -> None:
    said, cubin = engine_check.compile_kernel(str(cuda_home), "sm_90a", str(tmp_path))
    assert said == "ok" and cubin is not None

    assert run_on_gpu(driver_site, cubin, tmp_path) == (
        "RuntimeError: cuModuleLoadData: CUDA error 209 CUDA_ERROR_NO_BINARY_FOR_GPU (no kernel "
        "image is available for execution on the device)"
    )


# -- the CUDA 12 lanes' archives: NVIDIA's layout and manifest, the double nvcc ----------------


@pytest.fixture(scope="module")
def cu128_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cu128 compiler as the deploy installs it from the double of NVIDIA's archives: the
    toolkit from the knowledge base with the double's manifest (setting
    cuda_redist_manifest), unpacked by the host's install script from a cuda-redist/ dir."""
    if shutil.which("g++") is None:
        missing("nvcc needs a host compiler (g++) on this machine")
    out = tmp_path_factory.mktemp("cu128")
    redist = cuda_redist.build(out / "redist", "cu128")
    settings = load("t", [Layer("t", {"model_source": "/mnt/m", "cuda_lane": "cu128"})])
    compiler = kbmod.load().lanes["cu128"].compiler
    assert compiler is not None
    manifest = read_redist_manifest(str(redist.manifest))
    tools = toolkit(compiler, settings, manifest, str(redist.manifest))
    assert {a.sha256 for a in tools.archives}.isdisjoint(a.sha256 for a in compiler.archives)
    home = out / "cuda" / tools.name
    flat = cuda_redist.flat(redist, out / "cuda-redist")
    assert "release 12.8, V12.8.93" in cuda_toolkit.install(install_args(tools, home, flat))
    return home


def test_the_archive_doubles_unpack_to_a_cuda_home_like_nvidias(cu128_home: Path) -> None:
    for path in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h"):
        assert (cu128_home / path).is_file(), path
    assert (cu128_home / "include/cub/cub.cuh").is_file()
    assert (cu128_home / "lib/libcudart.so").resolve().name == "libcudart.so.12.8.90"
    assert (cu128_home / "lib64").resolve() == (cu128_home / "lib").resolve()


def test_the_double_nvccs_cubin_runs_on_the_driver_double(
    cu128_home: Path, driver_site: Path, tmp_path: Path
) -> None:
    said, cubin = engine_check.compile_kernel(str(cu128_home), ARCH, str(tmp_path))
    assert said == "ok" and cubin is not None

    assert run_on_gpu(driver_site, cubin, tmp_path) == "ok"


def test_the_double_nvcc_fails_as_nvcc_does_without_a_host_compiler_or_an_arch(
    cu128_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said, cubin = engine_check.compile_kernel(str(cu128_home), "sm_35", str(tmp_path))
    assert cubin is None and "Unsupported gpu architecture 'compute_35'" in said

    bindir = tmp_path / "bin"  # python3 for the double, no g++
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bindir))
    said, cubin = engine_check.compile_kernel(str(cu128_home), ARCH, str(tmp_path))
    assert cubin is None
    assert said.endswith("nvcc fatal   : Failed to preprocess host compiler properties."), said


def test_the_driver_double_fails_like_cuda_python_without_a_gpu(
    cu128_home: Path, driver_site: Path, tmp_path: Path
) -> None:
    _, cubin = engine_check.compile_kernel(str(cu128_home), ARCH, str(tmp_path))
    assert cubin is not None

    assert run_on_gpu(driver_site, cubin, tmp_path, gpus=0) == (
        "RuntimeError: cuInit: CUDA error 100 CUDA_ERROR_NO_DEVICE (no CUDA-capable device is "
        "detected)"
    )


def test_an_install_removes_what_installs_cut_short_left_of_any_toolkit(tmp_path: Path) -> None:
    # A deploy killed while it unpacked one compiler, then a pin moved to another: the next
    # install removes both its own and the other's partial trees; nothing else.
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    for name in ("13.0.88-aaaa.partial-41", "12.8.93-bbbb.partial-7"):
        (cuda / name / "bin").mkdir(parents=True)
        (cuda / name / "bin" / "nvcc").write_text("half")
    kept = ["12.8.93-bbbb", "notes.partial-x", "link.partial-9"]
    (cuda / "12.8.93-bbbb").mkdir()
    (cuda / "notes.partial-x").mkdir()
    (cuda / "link.partial-9").symlink_to(cuda / "12.8.93-bbbb")
    assert cuda_toolkit.remove_partials(str(cuda)) == [
        "12.8.93-bbbb.partial-7",
        "13.0.88-aaaa.partial-41",
    ]
    assert sorted(p.name for p in cuda.iterdir()) == sorted(kept)
