"""TEST DOUBLE of torch.cuda: a GPU is "available" when the device node /dev/nvidia0 exists
(as in a container the GPUs are passed into), and the architecture list is the build's."""

from __future__ import annotations

import glob
import os

from torch._double_build import ARCH_LIST

DEVICE_GLOB = "/dev/nvidia[0-9]*"


def _nodes() -> list[str]:
    return sorted(glob.glob(DEVICE_GLOB))


def is_available() -> bool:
    return bool(_nodes()) and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""


def device_count() -> int:
    return len(_nodes()) if is_available() else 0


def get_arch_list() -> list[str]:
    # The real torch returns [] when CUDA is not available.
    return list(ARCH_LIST) if is_available() else []
