"""The model step's decision: unchanged, beside, in place or refused, from facts alone."""

from __future__ import annotations

import pytest

from operations.facts.host import Resources
from operations.facts.model import Copy, Staging
from operations.plan.model_plan import stage_command, stage_unit_text
from operations.plan.staging import decide
from tests.unit.builders import make_settings

GIB = 1024**3
SRC = Copy(digest="new", bytes=50 * GIB, files=19)
OLD = Copy(digest="old", bytes=50 * GIB, files=19)


def resources(free_gib: float, total_gib: float = 200, mem_gib: float = 500) -> Resources:
    return Resources(
        stage_total_bytes=int(total_gib * GIB),
        stage_free_bytes=int(free_gib * GIB),
        mem_total_bytes=int(mem_gib * GIB),
    )


def changed(copy_gib: float, staged: Copy | None = OLD) -> Staging:
    return Staging(source=SRC, staged=staged, copy_bytes=int(copy_gib * GIB), changed_files=["a"])


def test_converged_host_is_unchanged() -> None:
    staging = Staging(source=SRC, staged=SRC, copy_bytes=0, up_to_date=True)
    plan = decide(make_settings(), resources(100), staging, False)
    assert plan.mode == "unchanged" and "manifest new" in plan.why


def test_new_revision_beside_when_both_fit() -> None:
    plan = decide(make_settings(), resources(free_gib=150), changed(50), False)
    assert plan.mode == "beside"


def test_one_changed_shard_needs_only_its_bytes() -> None:
    plan = decide(make_settings(), resources(free_gib=10), changed(4), False)
    assert plan.mode == "beside" and "4.0 GiB to copy" in plan.why


def test_new_revision_in_place_when_both_do_not_fit() -> None:
    plan = decide(make_settings(), resources(free_gib=30, total_gib=110), changed(50), False)
    assert plan.mode == "inplace" and "servers stopped" in plan.why


def test_memory_limit_forces_in_place() -> None:
    # Two copies plus 8 ranks x 4 GiB exceed a 120 GiB container.
    plan = decide(make_settings(), resources(free_gib=150, mem_gib=120), changed(50), False)
    assert plan.mode == "inplace"


def test_refused_with_numbers_when_nothing_fits() -> None:
    plan = decide(make_settings(), resources(free_gib=20, total_gib=40), changed(50, None), False)
    assert plan.mode == "refuse"
    assert "bytes free" in plan.why and "nothing was copied" in plan.why


@pytest.mark.parametrize(
    ("staging", "text"),
    [
        (None, "python3 is missing"),
        (Staging(error="model source /m: no such directory"), "no such directory"),
    ],
)
def test_unreadable_source_is_refused(staging: Staging | None, text: str) -> None:
    plan = decide(make_settings(), resources(100), staging, False)
    assert plan.mode == "refuse" and text in plan.why


def test_leftovers_alone_are_cleaned() -> None:
    staging = Staging(source=SRC, staged=SRC, copy_bytes=0, leftovers=["/dev/shm/models/.x.tmp-1"])
    assert decide(make_settings(), resources(1), staging, False).mode == "beside"


def test_damaged_copy_is_restaged_whole() -> None:
    staging = Staging(source=SRC, staged=SRC, copy_bytes=0, mismatched=["model-1.safetensors"])
    plan = decide(make_settings(), resources(free_gib=30, total_gib=110), staging, False)
    assert plan.mode == "inplace" and "differ" in plan.why


def test_pending_source_stages_beside() -> None:
    assert decide(make_settings(), resources(1), None, True).mode == "beside"


def test_boot_unit_runs_the_same_command_line() -> None:
    s = make_settings(model_stage_bwlimit_mbps=200)
    unit = stage_unit_text(s, "0123abcd")
    deploy_argv = stage_command(
        s.model_source,
        "/dev/shm",
        "Qwen--Qwen3.6-27B",
        "auto",
        "manifest",
        200.0,
        key="0123abcd",
        group="sglang",  # the boot copy is the servers' group's only, as the deploy's
    )
    words = [
        "/usr/local/lib/sglang-deploy/stage_model.py",
        "stage",
        "/mnt/models/Qwen3.6-27B",
        "/dev/shm",
        "Qwen--Qwen3.6-27B",
        *("--mode", "auto", "--verify", "manifest", "--key", "0123abcd", "--group", "sglang"),
        *("--bwlimit-mbps", "200", "--headroom", "1.02"),
    ]
    assert deploy_argv == ["python3", *words]
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/sglang-deploy/stage_model.py stage "
        "/mnt/models/Qwen3.6-27B /dev/shm Qwen--Qwen3.6-27B --mode auto --verify manifest "
        "--key 0123abcd --group sglang --bwlimit-mbps 200 --headroom 1.02\n"
    ) in unit
    assert "RequiresMountsFor=/mnt/models/Qwen3.6-27B\n" in unit


@pytest.mark.parametrize(
    ("source", "kind", "target_dir"),
    [
        ("/mnt/models/Q", "target", "/mnt/models/Q"),
        # The cache name carries a hash of the whole path: another .../Q never shares it.
        (
            "controller:/srv/models/Q/",
            "controller",
            "/var/cache/sglang-models/controller/Q@5f3f16e59354",
        ),
        (
            "hf://Qwen/Qwen3.6-27B@6a9e0b1",
            "hf",
            "/var/cache/sglang-models/hf/Qwen--Qwen3.6-27B@6a9e0b1",
        ),
    ],
)
def test_source_forms(source: str, kind: str, target_dir: str) -> None:
    spec = make_settings(model_source=source).source
    assert (spec.kind, spec.target_dir) == (kind, target_dir)


@pytest.mark.parametrize("bad", ["models/q", "hf://Qwen3.6-27B", "hf://Qwen/Q", "ctrl:/m"])
def test_bad_source_forms_are_refused(bad: str) -> None:
    from operations.settings import SettingsError

    with pytest.raises(SettingsError, match="hf://org/name@revision"):
        make_settings(model_source=bad)


def test_the_plan_carries_the_one_staging_decision_and_a_refusal_stops_the_host() -> None:
    """The staging decision is made once, in host_plan, before any change: the plan shows it as
    a decision, and a copy that cannot fit is a host error at the gate (nothing touched), not a
    refusal half-way through the deploy."""
    from operations.plan.host_plan import HostReport
    from operations.plan.resolver import ResolvedHost
    from operations.plan.staging import StageDecision, StagePlan

    settings = make_settings()
    refused = StageDecision(StagePlan("refuse", "/dev/shm size 10 GiB < 54 GiB"), None,
                            frozenset(), source_pending=False)  # fmt: skip
    report = HostReport(settings, ResolvedHost(), staging=refused)
    assert (
        report.errors == ["model staging: /dev/shm size 10 GiB < 54 GiB (nothing was copied)"]
        and not report.ok
    )
    inplace = StageDecision(StagePlan("inplace", "replacing it"), None, frozenset(), False)
    assert "outage" in inplace.what
    assert HostReport(settings, ResolvedHost(), staging=inplace).ok
