"""The simulated Proxmox node of CT200: what pyinfra's @fake connector answers for
inventory/pve_demo.py (`make pve-demo`). Nothing is contacted.

Each answer is keyed by a piece of one fact's own command (operations/facts/pve.py) and built
from captured/pve_node (see README.md there): Proxmox VE 8.1 (pve-container 5.0.8, devN
entries), the 8-GPU host's /proc/devices, driver 570.172.08 (CT200's, 570 lane), a container
200 as Proxmox made it before any GPU (memory 512, swap 512), running, with the model mounted,
and a node without the UVM boot unit.
"""

from __future__ import annotations

from pathlib import Path

CAPTURED = Path(__file__).resolve().parent / "captured" / "pve_node"
NODE = "pve1"  # the simulated node's name
MODULE = "570.172.08"
MEMTOTAL_KB = 1_056_000_000  # a node with ~1 TiB of memory
MODEL_BYTES = 53_800_000_000


def captured(name: str) -> list[str]:
    """The lines of captured/pve_node/`name`."""
    return (CAPTURED / name).read_text().splitlines()


def fake_responses() -> dict[str, list[str]]:
    """fake_responses host data for pyinfra's @fake connector (substring matchers, first match
    wins: GuestDriver's command also holds "pct status", so it comes first)."""
    nodes = captured("dev-nvidia.txt")
    return {
        "pveversion -v": captured("pveversion-8.1.txt"),
        "/sys/module/nvidia/version": [f"@@sys={MODULE}"],
        "cat /proc/devices": [*(f"@@node={n}" for n in nodes), *captured("proc-devices.txt")],
        "@@memtotal": [
            f"@@memtotal={MEMTOTAL_KB}",
            "@@running",
            f"/usr/lib/x86_64-linux-gnu/libcuda.so.{MODULE}",
            f"@@model={MODEL_BYTES}",
        ],
        "@@kind=ct; pct config": ["@@kind=ct", *captured("pct-config-200.txt")],
        "pct status": ["status: running"],
        "@@modprobe": ["@@enabled=", "@@active=inactive", "@@modprobe=/usr/bin/nvidia-modprobe"],
    }
