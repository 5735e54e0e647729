"""TEST DOUBLE of torch.cuda: as real torch behaves with the host's driver.

- a GPU is visible when its device node /dev/nvidiaN exists (as in a container the GPUs are
  passed into) and CUDA_VISIBLE_DEVICES does not hide it;
- a build whose CUDA major is newer than the driver's is refused the way real torch refuses it:
  a UserWarning "CUDA initialization: The NVIDIA driver on your system is too old (found
  version 12080)..." and is_available() False (tests/fixtures/cuda-errors/SOURCE.md); a newer
  minor of the same major runs (CUDA minor-version compatibility);
- a device node the calling user cannot open read-write is cuInit's CUDA_ERROR_UNKNOWN (999,
  torch/_driver.py), which real torch reports from cudaGetDeviceCount as a UserWarning
  "CUDA initialization: Unexpected error from cudaGetDeviceCount()... Error 999: unknown
  error" and is_available() False (c10/cuda/CUDAFunctions.cpp, device_count_impl; the same
  text with error 801 in dusty-nv/jetson-containers#1136, a non-root user);
- get_arch_list() is the build's list, empty when CUDA is not available, as in real torch.
"""

from __future__ import annotations

import glob
import os
import warnings

from torch import _driver
from torch._double_build import ARCH_LIST, CUDA

DEVICE_GLOB = "/dev/nvidia[0-9]*"
TOO_OLD = (
    "CUDA initialization: The NVIDIA driver on your system is too old (found version {found}). "
    "Please update your GPU driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to "
    "install a PyTorch version that has been compiled with your version of the CUDA driver."
)
NO_DRIVER = "CUDA initialization: Found no NVIDIA driver on your system."
UNEXPECTED = (
    "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
    "functions before calling NumCudaDevices() that might have already set an error? Error "
    "999: unknown error"
)


def _nodes() -> list[str]:
    return sorted(glob.glob(DEVICE_GLOB))


def _driver_ok() -> bool:
    # First the nodes: cuInit opens them as this user before anything else can answer.
    if _driver.nodes_denied():
        warnings.warn(UNEXPECTED, stacklevel=3)
        return False
    driver = _driver.cuda_version()
    if driver is None:
        warnings.warn(NO_DRIVER, stacklevel=3)
        return False
    build_major = int(CUDA.split(".")[0])
    if driver[0] < build_major:
        warnings.warn(TOO_OLD.format(found=driver[0] * 1000 + driver[1] * 10), stacklevel=3)
        return False
    return True


def is_available() -> bool:
    if not _nodes() or os.environ.get("CUDA_VISIBLE_DEVICES", "x") == "":
        return False
    return _driver_ok()


def device_count() -> int:
    return len(_nodes()) if is_available() else 0


def get_arch_list() -> list[str]:
    return list(ARCH_LIST) if is_available() else []


def get_device_capability(index: int = 0) -> tuple[int, int]:
    caps = _driver.capabilities()
    if not is_available() or index >= min(len(caps), device_count()):
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {index})")
    return caps[index]


def synchronize(index: int = 0) -> None:
    get_device_capability(index)
