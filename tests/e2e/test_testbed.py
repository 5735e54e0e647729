"""Smoke tests of the testbed itself: real systemd, real SSH, real pyinfra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed import BootContainers, ContainerSpec, inventory_file

PYINFRA = Path(sys.executable).parent / "pyinfra"

pytestmark = pytest.mark.e2e


def test_pyinfra_reaches_two_containers_over_ssh(
    boot_containers: BootContainers, tmp_path: Path
) -> None:
    a, b = boot_containers(ContainerSpec(), ContainerSpec(scenario="h200-x8"))
    assert a.address != b.address
    inventory = inventory_file(tmp_path, {a: {"role": "worker"}, b: {}})

    proc = subprocess.run(
        [str(PYINFRA), "-y", str(inventory), "exec", "--", "systemctl", "is-system-running"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        check=False,
    )

    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    for container in (a, b):
        assert f"[{container.name}] running" in proc.stdout + proc.stderr, report


def test_nvidia_smi_double_answers_inside(boot_containers: BootContainers) -> None:
    rtx, h200, broken = boot_containers(
        ContainerSpec(), ContainerSpec(scenario="h200-x8"), ContainerSpec(scenario="no-driver")
    )

    rc, out, _ = rtx.ssh_run("nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader")
    assert rc == 0
    assert out.splitlines()[7] == "7, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0"
    assert len(out.splitlines()) == 8

    rc, out, _ = h200.ssh_run("nvidia-smi")
    assert rc == 0
    assert "CUDA Version: 12.8" in out
    assert "NVIDIA H200" in out

    rc, out, _ = broken.ssh_run("nvidia-smi --query-gpu=name --format=csv")
    assert rc == 9
    assert "couldn't communicate with the NVIDIA driver" in out


def test_reboot_empties_dev_shm_and_keeps_the_disk(boot_containers: BootContainers) -> None:
    (c,) = boot_containers(ContainerSpec())
    assert c.ssh_run("echo weights > /dev/shm/model && echo kept > /root/marker")[0] == 0
    pid_before = c.pid

    c.reboot()

    assert c.pid is not None and c.pid != pid_before
    assert c.ssh_run("test -e /dev/shm/model")[0] == 1
    assert c.ssh_run("cat /root/marker")[1] == "kept\n"
    assert c.ssh_run("systemctl is-system-running")[1].strip() == "running"


def test_missing_device_node_is_really_missing(boot_containers: BootContainers) -> None:
    partial, cpu_only = boot_containers(
        ContainerSpec(scenario="rtx-pro-6000-x4", missing_devices={"nvidia-uvm"}),
        ContainerSpec(scenario=None),
    )

    assert partial.ssh_run("test -e /dev/nvidia-uvm")[0] == 1
    assert partial.ssh_run("test -c /dev/nvidia3 && test -c /dev/nvidiactl")[0] == 0
    assert partial.ssh_run("test -e /dev/nvidia4")[0] == 1
    rc, _, err = cpu_only.ssh_run("ls /dev/nvidia* ; command -v nvidia-smi")
    assert rc != 0, err


def test_snapshot_detects_changes(boot_containers: BootContainers) -> None:
    (c,) = boot_containers(ContainerSpec(extra_files={"/opt/app/config.yaml": "a: 1\n"}))
    before = c.snapshot(["/etc/systemd/system", "/opt", "/dev/shm"])
    assert before["/opt/app"] == "dir"
    assert c.snapshot(["/etc/systemd/system", "/opt", "/dev/shm"]) == before

    c.ssh_run("echo 'a: 2' > /opt/app/config.yaml")

    after = c.snapshot(["/etc/systemd/system", "/opt", "/dev/shm"])
    assert {k for k in after if after[k] != before.get(k)} == {"/opt/app/config.yaml"}
