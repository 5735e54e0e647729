"""TEST DOUBLE: canned answers that make pyinfra's @fake connector look like CT200's Proxmox node,
for `make pve-demo` (inventory/pve_demo.py). Nothing is contacted.

Each answer is keyed by a piece of one fact's own command (operations/facts/pve.py) and built
from the fixtures of tests/fixtures/pve (see SOURCE.md there): Proxmox VE 8.1 (pve-container
5.0.8, devN entries), the 8-GPU host's /proc/devices, driver 570.172.08 (CT200's, 570 lane),
a container 200 as Proxmox made it before any GPU (memory 512, swap 512), running, with the
model mounted, and a node without the UVM boot unit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pve"
MODULE = "570.172.08"
GPUS = 8
MEMTOTAL_KB = 1_056_000_000  # a node with ~1 TiB of memory
MODEL_BYTES = 53_800_000_000

CONFIG = [
    "arch: amd64",
    "cores: 64",
    "hostname: ct200",
    "memory: 512",
    "mp0: /mnt/models,mp=/mnt/models",
    "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5A:00:01,ip=dhcp,type=veth",
    "ostype: debian",
    "rootfs: local-lvm:vm-200-disk-0,size=256G",
    "swap: 512",
    "unprivileged: 1",
]


def fake_responses() -> dict[str, Any]:
    """fake_responses host data for pyinfra's @fake connector (substring matchers, first match
    wins: GuestDriver's command also holds "pct status", so it comes first)."""
    gpus = [f"/dev/nvidia{i}" for i in range(GPUS)]
    nodes = [*gpus, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    devices = (FIXTURES / "proc-devices.txt").read_text().splitlines()
    return {
        "pveversion -v": (FIXTURES / "pveversion-8.1.txt").read_text().splitlines(),
        "/sys/module/nvidia/version": [f"@@sys={MODULE}"],
        "cat /proc/devices": [*(f"@@node={n}" for n in nodes), *devices],
        "@@memtotal": [
            f"@@memtotal={MEMTOTAL_KB}",
            "@@running",
            f"/usr/lib/x86_64-linux-gnu/libcuda.so.{MODULE}",
            f"@@model={MODEL_BYTES}",
        ],
        "@@kind=ct; pct config": ["@@kind=ct", *CONFIG],
        "pct status": ["status: running"],
        "@@modprobe": ["@@enabled=", "@@active=inactive", "@@modprobe=/usr/bin/nvidia-modprobe"],
    }
