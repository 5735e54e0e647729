"""The engine step's pure decisions: the resolved set and its name, where each package comes
from, the engine's project file, the wheelhouse check, the engine check's parser and judge,
what to prune."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from operations import kb as kbmod
from operations.facts.engine import EngineHost
from operations.plan.engine_plan import envs_to_prune
from operations.plan.engine_probe import Device, Driver, Probe, evaluate, parse_probe
from operations.plan.engine_spec import (
    EngineError,
    EngineSpec,
    engine_spec,
    indexes,
    missing_wheels,
    pip_config,
    project_toml,
    read_redist_manifest,
    toolkit,
)
from operations.programs import cuda_toolkit, engine_check
from operations.redact import redact
from tests.doubles import cuda_redist
from tests.doubles import wheels as double_wheels
from tests.needs import missing
from tests.unit.builders import make_settings

KB = kbmod.load()
DRIVER_570 = Driver("570.172.08", "12.8")


def spec(**overrides: object) -> EngineSpec:
    return engine_spec(make_settings(**overrides), KB)


# -- the resolved set and its name ----------------------------------------------------------


def test_cu128_takes_torch_and_companions_from_cu128_and_the_kernel_from_cu129() -> None:
    s = spec(sglang_version="0.5.11", cuda_lane="cu128")

    assert s.requirements == (
        "sglang==0.5.11",
        "torch==2.11.0+cu128",
        "torchvision==0.26.0+cu128",
        "torchaudio==2.11.0+cu128",
        "sglang-kernel==0.4.2+cu129",
        # FlashInfer 0.6.8.post1's prebuilt JIT modules for cu128 (knowledge/caches.yaml)
        "flashinfer-jit-cache==0.6.8.post1+cu128",
    )
    assert [(p.name, p.index, p.index_lane) for p in s.pins] == [
        ("torch", "torch", "cu128"),
        ("torchvision", "torch", "cu128"),
        ("torchaudio", "torch", "cu128"),
        ("sglang-kernel", "kernel", "cu129"),
        ("flashinfer-jit-cache", "flashinfer", "cu128"),
    ]
    assert s.cuda == "12.8" and s.arch == "sm_120" and s.gpu_count == 8


def test_cu130_reads_the_cu130_indexes_and_0_5_9_its_untagged_sgl_kernel_from_cu129() -> None:
    assert "sglang-kernel==0.4.2+cu130" in spec(cuda_lane="cu130").requirements
    old = spec(sglang_version="0.5.9", cuda_lane="cu128", model_name="Qwen/Qwen3.5-27B")
    kernel = old.pin("sgl-kernel")
    assert kernel is not None and (kernel.version, kernel.index_lane) == ("0.3.21", "cu129")


# Every (release, lane) build of the knowledge base: the rules below hold for each, so a new
# release is checked the day it is added.
BUILDS = [
    pytest.param(release, build.lane.name, id=f"{release}-{build.lane.name}")
    for release, entry in sorted(KB.releases.items(), key=lambda item: kbmod.version(item[0]))
    for build in entry.builds
]


def _cuda12(lane: str) -> bool:
    return KB.lanes[lane].cuda.startswith("12.")


def _requirement(text: str) -> Requirement:
    return Requirement(text)


@pytest.mark.parametrize(("release", "lane"), BUILDS)
def test_overrides_replace_sdist_only_and_cuda13_requirements(release: str, lane: str) -> None:
    """A cuda-tile rc (an sdist that downloads its wheel at build time) is replaced by its final
    release on every lane; a `[cu13]` extra is dropped on a CUDA 12 lane and kept on CUDA 13."""
    s = spec(sglang_version=release, cuda_lane=lane)
    overridden = {canonicalize_name(_requirement(o).name): _requirement(o) for o in s.overrides}
    for text in KB.releases[release].requires:
        req = _requirement(text)
        name = canonicalize_name(req.name)
        if name == "cuda-tile" and any("rc" in one.version for one in req.specifier):
            assert name in overridden and "rc" not in str(overridden[name].specifier), s.overrides
        if "cu13" in req.extras:
            if _cuda12(lane):
                assert name in overridden, (text, s.overrides)
                assert not overridden[name].extras, overridden[name]
                assert overridden[name].specifier == req.specifier, overridden[name]
            else:
                assert name not in overridden, (text, s.overrides)


def test_env_name_is_release_lane_python_and_a_stable_short_hash() -> None:
    name = spec().name
    release, lane, python, digest = name.split("-")
    assert (release, lane, python, len(digest)) == ("0.5.11", "cu128", "cp311", 8)
    assert spec().name == name


def test_one_python_per_engine_the_hosts_own() -> None:
    s312 = engine_spec(make_settings(), KB, "3.12")
    assert s312.name.split("-")[2] == "cp312" and s312.name != spec().name
    data = tomllib.loads(project_toml(make_settings(), s312, None))
    # One minor, so uv solves for it alone: a range would have to solve 3.13 too, where
    # outlines-core has no wheel.
    assert data["project"]["requires-python"] == "==3.12.*"
    with pytest.raises(EngineError, match=r"not built for Python 3\.13"):
        engine_spec(make_settings(), KB, "3.13")


@pytest.mark.parametrize(("release", "lane"), BUILDS)
def test_cuda_12_lanes_take_cuda_python_12_the_cuda_13_lane_the_releases_own(
    release: str, lane: str
) -> None:
    # torch's CUDA 12 builds need cuda-bindings<13 (sgl-project/sglang#25069): a release asking
    # for cuda-python>=13 gets 12.9.4 on a CUDA 12 lane; a CUDA 13 lane keeps the release's own.
    s = spec(sglang_version=release, cuda_lane=lane)
    own = [r for r in KB.releases[release].requires if _requirement(r).name == "cuda-python"]
    ours = [o for o in s.overrides if _requirement(o).name == "cuda-python"]
    if not _cuda12(lane):
        assert not ours, s.overrides
        return
    wanted = ours or own
    assert wanted, f"sglang {release} names no cuda-python"
    (effective,) = wanted
    assert not _requirement(effective).specifier.contains("13.0.0"), effective
    if own and _requirement(own[0]).specifier.contains("13.0.0"):
        assert ours == ["cuda-python==12.9.4"], s.overrides


@pytest.mark.parametrize(("release", "lane"), BUILDS)
def test_cuda_13_only_packages_are_excluded_on_cuda_12_lanes(release: str, lane: str) -> None:
    """What a CUDA 12 lane leaves out is a requirement the release really has, and the project
    file says so to uv; a CUDA 13 lane leaves nothing out."""
    s = spec(sglang_version=release, cuda_lane=lane)
    build = KB.releases[release].build(lane)
    assert build is not None
    assert s.excludes == tuple(x.package for x in build.excludes)
    if not _cuda12(lane):
        assert s.excludes == ()
    required = {canonicalize_name(_requirement(r).name) for r in KB.releases[release].requires}
    assert set(s.excludes) <= required, (s.excludes, required)
    data = tomllib.loads(
        project_toml(make_settings(sglang_version=release, cuda_lane=lane), s, None)
    )
    assert data["tool"]["uv"].get("exclude-dependencies", []) == list(s.excludes)
    assert not {canonicalize_name(_requirement(r).name) for r in s.requirements} & set(s.excludes)


def test_env_name_changes_with_the_set_but_not_with_where_wheels_come_from() -> None:
    base = spec().name
    assert spec(cuda_lane="cu130").name != base
    assert spec(torch_index_url="https://mirror.example/{lane}").name == base
    assert spec(package_index_url="https://mirror.example/simple").name == base


def test_spec_round_trips_through_json() -> None:
    s = spec(sglang_version="0.5.19")
    assert EngineSpec.from_json(json.loads(json.dumps(s.to_json()))) == s


# -- where packages come from -----------------------------------------------------------------


def test_each_index_template_is_filled_with_its_own_pins_lane() -> None:
    found = {i.name: i.url for i in indexes(make_settings(), spec())}
    assert found == {
        "pytorch-cu128": "https://download.pytorch.org/whl/cu128",
        "sglang-cu129": "https://docs.sglang.io/whl/cu129",
        "flashinfer-cu128": "https://flashinfer.ai/whl/cu128",
    }


def test_the_project_pins_every_cuda_package_to_its_explicit_index() -> None:
    s = make_settings(package_index_url="https://user:tok@mirror.example/simple")
    data = tomllib.loads(project_toml(s, engine_spec(s, KB), None))

    uv = data["tool"]["uv"]
    assert uv["no-build"] is True
    named = {i["name"]: i for i in uv["index"]}
    assert named["main"]["default"] is True and "explicit" not in named["main"]
    assert named["pytorch-cu128"]["explicit"] is True
    assert named["sglang-cu129"]["explicit"] is True
    assert named["flashinfer-cu128"] == {
        "name": "flashinfer-cu128",
        "url": "https://flashinfer.ai/whl/cu128",
        "explicit": True,
    }
    assert uv["sources"] == {
        "torch": {"index": "pytorch-cu128"},
        "torchvision": {"index": "pytorch-cu128"},
        "torchaudio": {"index": "pytorch-cu128"},
        "sglang-kernel": {"index": "sglang-cu129"},
        "flashinfer-jit-cache": {"index": "flashinfer-cu128"},
    }
    assert data["project"]["dependencies"][0] == "sglang==0.5.11"


def test_without_a_main_index_the_installer_default_is_used() -> None:
    s = make_settings()
    data = tomllib.loads(project_toml(s, engine_spec(s, KB), None))
    assert "main" not in {i["name"] for i in data["tool"]["uv"]["index"]}
    assert pip_config(s, None) is None


def test_offline_project_uses_the_wheelhouse_alone() -> None:
    s = make_settings(wheelhouse="/w")
    data = tomllib.loads(project_toml(s, engine_spec(s, KB), "/opt/sglang/wheelhouse"))
    assert data["tool"]["uv"]["no-index"] is True
    assert data["tool"]["uv"]["find-links"] == ["/opt/sglang/wheelhouse"]
    assert "index" not in data["tool"]["uv"]
    assert pip_config(s, "/opt/sglang/wheelhouse") == (
        "[global]\nno-index = true\nfind-links = /opt/sglang/wheelhouse\n"
    )


def test_redact_hides_credentials_only() -> None:
    assert redact("https://u:secret@mirror/simple") == "https://***@mirror/simple"
    assert redact("https://mirror/simple") == "https://mirror/simple"


def test_missing_wheels_matches_names_and_exact_versions() -> None:
    have = [
        "sglang-0.5.11-py3-none-any.whl",
        "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "sglang_kernel-0.4.2+cu129-cp310-abi3-manylinux2014_x86_64.whl",
        "not-a-wheel.txt",
    ]
    wanted = ("sglang==0.5.11", "torch==2.11.0+cu128", "sglang-kernel==0.4.2+cu129")

    assert missing_wheels(wanted, have) == ["torch==2.11.0+cu128"]


# -- the engine check: the real host script against the double wheels ------------------------
#
# operations/programs/engine_check.py runs as the engine step runs it (`python -c SCRIPT ARGUMENT`,
# stdout and stderr read together) in a Python whose packages are the double wheels at the
# knowledge base's 0.5.11/cu128 pins (tests/doubles/packages: torch, its companions, the
# kernel, flashinfer, cuda-python's driver API), on a host replayed from a captured nvidia-smi
# fixture (its /dev/nvidiaN nodes under a temp dir), with the cu128 compiler the deploy
# unpacks (NVIDIA's archive doubles through operations/programs/cuda_toolkit.py). Its output is
# read with operations.plan.engine_probe.parse_probe and judged with evaluate.

TESTS = Path(__file__).resolve().parents[1]
CHECK_SCRIPT = Path(engine_check.__file__).read_text()
# The doubles find GPUs by DEVICE_GLOB (/dev/nvidia[0-9]* in a container): pointed at the
# captured host's nodes before the check imports them.
SHIM = """import os
glob = os.environ["ENGINE_CHECK_DEVICE_GLOB"]
try:
    import torch.cuda
    torch.cuda.DEVICE_GLOB = glob
