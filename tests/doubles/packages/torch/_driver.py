"""TEST DOUBLE of what torch learns from libcuda: the driver's CUDA version and the GPUs.

The testbed has no libcuda; its nvidia-smi double (tests/doubles/nvidia-smi) replays a captured
host, so this asks it what the real libcuda would answer: the banner's "CUDA Version" (what
cuDriverGetVersion reports) and each GPU's compute capability.

The driver opens its device nodes read-write as the calling user (libcuda opens /dev/nvidiactl,
/dev/nvidia-uvm and each /dev/nvidiaN); `nodes_denied` is that open, and a node this user may
not open makes cuInit fail with CUDA_ERROR_UNKNOWN (999), as a user without access to the nodes
sees it ("failed call to cuInit: CUDA_ERROR_UNKNOWN" as non-root, tensorflow/tensorflow#7653).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from functools import cache


def _run(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


@cache
def cuda_version() -> tuple[int, int] | None:
    """The driver's CUDA version, (12, 8); None without a working driver."""
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", _run() or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


@cache
def capabilities() -> list[tuple[int, int]]:
    out = _run("--query-gpu=compute_cap", "--format=csv,noheader") or ""
    caps = []
    for line in out.splitlines():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            caps.append((int(major), int(minor)))
    return caps


DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


def nodes_denied() -> list[str]:
    """The device nodes this user may not open read-write (missing nodes are not denied)."""
    denied = []
    for node in [*DRIVER_NODES, *sorted(glob.glob("/dev/nvidia[0-9]*"))]:
        try:
            os.close(os.open(node, os.O_RDWR))
        except FileNotFoundError:
            continue
        except PermissionError:
            denied.append(node)
    return denied
