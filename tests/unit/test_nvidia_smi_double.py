"""The nvidia-smi test double against every fixture scenario, run locally (no containers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # runs the nvidia-smi double

TESTS = Path(__file__).resolve().parent.parent
DOUBLE = TESTS / "doubles" / "nvidia-smi"
FIXTURES = TESTS / "fixtures" / "nvidia-smi"
FULL_FIELDS = "index,name,compute_cap,memory.total,memory.used,driver_version,uuid,pci.bus_id"

SCENARIOS = {
    # name: (GPU count, name, compute_cap, memory.total MiB, driver, CUDA in the banner)
    "rtx-pro-6000-x8": (
        8,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "12.0",
        "97887",
        "570.172.08",
        "12.8",
    ),
    "rtx-pro-6000-x8-driver-580": (
        8,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "12.0",
        "97887",
        "580.95.05",
        "13.0",
    ),
    "rtx-pro-6000-x4": (
        4,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "12.0",
        "97887",
        "570.172.08",
        "12.8",
    ),
    "driver-565": (
        8,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "12.0",
        "97887",
        "565.57.01",
        "12.7",
    ),
    "cuda-na": (
        8,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "12.0",
        "97887",
        "570.172.08",
        "N/A",
    ),
    "h200-x8": (8, "NVIDIA H200", "9.0", "143771", "570.172.08", "12.8"),
    "gb10": (1, "NVIDIA GB10", "12.1", "[N/A]", "580.95.05", "13.0"),
}
FAILURES = {
    "version-mismatch": (18, "Failed to initialize NVML: Driver/library version mismatch\n"),
    "no-driver": (
        9,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n",
    ),
}


def smi(scenario: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NVIDIA_SMI_DOUBLE_DIR": str(FIXTURES / scenario)}
    return subprocess.run(
        [sys.executable, str(DOUBLE), *args], env=env, capture_output=True, text=True, check=False
    )


def test_every_fixture_scenario_is_covered_and_documented() -> None:
    on_disk = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    assert on_disk == set(SCENARIOS) | set(FAILURES)
    for name in on_disk:
        assert (FIXTURES / name / "SOURCE.md").is_file(), name


def test_header_says_it_is_a_test_double() -> None:
    assert "TEST DOUBLE" in "".join(DOUBLE.read_text().splitlines(keepends=True)[:5])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_full_table_round_trips(scenario: str) -> None:
    result = smi(scenario, f"--query-gpu={FULL_FIELDS}", "--format=csv")
    assert result.returncode == 0, result.stdout
    assert result.stdout == (FIXTURES / scenario / "gpus.csv").read_text()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_columns_in_any_order_without_units(scenario: str) -> None:
    count, name, cap, total, driver, _ = SCENARIOS[scenario]
    result = smi(
        scenario,
        "--query-gpu=memory.total,compute_cap,name,index,driver_version",
        "--format=csv,noheader,nounits",
    )
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"{total}, {cap}, {name}, {i}, {driver}" for i in range(count)
    ]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_banner_names_driver_and_cuda(scenario: str) -> None:
    _, _, _, _, driver, cuda = SCENARIOS[scenario]
    result = smi(scenario)
    assert result.returncode == 0
    assert f"Driver Version: {driver}" in result.stdout
    assert f"CUDA Version: {cuda} " in result.stdout
    assert all(
        len(line) == 91 for line in result.stdout.splitlines() if line.startswith(("|", "+"))
    )


def test_units_stay_in_the_header_with_nounits() -> None:
    with_units = smi("rtx-pro-6000-x8", "--query-gpu=index,memory.total", "--format=csv")
    no_units = smi("rtx-pro-6000-x8", "--query-gpu=index,memory.total", "--format=csv,nounits")
    assert with_units.stdout.splitlines()[:2] == ["index, memory.total [MiB]", "0, 97887 MiB"]
    assert no_units.stdout.splitlines()[:2] == ["index, memory.total [MiB]", "0, 97887"]


def test_gb10_memory_is_not_available_either_way() -> None:
    result = smi("gb10", "--query-gpu=memory.total,memory.used", "--format=csv,nounits")
    assert result.stdout == "memory.total [MiB], memory.used [MiB]\n[N/A], [N/A]\n"


def test_separate_argument_forms_and_id_filter() -> None:
    result = smi(
        "h200-x8", "--query-gpu", "index,pci.bus_id", "--format", "csv,noheader", "-i", "3"
    )
    assert result.stdout == "3, 00000000:5B:00.0\n"


def test_count_and_list_gpus() -> None:
    assert smi("rtx-pro-6000-x4", "--query-gpu=count", "--format=csv,noheader").stdout == (
        "4\n" * 4
    )
    listing = smi("h200-x8", "-L").stdout.splitlines()
    assert len(listing) == 8
    assert listing[0].startswith("GPU 0: NVIDIA H200 (UUID: GPU-")


@pytest.mark.parametrize("scenario", sorted(FAILURES))
@pytest.mark.parametrize(
    "args",
    [(), ("--query-gpu=name", "--format=csv,noheader"), ("-L",), ("--no-such-flag",)],
)
def test_failure_scenarios_fail_every_invocation(scenario: str, args: tuple[str, ...]) -> None:
    code, first_line = FAILURES[scenario]
    result = smi(scenario, *args)
    assert result.returncode == code
    assert result.stdout.startswith(first_line)


def test_version_mismatch_names_the_library_version() -> None:
    assert smi("version-mismatch").stdout.splitlines()[1] == "NVML library version: 570.172"


def test_unknown_field_fails_like_nvidia_smi() -> None:
    result = smi("rtx-pro-6000-x8", "--query-gpu=index,bogus", "--format=csv")
    assert result.returncode == 2
    assert result.stdout == 'Field "bogus" is not a valid field to query.\n\n'


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--bogus",), "ERROR: Option --bogus is not recognized."),
        (("--query-gpu=index", "--format=csv,fancy"), "ERROR: Option fancy is not recognized."),
        (("--format=csv",), "Invalid combination of input arguments."),
        (("--query-gpu=index",), "Invalid combination of input arguments."),
    ],
)
def test_bad_arguments_fail_like_nvidia_smi(args: tuple[str, ...], expected: str) -> None:
    result = smi("rtx-pro-6000-x8", *args)
    assert result.returncode == 2
    assert result.stdout.startswith(expected)
