"""Unit text: every rendered unit passes `systemd-analyze verify` with no complaint, values are
escaped for the directive they land in, the crash-loop cap sits in [Unit] where systemd reads
it, and each rank may reach only its own GPU."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from operations.plan import resolver
from operations.plan.model_plan import stage_unit_text
from operations.render import units
from operations.settings import Settings
from tests.unit.builders import facts, make_settings

# What verify may say about a unit rendered on the controller: the engine and router
# environments the units name are not installed here.
NOT_INSTALLED = re.compile(r"Command /opt/\S+/bin/python is not executable: No such file")


def odd(**values: Any) -> Settings:
    """Settings with values the schema would refuse, to prove the escapes hold on their own."""
    return dataclasses.replace(make_settings(), **values)


CASES: dict[str, tuple[Settings, tuple[str, ...] | None]] = {
    "defaults": (make_settings(), None),
    "two ranks, API key, metrics off": (
        odd(dp_size=2, api_key_file="/root/key", enable_metrics=False),
        ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"),
    ),
    "every optional device node": (
        make_settings(dp_size=1),
        (
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia-caps",
        ),
    ),
    "specifiers, spaces and quotes": (
        odd(
            model_name="Qwen/Qwen3.6 27B %n $HOME",
            model_source='/mnt/my models/100% "q"',
            extra_server_args=["--log-level", "debug %i $USER ;"],
        ),
        None,
    ),
    "hub source, other stage dir and user": (
        make_settings(
            model_source="hf://Qwen/Qwen3.6-27B@6a9e0b1",
            model_stage_dir="/run/models",
            service_user="llm",
        ),
        None,
    ),
}


def rendered(settings: Settings, nodes: tuple[str, ...] | None) -> dict[str, str]:
    plan = resolver.resolve(
        settings, dataclasses.replace(facts(), model_key="0123abcd", device_nodes=nodes)
    )
    assert not plan.errors, plan.errors
    out = {r.unit_name: r.unit for r in plan.ranks}
    out["sglang-stage-model.service"] = stage_unit_text(settings, "0123abcd")
    with_router = dataclasses.replace(settings, router=make_settings(
        router={"host": "ct200", "port": 8000}).router)  # fmt: skip
    router = resolver.resolve_router(with_router, "ct200", [("ct200", with_router)])
    out["sglang-router.service"] = router.unit
    out["sglang.target"] = units.target_unit()
    return out


@pytest.mark.integration
@pytest.mark.parametrize("case", list(CASES))
def test_every_rendered_unit_passes_systemd_analyze_verify(case: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is part of systemd (Debian: apt-get install systemd)"
    settings, nodes = CASES[case]
    names = []
    for name, text in rendered(settings, nodes).items():
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
    proc = subprocess.run(
        [analyze, "verify", "--man=no", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and not NOT_INSTALLED.search(line)
    ]
    assert complaints == [], "\n".join(complaints)


def section(unit: str, name: str) -> str:
    return unit.split(f"[{name}]\n", 1)[1].split("\n[", 1)[0]


def test_the_crash_loop_cap_is_in_unit_where_systemd_reads_it() -> None:
    for text in rendered(make_settings(), None).values():
        if "Restart=on-failure" not in text:
            continue
        assert "StartLimitBurst=5\n" in section(text, "Unit")
        assert "StartLimitIntervalSec=600\n" in section(text, "Unit")
        assert "StartLimit" not in section(text, "Service")


def test_a_rank_reaches_only_its_own_gpu() -> None:
    nodes = ("/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm",
             "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")  # fmt: skip
    unit = rendered(make_settings(), nodes)["sglang@3.service"]
    allowed = re.findall(r"^DeviceAllow=(.*)$", unit, re.M)
    assert allowed == [
        "/dev/nvidia3 rw",
        "/dev/nvidiactl rw",
        "/dev/nvidia-uvm rw",
        "/dev/nvidia-uvm-tools rw",
        "char-nvidia-caps rw",
    ]
    assert "DevicePolicy=closed\n" in unit
    for key in ("PrivateTmp=yes", "ProtectKernelLogs=yes", "ProtectClock=yes",
                "ProtectHostname=yes", "RestrictNamespaces=yes",
                "SystemCallArchitectures=native", "UMask=0027", "LimitNOFILE=65536"):  # fmt: skip
        assert f"\n{key}\n" in unit, key


@pytest.mark.parametrize(
    ("arg", "word"),
    [
        ("/opt/sglang/envs/a/bin/python", "/opt/sglang/envs/a/bin/python"),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("line\nbreak", '"line\\x0abreak"'),
        (";", "\\;"),
        ("", '""'),
    ],
)
def test_exec_words(arg: str, word: str) -> None:
    assert units.exec_word(arg) == word


def test_other_directives() -> None:
    assert units.env_assignment("CUDA_VISIBLE_DEVICES", "0") == '"CUDA_VISIBLE_DEVICES=0"'
    assert units.env_assignment("X", '5% "q"') == '"X=5%% \\"q\\""'
    with pytest.raises(units.UnitValueError):
        units.env_assignment("BAD NAME", "x")
    assert units.path_word("/mnt/a b/%c") == '"/mnt/a b/%%c"'
    with pytest.raises(units.UnitValueError):
        units.path_word("/mnt/a\nb")
    assert units.text("50% of\nit") == "50%% of\\x0ait"


def test_the_stage_unit_may_give_the_copy_to_the_servers_group() -> None:
    """The boot-time stage passes --group (root:GROUP 0750/0640); without CAP_CHOWN in its
    bounding set the script could only fall back to a world-readable copy."""
    settings = make_settings()
    unit = stage_unit_text(settings, "0123abcd")
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert f"--group {settings.service_user}" in exec_start
    bounding = next(line for line in unit.splitlines() if line.startswith("CapabilityBounding"))
    assert "CAP_CHOWN" in bounding.split("=", 1)[1].split()
