"""The engine check runs in a rank's own sandbox: one list (units.rank_sandbox) for the rank
template, preflight's probe unit and the check's unit (issue 27)."""

from __future__ import annotations

from operations.render import units
from operations.steps import engine_check as engine

USER = "sglang"


def rank_lines(gpu: int) -> list[str]:
    text = units.rank_unit(
        rank=gpu,
        gpu=gpu,
        port=30000,
        model_name="m",
        user=USER,
        env={},
        argv=["python"],
        device_nodes=None,
        drain_timeout_s=60,
    )
    return text.splitlines()


def test_the_rank_unit_writes_exactly_rank_sandbox() -> None:
    lines = rank_lines(3)
    for key, value in units.rank_sandbox(USER, 3, None):
        assert f"{key}={value}" in lines
    assert "DeviceAllow=/dev/nvidia3 rw" in lines
    assert "DeviceAllow=/dev/nvidia0 rw" not in lines


def test_the_check_sandbox_is_a_ranks_with_every_gpu() -> None:
    check = units.check_sandbox(USER, 8, None)
    rank = units.rank_sandbox(USER, 0, None)
    assert [p for p in check if p[0] != "DeviceAllow"] == [p for p in rank if p[0] != "DeviceAllow"]
    allowed = [v for k, v in check if k == "DeviceAllow"]
    assert {f"/dev/nvidia{i} rw" for i in range(8)} <= set(allowed)
    assert {"/dev/nvidiactl rw", "/dev/nvidia-uvm rw"} <= set(allowed)


def test_the_check_command_runs_as_the_user_with_script_and_argument_on_stdin() -> None:
    argument = '{"cuda_home": "/opt/$HOME/100%"}'
    raw = engine.check_command(
        "/opt/sglang/envs/e/bin/python", argument, USER, units.check_sandbox(USER, 2, None)
    ).get_raw_value()
    feed, _, unit = raw.partition("| systemd-run ")
    assert "--wait --pipe --collect" in unit
    assert "-p User=sglang -p Group=sglang" in unit
    assert "-p ProtectSystem=strict" in unit and "'-p' 'DeviceAllow" not in unit
    # The argument and the script travel on stdin: nothing of theirs meets systemd's
    # expansion of `$` and `%` on the unit's command line.
    assert "$HOME" in feed and "$HOME" not in unit
    assert "sglang_deploy_twice" in feed and "sglang_deploy_twice" not in unit
    assert engine.NAMESPACE_MARKER in unit


def test_without_a_user_the_check_runs_bare() -> None:
    raw = engine.check_command("/env/bin/python", "{}", None, []).get_raw_value()
    assert "systemd-run" not in raw
