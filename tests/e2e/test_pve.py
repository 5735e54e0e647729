"""pve.py end to end: the real `pyinfra -y INVENTORY pve.py` over real SSH against one testbed
container playing a Proxmox node.

The node is a double (tests/doubles/pct, tests/doubles/pveversion): /etc/pve/lxc/CTID.conf files
that `pct` reads and writes with Proxmox's syntax, a `pct start` that refuses a missing devN path
as pve-container's prestart hook does, UVM nodes that exist only after the nvidia-modprobe double
ran, and a pve-guests.service double that starts container 200 (a node boot, played by hand).
The node's /proc/devices (the simulated node's capture, operations/simulated/captured/pve_node)
and /proc/driver/nvidia/version (tests/fixtures/pve) are bound over the container's own /proc,
so the facts run their real commands.
GPU device nodes are /dev/null binds, as in every testbed container. One container serves the
whole module; each test writes the container configs it starts from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations.simulated import pve_node
from tests import testbed as tb
from tests.e2e.deploying import REPO, Run, run_deploy
from tests.e2e.https_server import HttpsFiles
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

DOUBLES = REPO / "tests" / "doubles"
FIXTURES = REPO / "tests" / "fixtures" / "pve"
RUN_TIMEOUT_S = 300
SNAPSHOT = ("/etc/pve", "/var/lib/pct-double")

MODULE = "565.57.01"
GPUS = ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]
NODES = [*GPUS, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
MODEL = "/srv/models/tiny"
DRIVER_DIR = "/srv/driver"

# What Proxmox would have written for a container without GPUs: pct's canonical order
# (#description, sorted keys, lxc.* lines, then sections), and a snapshot.
BARE_MAIN = """#GPU inference container
arch: amd64
cores: 16
features: nesting=1
hostname: ct{ctid}
memory: 512
mp0: /mnt/models,mp=/mnt/models
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5A:00:01,ip=dhcp,type=veth
ostype: debian
parent: before-gpus
rootfs: local-lvm:vm-{ctid}-disk-0,size=64G
unprivileged: 1
lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file
"""
SNAPSHOT_SECTION = """[before-gpus]
arch: amd64
cores: 16
hostname: ct{ctid}
memory: 512
ostype: debian
rootfs: local-lvm:vm-{ctid}-disk-0,size=64G
snaptime: 1764547200
"""


def bare(ctid: int) -> str:
    return BARE_MAIN.format(ctid=ctid) + "\n" + SNAPSHOT_SECTION.format(ctid=ctid)


def unrelated(ctid: int) -> list[str]:
    """The main section's lines pve.py does not own."""
    return [ln for ln in BARE_MAIN.format(ctid=ctid).splitlines() if not ln.startswith("memory:")]


@pytest.fixture(scope="module")
def node(testbed: tb.Testbed) -> Iterator[Container]:
    files: dict[str, Any] = {
        "/usr/local/sbin/pct": ((DOUBLES / "pct").read_text(), 0o755),
        "/usr/local/bin/lxc-info": ((DOUBLES / "lxc-info").read_text(), 0o755),
        "/usr/local/bin/pveversion": ((DOUBLES / "pveversion").read_text(), 0o755),
        "/usr/bin/nvidia-modprobe": ((DOUBLES / "nvidia-modprobe").read_text(), 0o755),
        "/etc/systemd/system/pve-guests.service": (DOUBLES / "pve-guests.service").read_text(),
        "/etc/pve-double/pveversion.txt": (pve_node.CAPTURED / "pveversion-8.1.txt").read_text(),
        "/srv/pve-double/driver/nvidia/version": (
            FIXTURES / "nvidia-version-open-565.txt"
        ).read_text(),
        "/srv/pve-double/devices": (pve_node.CAPTURED / "proc-devices.txt").read_text(),
        "/etc/pve/qemu-server/101.conf": "boot: order=scsi0\nmemory: 4096\n",
        "/var/lib/pct-double/200.running": "",
        f"{MODEL}/config.json": '{"architectures": ["Qwen3_5ForConditionalGeneration"]}',
        f"{MODEL}/model-00001-of-00001.safetensors": bytes(range(256)) * 16,
        f"{DRIVER_DIR}/NVIDIA-Linux-x86_64-{MODULE}.run": (
            (DOUBLES / "nvidia-installer.run").read_text(),
            0o755,
        ),
    }
    (container,) = testbed.boot(
        ContainerSpec(
            scenario=None,
            devices=NODES,
            extra_files=files,
            binds=("/srv/pve-double/driver:/proc/driver", "/srv/pve-double/devices:/proc/devices"),
        )
    )
    try:
        yield container
    finally:
        testbed.destroy(container)