except ImportError:
    pass
try:
    from cuda.bindings import driver
    driver.DEVICE_GLOB = glob
except ImportError:
    pass
"""


@dataclass(frozen=True)
class Doubles:
    wheels: dict[str, Path]  # the release's double wheels by role (tests/doubles/wheels.py)
    cuda_home: Path
    work: Path


@pytest.fixture(scope="module")
def doubles(tmp_path_factory: pytest.TempPathFactory) -> Doubles:
    if shutil.which("g++") is None:
        missing("the nvcc double preprocesses with g++, as nvcc does")
    work = tmp_path_factory.mktemp("engine-check")
    built = double_wheels.release_wheels(work / "wheels", "0.5.11", "cu128")
    redist = cuda_redist.build(work / "redist", "cu128")
    compiler = KB.lanes["cu128"].compiler
    assert compiler is not None
    manifest = read_redist_manifest(str(redist.manifest))
    tools = toolkit(compiler, make_settings(), manifest, str(redist.manifest))
    home = work / "cuda" / tools.name
    archives = [{"path": a.path, "sha256": a.sha256, "size": a.size} for a in tools.archives]
    said = cuda_toolkit.install(
        {
            "home": str(home),
            "source": str(cuda_redist.flat(redist, work / "cuda-redist")),
            "root": tools.root,
            "archives": archives,
            "marker": {"version": tools.version},
        }
    )
    assert "release 12.8, V12.8.93" in said
    (work / "shim").mkdir()
    (work / "shim" / "sitecustomize.py").write_text(SHIM)
    return Doubles(built, home, work)


def run_check(
    doubles: Doubles,
    tmp_path: Path,
    host: str = "rtx-pro-6000-x8",
    gpus: int | None = None,
    replace: dict[str, Path] | None = None,
    tools_path: str = "/usr/bin:/bin",
    argument: str | None = None,
) -> str:
    """What the engine check prints on `host` (its first `gpus` GPU nodes: all by default),
    with the release's wheels but those in `replace` (role -> wheel)."""
    site = tmp_path / "site"
    for wheel in {**doubles.wheels, **(replace or {})}.values():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    fixture = TESTS / "fixtures" / "nvidia-smi" / host
    names = (fixture / "devices.txt").read_text().split()
    nodes = [n for n in names if n[len("nvidia") :].isdigit()][:gpus]
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in nodes:
        (dev / node).touch()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copyfile(TESTS / "doubles" / "nvidia-smi", bindir / "nvidia-smi")
    (bindir / "nvidia-smi").chmod(0o755)
    s = spec()
    argument = argument or json.dumps(
        {
            "packages": s.modules(),
            "gpu_count": s.gpu_count,
            "cuda_home": str(doubles.cuda_home),
            "arch": s.compile_arch,
        }
    )
    run = subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT, argument],
        env={
            "PATH": f"{bindir}:{tools_path}",
            "NVIDIA_SMI_DOUBLE_DIR": str(fixture),
            "PYTHONPATH": f"{doubles.work / 'shim'}:{site}",
            "ENGINE_CHECK_DEVICE_GLOB": str(dev / "nvidia[0-9]*"),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run.stdout + "\n" + run.stderr


def judged(text: str) -> list[str]:
    return evaluate(parse_probe(text), spec(), DRIVER_570)


PINS: dict[str, str | None] = {
    "sglang": "0.5.11",
    "torch": "2.11.0+cu128",
    "torchvision": "0.26.0+cu128",
    "torchaudio": "2.11.0+cu128",
    "sglang-kernel": "0.4.2+cu129",
    "flashinfer-python": "0.6.8.post1",
    "flashinfer-jit-cache": "0.6.8.post1+cu128",
}
MODULES = ["torch", "torchvision", "torchaudio", "sgl_kernel", "flashinfer_jit_cache", "flashinfer"]


@pytest.mark.integration
def test_a_good_environment_on_the_captured_host_passes(doubles: Doubles, tmp_path: Path) -> None:
    text = run_check(doubles, tmp_path)

    assert parse_probe(text) == Probe(
        versions=PINS,
        imports={**dict.fromkeys(MODULES, "ok"), "sglang.launch_server": "ok"},
        torch_cuda="12.8",
        cuda_available=True,
        device_count=8,
        arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
        devices=tuple(Device(i, "12.0", "ok") for i in range(8)),
        compile="ok",
        kernel_runs=("ok",) * 8,
        user=pwd.getpwuid(os.geteuid()).pw_name,  # the check names who ran it
    ), text
    assert judged(text) == []


@pytest.mark.integration
def test_torch_that_cannot_see_the_gpus_is_refused_naming_build_driver_and_fix(
    doubles: Doubles, tmp_path: Path
) -> None:
    cu130 = double_wheels.torch_wheel(tmp_path / "w", "2.11.0+cu130")
    problems = judged(run_check(doubles, tmp_path, replace={"torch": cu130}))

    warning = (TESTS / "fixtures/cuda-errors/torch-driver-too-old.txt").read_text().strip()
    assert problems[0].startswith("torch: expected the 2.11.0+cu128 build")
    assert problems[0].endswith("found 2.11.0+cu130; the environment did not install its lock: "
                                "rerun the deploy")  # fmt: skip
    assert problems[1] == (
        "torch 2.11.0+cu128: torch.version.cuda is 13.0, the cu128 lane needs CUDA 12.8: the "
        "wheel is mislabelled or from another index"
    )
    assert problems[2] == (
        "torch 2.11.0+cu128 (CUDA 13.0) cannot use the GPUs with this host's driver 570.172.08 "
        f"(runs CUDA <= 12.8): torch.cuda.is_available() is False ({warning}); the cu128 lane "
        "needs driver >= 525: pin a cuda_lane this driver runs, or upgrade the host driver to "
        ">= 525"
    )
    assert "found version 12080" in warning


@pytest.mark.integration
def test_fewer_gpus_than_gpu_count_are_named(doubles: Doubles, tmp_path: Path) -> None:
    text = run_check(doubles, tmp_path, gpus=2)

    assert parse_probe(text).kernel_runs == ("ok", "ok")
    assert judged(text) == [
        "torch 2.11.0+cu128: torch.cuda.device_count() is 2, expected gpu_count 8: check "
        "CUDA_VISIBLE_DEVICES and the container's GPUs",
    ]


@pytest.mark.integration
def test_a_gpu_of_another_arch_is_named_with_the_driver_refusing_the_kernel(
    doubles: Doubles, tmp_path: Path
) -> None:
    problems = judged(run_check(doubles, tmp_path, host="h200-x8", gpus=1))

    assert problems == [
        "GPU 0: a kernel nvcc 12.8.93 compiled for sm_120a does not run with the host's driver "
        "570.172.08 (runs CUDA <= 12.8): RuntimeError: cuModuleLoadData: CUDA error 209 "
        "CUDA_ERROR_NO_BINARY_FOR_GPU (no kernel image is available for execution on the device)",
        "torch 2.11.0+cu128: torch.cuda.device_count() is 1, expected gpu_count 8: check "
        "CUDA_VISIBLE_DEVICES and the container's GPUs",
        "GPU 0: compute capability 9.0, expected 12.0 (gpu_compute_cap)",
    ]


@pytest.mark.integration
def test_a_compiler_that_cannot_build_for_the_gpu_fails_the_check(
    doubles: Doubles, tmp_path: Path
) -> None:
    python_only = tmp_path / "python-only"  # python3 for the doubles, no g++
    python_only.mkdir()
    (python_only / "python3").symlink_to(sys.executable)
    text = run_check(doubles, tmp_path, tools_path=str(python_only))

    (problem,) = judged(text)
    said = "nvcc fatal   : Failed to preprocess host compiler properties."
    assert problem.startswith(
        f"nvcc 12.8.93 (nvidia-redist) cannot compile for sm_120a: {doubles.cuda_home}/bin/nvcc "
        "-arch=sm_120a exited 1: "
    )
    assert said in problem and "check the host compiler (g++) is installed" in problem


@pytest.mark.integration
def test_sm120_must_be_compiled_in(doubles: Doubles, tmp_path: Path) -> None:
    old = double_wheels.torch_wheel(tmp_path / "w", "2.11.0+cu128", archs=("sm_80", "sm_90"))
    problems = judged(run_check(doubles, tmp_path, replace={"torch": old}))

    assert problems == [
        "torch 2.11.0+cu128: not compiled for sm_120 (torch.cuda.get_arch_list(): sm_80, "
        "sm_90): a CUDA 12.8 build should carry it; check the torch index serves PyTorch's own "
        "wheels"
    ]


@pytest.mark.integration
def test_a_kernel_of_another_cuda_major_is_named_with_its_build(
    doubles: Doubles, tmp_path: Path
) -> None:
    plain = double_wheels.kernel_wheel(tmp_path / "w", "sglang-kernel", "0.4.2", "13.0")
    problems = judged(run_check(doubles, tmp_path, replace={"kernel": plain}))

    missing = (TESTS / "fixtures/cuda-errors/libcudart-13-missing.txt").read_text().strip()
    assert problems[0].startswith(
        "sglang-kernel: expected the 0.4.2+cu129 build (from the kernel index, lane cu129), "
        "found 0.4.2;"
    )
    assert problems[1] == (
        "sglang-kernel 0.4.2+cu129: import sgl_kernel failed beside torch 2.11.0+cu128 with the "
        f"host's driver 570.172.08 (runs CUDA <= 12.8): ImportError: {missing}; its CUDA build "
        "must match torch's CUDA major (12.8) and run on this driver: fix its build for the "
        "cu128 lane in operations/kb/knowledge/sglang.yaml, or pin another cuda_lane"
    )
    assert len(problems) == 2


@pytest.mark.integration
def test_wrong_installed_versions_are_named(doubles: Doubles, tmp_path: Path) -> None:
    other = double_wheels.sglang_wheel(tmp_path / "w", "0.5.9")
    vision = double_wheels.companion_wheel(tmp_path / "w", "torchvision", "0.26.0+cu130", "13.0")
    problems = judged(
        run_check(doubles, tmp_path, replace={"sglang": other, "torchvision": vision})
    )

    assert problems[0] == "sglang: expected 0.5.11, found 0.5.9"
    assert problems[1].startswith("torchvision: expected the 0.26.0+cu128 build")
    assert problems[1].endswith("found 0.26.0+cu130; the environment did not install its lock: "
                                "rerun the deploy")  # fmt: skip


@pytest.mark.integration
def test_a_check_that_printed_nothing_says_so(doubles: Doubles, tmp_path: Path) -> None:
    text = run_check(doubles, tmp_path, argument="{not json")

    probe = parse_probe(text)
    assert probe.versions == {} and len(probe.errors) == 1
    assert probe.errors[0].startswith("the engine check printed no result: ")
    assert probe.errors[0].endswith(
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)"
    )
    assert judged(text) == list(probe.errors)


# -- pruning --------------------------------------------------------------------------------


def host_state(current: str | None, **envs: int | None) -> EngineHost:
    return {
        "current": current,
        "envs": {n: {"complete": t is not None, "activated_at": t} for n, t in envs.items()},
        "uv": "0.13.9",
    }


@pytest.mark.parametrize(
    ("keep", "expected"),
    [(1, ["a", "b", "c", "p"]), (2, ["a", "b", "p"]), (3, ["a", "p"]), (5, ["p"])],
)
def test_prune_keeps_the_most_recently_activated(keep: int, expected: list[str]) -> None:
    state = host_state("new", a=1, b=2, c=3, new=4, p=None)
    assert envs_to_prune(state, "new", keep) == expected


def test_prune_never_removes_the_target_or_what_was_serving() -> None:
    state = host_state("old", old=1, new=None, x=5)
    assert envs_to_prune(state, "new", 1, serving="old") == ["x"]
