"""Preflight over facts parsed from real captured outputs: each bad host gets its own failure
with what was expected, what was found and how to fix it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from operations import kb
from operations.facts.host import Model, Resources, parse_resources
from operations.plan import resolver
from operations.plan.host_plan import HostReport
from operations.plan.preflight import Failure, check
from operations.runtime.plan_step import refusal
from operations.simulated import ct200 as simulated_ct200
from tests.unit.builders import QWEN36, facts, gpu_facts, make_settings

CT200 = parse_resources(simulated_ct200.captured("host-resources.txt"))
GIB = 1024**3


def failures(
    scenario: str = "rtx-pro-6000-x8",
    resources: Resources = CT200,
    model: Model = QWEN36,
    **settings: Any,
) -> list[Failure]:
    return check(make_settings(**settings), kb.load(), gpu_facts(scenario), resources, model)


def only(fs: list[Failure]) -> Failure:
    assert len(fs) == 1, fs
    return fs[0]


def test_ct200_passes() -> None:
    assert failures() == []


@pytest.mark.parametrize(
    ("scenario", "check_name", "found", "fix"),
    [
        (
            "version-mismatch",
            "nvidia-smi answers",
            "Driver/library version mismatch",
            "kernel module",
        ),
        ("no-driver", "nvidia-smi answers", "couldn't communicate", "lxc.cgroup2.devices.allow"),
        ("rtx-pro-6000-x4", "GPU count", "4:", "gpu_count"),
        ("h200-x8", "compute capability", "NVIDIA H200 (9.0)", "gpu_compute_cap"),
        ("gb10", "GPU count", "1: NVIDIA GB10", "gpu_count"),
    ],
)
def test_gpu_failures(scenario: str, check_name: str, found: str, fix: str) -> None:
    fs = [f for f in failures(scenario) if f.check == check_name]
    f = only(fs)
    assert found in f.found and fix in f.fix, f


def test_cuda_na_means_no_usable_cuda_in_the_container() -> None:
    f = only(failures("cuda-na"))
    assert f.check == "CUDA user space" and "N/A" in f.found and "libcuda" in f.fix


def test_gb10_is_also_the_wrong_chip() -> None:
    checks = {f.check for f in failures("gb10")}
    assert checks >= {"GPU count", "compute capability"}


def test_missing_device_nodes_are_named() -> None:
    nodes = [n for n in CT200.device_nodes if n not in ("/dev/nvidia-uvm", "/dev/nvidia3")]
    f = only(failures(resources=dataclasses.replace(CT200, device_nodes=nodes)))
    assert f.check == "GPU device nodes"
    assert f.found == "missing /dev/nvidia-uvm, /dev/nvidia3"


def test_small_shm_is_refused_with_numbers() -> None:
    small = dataclasses.replace(CT200, stage_total_bytes=32 * GIB, stage_free_bytes=32 * GIB)
    f = only(failures(resources=small))
    assert f.check == "/dev/shm size" and f.found == "32.0 GiB" and "50.1 GiB" in f.expected


def test_memory_limit_counts_shm_and_ranks() -> None:
    tight = dataclasses.replace(CT200, cgroup_limit_bytes=64 * GIB)
    f = only(failures(resources=tight))
    assert f.check == "container memory" and f.found == "64.0 GiB" and "8 ranks" in f.expected


def test_old_glibc_no_systemd() -> None:
    old = dataclasses.replace(CT200, glibc="2.31", systemd=None)
    checks = {f.check: f for f in failures(resources=old)}
    assert set(checks) == {"glibc", "systemd"}
    assert checks["glibc"].expected.startswith(">= 2.34")


def test_missing_model_source() -> None:
    f = only(failures(model=Model(exists=False)))
    assert f.check == "model source" and "/mnt/models/Qwen3.6-27B" in f.expected


def test_model_without_config() -> None:
    f = only(
        failures(model=Model(exists=True, size_bytes=10, config_error="no readable config.json"))
    )
    assert f.check == "model config" and f.found == "no readable config.json"


def test_a_model_without_a_tokenizer_is_refused_while_the_throughput_check_is_on() -> None:
    """The benchmark client loads the tokenizer from the staged copy: without one the check
    fails after the ranks restarted; refused here, before any change (issue 43.6)."""
    bare = dataclasses.replace(QWEN36, tokenizer=())
    f = only(failures(model=bare))
    assert f.check == "model tokenizer" and f.found == "none"
    assert "tokenizer.json" in f.expected and "/mnt/models/Qwen3.6-27B" in f.expected
    assert "throughput_check: off" in f.fix
    assert failures(model=bare, throughput_check="off") == []
    # Not known (an older scan's answer, or none): nothing is claimed.
    assert failures(model=dataclasses.replace(QWEN36, tokenizer=None)) == []


def test_low_disk_for_engines() -> None:
    f = only(failures(resources=dataclasses.replace(CT200, engine_free_bytes=2 * GIB)))
    assert f.check == "disk for engines" and f.found == "2.0 GiB"


def test_refusal_logs_every_problem_in_full() -> None:
    """The line pyinfra logs for a refused host: the table beside it is cut at 80 columns in a
    CI log, so this one carries what was found and the whole fix."""
    settings = make_settings()
    gpu_failures = failures("version-mismatch")
    plan = resolver.resolve(settings, facts("version-mismatch"), kb.load())
    first, *lines = refusal(HostReport(settings, plan, gpu_failures)).splitlines()

    assert first == f"{len(gpu_failures) + len(plan.errors)} problem(s), nothing changed:"
    (mismatch,) = [line for line in lines if "nvidia-smi answers" in line]
    assert "Driver/library version mismatch" in mismatch
    assert "host's kernel module" in mismatch and "--no-kernel-module" in mismatch
