"""The engine step's pure decisions: the resolved set and its name, where each package comes
from, the engine's project file, the wheelhouse check, the engine check's parser and judge,
what to prune."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from operations import kb as kbmod
from operations.engine import Driver, Probe, envs_to_prune, evaluate, parse_probe
from operations.engine_spec import (
    EngineError,
    EngineSpec,
    engine_spec,
    indexes,
    missing_wheels,
    pip_config,
    project_toml,
)
from operations.facts.engine import EngineHost
from operations.redact import redact
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
    )
    assert [(p.name, p.index, p.index_lane) for p in s.pins] == [
        ("torch", "torch", "cu128"),
        ("torchvision", "torch", "cu128"),
        ("torchaudio", "torch", "cu128"),
        ("sglang-kernel", "kernel", "cu129"),
    ]
    assert s.cuda == "12.8" and s.arch == "sm_120" and s.gpu_count == 8


def test_cu130_reads_the_cu130_indexes_and_0_5_9_its_untagged_sgl_kernel_from_cu129() -> None:
    assert "sglang-kernel==0.4.2+cu130" in spec(cuda_lane="cu130").requirements
    old = spec(sglang_version="0.5.9", cuda_lane="cu128", model_name="Qwen/Qwen3.5-27B")
    kernel = old.pin("sgl-kernel")
    assert kernel is not None and (kernel.version, kernel.index_lane) == ("0.3.21", "cu129")


def test_overrides_replace_sdist_only_and_cuda13_requirements() -> None:
    s = spec(sglang_version="0.5.19", cuda_lane="cu128")
    assert "cuda-tile==1.6.0" in s.overrides and "flashinfer-python==0.6.18" in s.overrides
    assert s.unproven, "0.5.19 on a CUDA 12 lane is flagged as unproven"


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


def test_cuda_12_lanes_take_cuda_python_12_9_the_cuda_13_lane_the_releases_own() -> None:
    # torch's CUDA 12 builds need cuda-bindings<13 (sgl-project/sglang#25069).
    for release, lane in (("0.5.11", "cu128"), ("0.5.19", "cu128"), ("0.5.19", "cu129")):
        assert "cuda-python==12.9.4" in spec(sglang_version=release, cuda_lane=lane).overrides
    for release in ("0.5.11", "0.5.19"):
        cu130 = spec(sglang_version=release, cuda_lane="cu130")
        assert not any(o.startswith("cuda-python") for o in cu130.overrides)


def test_cuda_13_only_packages_are_excluded_on_cuda_12_lanes() -> None:
    s = spec(sglang_version="0.5.19", cuda_lane="cu128")
    assert s.excludes == ("sgl-deep-ep", "sgl-deep-gemm")
    data = tomllib.loads(project_toml(make_settings(sglang_version="0.5.19"), s, None))
    assert data["tool"]["uv"]["exclude-dependencies"] == ["sgl-deep-ep", "sgl-deep-gemm"]
    assert spec(sglang_version="0.5.19", cuda_lane="cu130").excludes == ()


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
    assert uv["sources"] == {
        "torch": {"index": "pytorch-cu128"},
        "torchvision": {"index": "pytorch-cu128"},
        "torchaudio": {"index": "pytorch-cu128"},
        "sglang-kernel": {"index": "sglang-cu129"},
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


# -- the engine check -----------------------------------------------------------------------


def probe_line(**values: object) -> str:
    data: dict[str, object] = {
        "versions": {
            "sglang": "0.5.11",
            "torch": "2.11.0+cu128",
            "torchvision": "0.26.0+cu128",
            "torchaudio": "2.11.0+cu128",
            "sglang-kernel": "0.4.2+cu129",
            "flashinfer-python": "0.6.8.post1",
        },
        "imports": {
            "torch": "ok",
            "torchvision": "ok",
            "torchaudio": "ok",
            "sgl_kernel": "ok",
            "flashinfer": "ok",
            "sglang.launch_server": "ok",
        },
        "torch_cuda": "12.8",
        "cuda_available": True,
        "device_count": 8,
        "arch_list": ["sm_90", "sm_120"],
        "devices": [{"index": i, "capability": "12.0", "op": "ok"} for i in range(8)],
        "compile": "ok",
        "kernel_runs": ["ok"] * 8,
        **values,
    }
    return "some import chatter\n@@probe " + json.dumps(data) + "\n"


def check(**values: object) -> list[str]:
    return evaluate(parse_probe(probe_line(**values)), spec(), DRIVER_570)


def test_a_good_environment_passes() -> None:
    assert check() == []


def test_torch_that_cannot_see_the_gpus_is_refused_naming_build_driver_and_fix() -> None:
    warning = Path("tests/fixtures/cuda-errors/torch-driver-too-old.txt").read_text().strip()
    problems = check(torch_cuda="13.0", cuda_available=False, cuda_warnings=[warning])

    assert problems[0].startswith("torch 2.11.0+cu128: torch.version.cuda is 13.0")
    assert "torch.cuda.is_available() is False" in problems[1]
    assert "driver 570.172.08" in problems[1] and "found version 12080" in problems[1]
    assert "driver >= 525" in problems[1]


def test_each_gpu_must_match_and_run_the_operation() -> None:
    devices = [{"index": 0, "capability": "12.0", "op": "ok"}]
    devices.append({"index": 1, "capability": "12.1", "op": "RuntimeError: CUDA error"})
    problems = check(device_count=2, devices=devices)
    assert problems == [
        "torch 2.11.0+cu128: torch.cuda.device_count() is 2, expected gpu_count 8: check "
        "CUDA_VISIBLE_DEVICES and the container's GPUs",
        "GPU 1: compute capability 12.1, expected 12.0 (gpu_compute_cap)",
        "GPU 1: a small CUDA operation with torch 2.11.0+cu128 failed with the host's driver "
        "570.172.08 (runs CUDA <= 12.8): RuntimeError: CUDA error; pin a cuda_lane this "
        "driver runs, or upgrade the host driver to >= 525",
    ]


def test_a_compiler_that_cannot_build_for_the_gpu_fails_the_check() -> None:
    said = "nvcc fatal   : Failed to preprocess host compiler properties."
    problems = check(compile=f"/opt/sglang/cuda/12.8.93-x/bin/nvcc -arch=sm_120a exited 1: {said}")
    assert len(problems) == 1
    assert problems[0].startswith("nvcc 12.8.93 (nvidia-redist) cannot compile for sm_120a")
    assert said in problems[0] and "g++" in problems[0]


def test_a_compiled_kernel_that_does_not_run_names_the_gpu_and_driver() -> None:
    runs = ["ok"] * 8
    runs[3] = (
        "RuntimeError: cuModuleLoadData: CUDA error 222 CUDA_ERROR_UNSUPPORTED_PTX_VERSION "
        "(the provided PTX was compiled with an unsupported toolchain.)"
    )
    (problem,) = check(kernel_runs=runs)
    assert problem.startswith("GPU 3: a kernel nvcc 12.8.93 compiled for sm_120a does not run")
    assert "driver 570.172.08" in problem and "error 222" in problem


def test_sm120_must_be_compiled_in() -> None:
    problems = check(arch_list=["sm_80", "sm_90"])
    assert len(problems) == 1 and "not compiled for sm_120" in problems[0]


def test_a_kernel_of_another_cuda_major_is_named_with_its_build() -> None:
    missing = Path("tests/fixtures/cuda-errors/libcudart-13-missing.txt").read_text().strip()
    problems = check(imports={"torch": "ok", "sgl_kernel": f"ImportError: {missing}"})

    kernel = [p for p in problems if p.startswith("sglang-kernel")]
    assert kernel and "0.4.2+cu129" in kernel[0] and "libcudart.so.13" in kernel[0]


def test_wrong_installed_versions_are_named() -> None:
    versions = json.loads(probe_line().split("@@probe ")[1])["versions"]
    problems = check(versions={**versions, "sglang": "0.5.9", "torchvision": "0.26.0+cu130"})
    assert problems[0] == "sglang: expected 0.5.11, found 0.5.9"
    assert problems[1].startswith("torchvision: expected the 0.26.0+cu128 build")


def test_a_probe_that_printed_nothing_says_so() -> None:
    probe = parse_probe("Traceback (most recent call last):\n  ...\nSyntaxError: bad")
    assert probe == Probe(
        {},
        {},
        errors=(
            "the engine check printed no result: Traceback (most recent call "
            "last): /   ... / SyntaxError: bad",
        ),
    )
    assert evaluate(probe, spec(), DRIVER_570)[0].startswith("the engine check printed no result")


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