def ssh(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{c.name}: {cmd}: rc {rc}\n{out}\n{err}"
    return out


def write_config(c: Container, ctid: int, text: str) -> None:
    path = c.root / f"etc/pve/lxc/{ctid}.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def read_config(c: Container, ctid: int) -> str:
    return (c.root / f"etc/pve/lxc/{ctid}.conf").read_text()


def reboots(c: Container) -> list[str]:
    log = c.root / "var/log/pct-double.log"
    return log.read_text().splitlines() if log.exists() else []


def pve(tmp_path: Path, c: Container, data: dict[str, Any], *args: str) -> Run:
    settings = {"pve_ctid": 200, "model_source": MODEL, "gpu_count": 4, "dp_size": 1}
    settings |= {"ram_per_rank_gb": 1, **data}
    return run_deploy(tmp_path, {c: settings}, *args, deploy_file="pve.py", timeout=RUN_TIMEOUT_S)


# tiny model (4 KiB) + 1 rank x 1 GiB, so that pve-container's memory.high (1016/1024 of the
# memory below 16 GiB, Config.pm calculate_memory_constraints) still holds it, in whole MiB:
# preflight.memory_needed.
MEMORY_MIB = 1033
UNIT = "nvidia-uvm-nodes.service"


def test_bare_config_converges_keeps_other_lines_and_second_run_changes_nothing(
    node: Container, tmp_path: Path
) -> None:
    write_config(node, 200, bare(200))
    before = node.snapshot(SNAPSHOT)
    dry = pve(tmp_path, node, {}, "--dry")
    assert dry.rc == 0, dry.output
    # One option a line, as a shell command continued with backslashes (80 columns).
    assert "pct set 200 \\" in dry.output and "--dev0 /dev/nvidia0,mode=0666" in dry.output
    assert node.snapshot(SNAPSHOT) == before, "--dry changed the node"

    run = pve(tmp_path, node, {})
    assert run.rc == 0, run.output
    text = read_config(node, 200)
    main, _, section = text.partition("\n[before-gpus]\n")
    lines = main.splitlines()
    for i, name in enumerate(NODES):
        assert f"dev{i}: /dev/{name},mode=0666" in lines, text
    assert f"memory: {MEMORY_MIB}" in lines and "swap: 0" in lines, text
    # Every line pve.py does not own survives byte for byte, in its order; the snapshot too.
    kept = [ln for ln in lines if ln in unrelated(200)]
    assert kept == unrelated(200), text
    assert "[before-gpus]\n" + section == SNAPSHOT_SECTION.format(ctid=200)
    # The container runs: the config change waits for a restart the user did not ask for.
    assert "pct reboot 200" in run.output and reboots(node) == []
    assert f"needs NVIDIA user space {MODULE} exactly" in run.output

    converged = node.snapshot(SNAPSHOT)
    again = pve(tmp_path, node, {})
    assert again.rc == 0, again.output
    assert again.status("config (GPUs, memory, swap)").startswith("No changes"), again.output
    assert again.status(UNIT).startswith("No changes"), again.output
    assert node.snapshot(SNAPSHOT) == converged
    assert "pct reboot 200" not in again.output


def test_restart_only_with_the_per_run_opt_in(node: Container, tmp_path: Path) -> None:
    write_config(node, 200, bare(200))
    run = pve(tmp_path, node, {"pve_restart": True})
    assert run.rc == 0, run.output
    assert [ln.split()[1:] for ln in reboots(node)] == [["reboot", "200"]]
    again = pve(tmp_path, node, {"pve_restart": True})
    assert again.rc == 0 and len(reboots(node)) == 1, again.output


def test_before_pve_8_1_raw_lxc_lines_with_the_node_majors(node: Container, tmp_path: Path) -> None:
    fixture = node.root / "etc/pve-double/pveversion.txt"
    fixture.write_text((FIXTURES / "pveversion-7.4.txt").read_text())
    try:
        # nvidia-uvm's major of an earlier driver (505: no driver holds it in /proc/devices).
        stale = "lxc.cgroup2.devices.allow: c 505:* rwm"
        write_config(
            node, 201, bare(201).replace("bind,create=file\n", f"bind,create=file\n{stale}\n", 1)
        )
        run = pve(tmp_path, node, {"pve_ctid": 201})
        assert run.rc == 0, run.output
        text = read_config(node, 201)
        main, _, section = text.partition("\n[before-gpus]\n")
        kept = [ln for ln in main.splitlines() if ln in unrelated(201)]
        assert kept == unrelated(201), text
        # nvidia-frontend and nvidia-uvm majors of the captured /proc/devices: the GPUs one minor
        # each (195:N) and nvidiactl (195:255), never c 195:*, which would allow every GPU of
        # the node.
        for line in (
            *(f"lxc.cgroup2.devices.allow: c 195:{n} rwm" for n in range(len(GPUS))),
            "lxc.cgroup2.devices.allow: c 195:255 rwm",
            "lxc.cgroup2.devices.allow: c 510:* rwm",
            "lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file",
            "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        ):
            assert line in main.splitlines(), text
        assert "dev0:" not in text
        assert "lxc.cgroup2.devices.allow: c 195:* rwm" not in text
        # Replaced, not kept beside the new major.
        assert stale not in text and text.count("c 510:* rwm") == 1, text
        assert "[before-gpus]\n" + section == SNAPSHOT_SECTION.format(ctid=201)
        converged = node.snapshot(SNAPSHOT)
        again = pve(tmp_path, node, {"pve_ctid": 201})
        assert again.rc == 0, again.output
        assert node.snapshot(SNAPSHOT) == converged
    finally:
        fixture.write_text((pve_node.CAPTURED / "pveversion-8.1.txt").read_text())


@pytest.mark.parametrize(
    ("data", "hide_module", "message"),
    [
        ({"pve_ctid": 999}, False, "no container 999 on this node"),
        ({"pve_ctid": 101}, False, "is a virtual machine"),
        ({}, True, "the node has no NVIDIA kernel module loaded"),
        ({"gpu_count": 8}, False, "gpu_count = 8 (set in the inventory entry of host"),
    ],
)
def test_bad_input_is_refused_and_nothing_changes(
    node: Container, tmp_path: Path, data: dict[str, Any], hide_module: bool, message: str
) -> None:
    write_config(node, 200, bare(200))
    before = node.snapshot(SNAPSHOT)
    version = node.root / "srv/pve-double/driver/nvidia/version"
    if hide_module:
        version.rename(version.with_suffix(".hidden"))
    try:
        run = pve(tmp_path, node, data)
    finally:
        if hide_module:
            version.with_suffix(".hidden").rename(version)
    assert run.rc != 0, run.output
    assert message in run.output, run.output
    assert "Traceback" not in run.output
    assert node.snapshot(SNAPSHOT) == before


def test_driver_user_space_installed_only_with_opt_in(node: Container, tmp_path: Path) -> None:
    write_config(node, 200, bare(200))
    lib = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{MODULE}"
    ssh(node, f"rm -f {lib}")
    installer = (DOUBLES / "nvidia-installer.run").read_bytes()
    name = f"NVIDIA-Linux-x86_64-{MODULE}.run"
    # https only: the installer is served over TLS by a CA the node (where curl runs) trusts.
    with HttpsFiles(tmp_path / "https", {name: installer}) as files:
        (node.root / "usr/local/share/ca-certificates/sglang-deploy-test.crt").write_text(
            files.ca_pem
        )
        ssh(node, "update-ca-certificates >/dev/null")
        data: dict[str, Any] = {
            "pve_driver_url": files.url("NVIDIA-Linux-x86_64-{version}.run"),
            "pve_driver_hashes": {MODULE: hashlib.sha256(installer).hexdigest()},
        }
        told = pve(tmp_path, node, data)
        assert told.rc == 0, told.output
        assert f"needs NVIDIA user space {MODULE} exactly" in told.output, told.output
        assert not (node.root / lib.lstrip("/")).exists()

        wrong = {**data, "pve_driver_hashes": {MODULE: "0" * 64}, "pve_install_driver": True}
        refused = pve(tmp_path, node, wrong)
        assert refused.rc != 0, refused.output
        assert not (node.root / lib.lstrip("/")).exists(), "an installer of another sha256 ran"

        run = pve(tmp_path, node, {**data, "pve_install_driver": True})
        assert run.rc == 0, run.output
        assert (node.root / lib.lstrip("/")).read_text().strip() == f"libcuda double {MODULE}"
        again = pve(tmp_path, node, {**data, "pve_install_driver": True})
        assert again.rc == 0, again.output
        assert f"user space is {MODULE}, the node module's version" in again.output
        assert again.status("NVIDIA user space") == "not run", again.output


def node_boot(c: Container) -> tuple[int, str]:
    """A node reboot as the container sees it: every unit stopped, the UVM nodes gone (nothing
    made them yet), container 200 stopped; then the boot's pve-guests.service starts it, after
    whatever units it wants and is ordered behind. Returns its rc and the pct double's log."""
    ssh(
        c,
        f"systemctl stop pve-guests.service {UNIT} 2>/dev/null; pct stop 200; "
        "for n in /dev/nvidia-uvm /dev/nvidia-uvm-tools; do "
        'umount "$n" 2>/dev/null; rm -f "$n"; done; : > /var/log/pct-double.log',
    )
    rc, _, _ = c.ssh_run("systemctl start pve-guests.service")
    return rc, (c.root / "var/log/pct-double.log").read_text()


def test_uvm_nodes_at_every_node_boot_and_gpu_nodes_the_service_user_can_open(
    node: Container, tmp_path: Path
) -> None:
    """The failure first: devN entries as an earlier pve.py wrote them (bare, no unit on the
    node). After a node boot the UVM nodes are gone and the prestart refuses the container.
    pve.py then installs and enables the boot unit and gives every entry mode=0666; after the
    next boot the container starts with nodes the service user can open; a re-run changes
    nothing."""
    old = [f"dev{i}: /dev/{name}" for i, name in enumerate(NODES)]
    write_config(node, 200, BARE_MAIN.format(ctid=200) + "\n".join(old) + "\nswap: 0\n")
    ssh(node, f"systemctl disable --now {UNIT} 2>/dev/null; rm -f /etc/systemd/system/{UNIT}")
    ssh(node, "systemctl daemon-reload")
    rc, log = node_boot(node)
    assert rc != 0, log
    assert "start 200 refused: Could not get mode or device ID of /dev/nvidia-uvm" in log, log
    assert "status: stopped" in ssh(node, "pct status 200")
    # What the user did by hand before: make the nodes once, start the container.
    ssh(node, "nvidia-modprobe -u -c=0 && pct start 200")
    devices = (node.root / "var/lib/pct-double/200.devices").read_text().splitlines()
    assert "/dev/nvidia0 0660 0 0" in devices, devices  # root's only: sglang cannot open it

    run = pve(tmp_path, node, {})
    assert run.rc == 0, run.output
    assert "dev0 " in run.output or "lack mode=0666" in run.output, run.output
    lines = read_config(node, 200).splitlines()
    for i, name in enumerate(NODES):
        assert f"dev{i}: /dev/{name},mode=0666" in lines, lines
    assert ssh(node, f"systemctl is-enabled {UNIT}").strip() == "enabled"
    assert "pve-guests.service" in ssh(node, f"systemctl show -p Before --value {UNIT}").split()

    rc, log = node_boot(node)
    assert rc == 0, log
    assert "status: running" in ssh(node, "pct status 200")
    assert ssh(node, "stat -c '%a %U' /dev/nvidia-uvm /dev/nvidia-uvm-tools").split() == [
        "666",
        "root",
        "666",
        "root",
    ]
    devices = (node.root / "var/lib/pct-double/200.devices").read_text().splitlines()
    assert devices == [f"/dev/{name} 0666 0 0" for name in NODES], devices

    again = pve(tmp_path, node, {})
    assert again.rc == 0, again.output
    assert again.status(UNIT).startswith("No changes"), again.output
    assert again.status("config (GPUs, memory, swap)").startswith("No changes"), again.output
