"""The real CT200's GPU nodes, played: who can open them, in which sandbox (issue 27).

One container behaves like an unprivileged Proxmox guest whose `devN` entries name no mode: a
user namespace (systemd-nspawn --private-users) and GPU nodes that are real character devices,
0660, owned by the container's root (pve-container's create_passthrough_device_node). Root's
nvidia-smi answers there, so only a check as the service user can see that no rank could open
a GPU. The deploy is refused by name before anything is installed; the same container with the
nodes made 0666 (what `pct set CTID --devN /dev/nvidiaK,mode=0666` gives) passes the gate, its
sandbox probe works in the user namespace, and the plan says that no device filter holds there.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import testbed as tb
from tests.e2e.test_preflight import (
    GOOD_DATA,
    MODEL_FILES,
    assert_passed_gate,
    deploy,
    panel,
    refusal,
    snapshot,
    went_on,
)
from tests.testbed import Container, ContainerSpec

DOUBLES = Path(__file__).resolve().parent.parent / "doubles" / "packages"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def locked(testbed: tb.Testbed) -> Iterator[Container]:
    (c,) = testbed.boot(
        ContainerSpec(gpu_node_mode=0o660, private_users=True, extra_files=MODEL_FILES)
    )
    try:
        yield c
    finally:
        testbed.destroy(c)


def test_the_container_is_what_it_plays(locked: Container) -> None:
    # Its root is an unprivileged uid of this machine, and its nodes are 0660 char devices of
    # the container's root, not binds of /dev/null.
    _, uid_map, _ = locked.ssh_run("cat /proc/self/uid_map")
    assert uid_map.split() == ["0", str(locked.uid_base), "65536"], uid_map
    _, nodes, _ = locked.ssh_run("stat -c '%n %F %u:%g %a' /dev/nvidiactl /dev/nvidia0")
    assert nodes.splitlines() == [
        "/dev/nvidiactl character special file 0:0 660",
        "/dev/nvidia0 character special file 0:0 660",
    ], nodes


def test_root_opens_the_nodes_the_service_user_cannot(locked: Container) -> None:
    # The failure, played: root's nvidia-smi answers, a plain user's fails as NVML fails.
    rc, out, _ = locked.ssh_run("nvidia-smi -L")
    assert rc == 0 and out.startswith("GPU 0:"), out
    rc, out, _ = locked.ssh_run("setpriv --reuid=nobody --regid=nogroup --clear-groups nvidia-smi")
    assert (rc, out) == (4, "Failed to initialize NVML: Insufficient Permissions\n")


def test_the_cuda_doubles_fail_for_a_user_who_cannot_open_the_nodes(locked: Container) -> None:
    # The torch and CUDA driver doubles, as the engine check would import them: as root they
    # see the GPUs; as a user the nodes refuse, cuInit is 999 and torch warns as real torch does.
    where = locked.root / "srv" / "doubles"
    for package in ("torch", "cuda"):
        shutil.copytree(DOUBLES / package, where / package, dirs_exist_ok=True)
    (where / "torch" / "_double_build.py").write_text(
        'VERSION = "2.11.0+cu128"\nCUDA = "12.8"\nARCH_LIST = ["sm_120"]\n'
    )
    (where / "probe.py").write_text(
        "import warnings\nwarnings.simplefilter('always')\nimport torch\n"
        "from cuda.bindings import driver\n"
        "print(torch.cuda.is_available(), int(driver.cuInit(0)[0]))\n"
    )
    command = "cd /srv/doubles && python3 probe.py"
    rc, out, err = locked.ssh_run(command)
    assert (rc, out) == (0, "True 0\n"), err
    rc, out, err = locked.ssh_run(
        "cd /srv/doubles && setpriv --reuid=nobody --regid=nogroup --clear-groups python3 probe.py"
    )
    assert (rc, out) == (0, "False 999\n"), err
    assert "Unexpected error from cudaGetDeviceCount()" in err and "Error 999" in err, err


def test_0660_root_nodes_are_refused_by_name_before_anything_changes(
    locked: Container, tmp_path: Path
) -> None:
    locked.ssh_run("chmod 0660 /dev/nvidia* && chown 0:0 /dev/nvidia*")
    before = snapshot(locked)

    run = deploy(tmp_path, {locked: GOOD_DATA})

    assert run.rc != 0, run.output
    shown = panel(run, locked)
    assert f"{locked.name}: refused" in shown, run.output
    logged = refusal(run, locked)
    for text in (
        "GPU access",
        "/dev/nvidiactl (owner 0:0, mode 0660)",
        "/dev/nvidia-uvm (owner 0:0, mode 0660)",
        "/dev/nvidia7 (owner 0:0, mode 0660)",
        "pct set CTID --devN /dev/nvidia0,mode=0666",
    ):
        assert text in logged, f"{text!r} not in the refusal:\n{run.output}"
    # The sandbox itself works in this user-namespaced container: no NAMESPACE refusal.
    assert "rank sandbox" not in logged, run.output
    assert not went_on(run, locked), run.output
    assert snapshot(locked) == before
    _, out, _ = locked.ssh_run("ls /etc/systemd/system | grep -c '^sglang@' || true")
    assert out.strip() == "0", out


def test_0666_nodes_pass_and_the_plan_says_no_filter_holds(
    locked: Container, tmp_path: Path
) -> None:
    locked.ssh_run("chmod 0666 /dev/nvidia*")
    try:
        run = deploy(tmp_path, {locked: GOOD_DATA}, "--dry")
    finally:
        locked.ssh_run("chmod 0660 /dev/nvidia*")

    assert f"{locked.name}: ready" in panel(run, locked), run.output
    # This testbed's systemd cannot attach device filters (no delegated devices controller),
    # and says nothing about it: the probe's open of /dev/nvidia1 under rank 0's DeviceAllow=
    # is what tells.
    assert "every rank can open every GPU" in run.output, run.output


def probes_started(c: Container) -> int:
    _, out, _ = c.ssh_run(
        "journalctl -o cat --no-pager | grep -c 'sglang-deploy-gpu-probe-.*Deactivated'"
    )
    return int(out.strip() or 0)


def test_0666_nodes_go_on_past_the_gate_and_a_rerun_starts_no_probe(
    locked: Container, tmp_path: Path
) -> None:
    locked.ssh_run("chmod 0666 /dev/nvidia*")
    try:
        run = deploy(tmp_path, {locked: GOOD_DATA})
        started = probes_started(locked)
        again = deploy(tmp_path, {locked: GOOD_DATA}, "--dry")
        started_again = probes_started(locked)
    finally:
        locked.ssh_run("chmod 0660 /dev/nvidia*")
    assert_passed_gate(run, locked)
    assert started >= 1
    # Nothing about the nodes, the user or the probe changed: its result was kept (under
    # /run, until the next boot), and the same verdict came without a unit.
    assert started_again == started, again.output
    assert f"{locked.name}: ready" in panel(again, locked), again.output
