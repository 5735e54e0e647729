"""TEST DOUBLE of cuda-python's `cuda.bindings.driver`: the CUDA driver API calls the engine check
makes (operations/programs/engine_check.py run_kernel), on the GPUs as the testbed shows them.

Like the real bindings, every call returns a tuple whose first item is a CUresult (values and
cuGetErrorString texts from cuda.h's `enum cudaError_enum`), then its outputs; pointers are
passed as ints (addresses), as cuda-python accepts them.

- The driver is the nvidia-smi double's (tests/doubles/nvidia-smi replays a captured host), as
  for the torch double (tests/doubles/packages/torch/_driver.py): no working nvidia-smi means
  no libcuda, and cuInit raises RuntimeError("Failed to dlopen libcuda.so.1") as cuda-python's
  loader does when the driver library is absent; no /dev/nvidiaN node (or
  CUDA_VISIBLE_DEVICES="") is CUDA_ERROR_NO_DEVICE; an ordinal past the GPUs,
  CUDA_ERROR_INVALID_DEVICE; any call before cuInit, CUDA_ERROR_NOT_INITIALIZED.
- cuInit opens /dev/nvidiactl, /dev/nvidia-uvm and each /dev/nvidiaN read-write as the calling
  user, as libcuda does; a node it may not open is CUDA_ERROR_UNKNOWN (999, "unknown error"):
  what a user without access to the nodes gets ("failed call to cuInit: CUDA_ERROR_UNKNOWN",
  tensorflow/tensorflow#7653).
- cuModuleLoadData reads a cubin as a driver does, from its ELF header (tests/doubles/nvcc
  writes one, and so does the real nvcc 13.0.88 in the cu130 lane's e2e test): not an ELF of
  e_machine 190 (EM_CUDA) is CUDA_ERROR_INVALID_IMAGE; an SM the GPU cannot run (another major,
  or a newer minor: cubins run on the same major at an equal or newer minor) is
  CUDA_ERROR_NO_BINARY_FOR_GPU ("no kernel image is available for execution on the device");
  its functions are its `.text.<name>` sections (cuModuleGetFunction: CUDA_ERROR_NOT_FOUND).
- Device memory is host memory behind made-up device addresses. A GPU double cannot execute
  machine code: cuLaunchKernel runs a Python model of each kernel it knows by name (KERNELS:
  the engine check's `sglang_deploy_twice`, x[threadIdx.x] *= 2.0f) and refuses any other.
"""

from __future__ import annotations

import ctypes
import enum
import glob
import os
import re
import struct
import subprocess
from collections.abc import Callable
from functools import cache
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_UNKNOWN = 999


_STRINGS = {
    CUresult.CUDA_SUCCESS: "no error",
    CUresult.CUDA_ERROR_INVALID_VALUE: "invalid argument",
    CUresult.CUDA_ERROR_NOT_INITIALIZED: "initialization error",
    CUresult.CUDA_ERROR_NO_DEVICE: "no CUDA-capable device is detected",
    CUresult.CUDA_ERROR_INVALID_DEVICE: "invalid device ordinal",
    CUresult.CUDA_ERROR_INVALID_IMAGE: "device kernel image is invalid",
    CUresult.CUDA_ERROR_INVALID_CONTEXT: "invalid device context",
    CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU: "no kernel image is available for execution on the "
    "device",
    CUresult.CUDA_ERROR_INVALID_HANDLE: "invalid resource handle",
    CUresult.CUDA_ERROR_NOT_FOUND: "named symbol not found",
    CUresult.CUDA_ERROR_UNKNOWN: "unknown error",
}


class _Handle:
    """CUdevice, CUcontext, CUmodule, CUfunction, CUdeviceptr: int() gives the value."""

    def __init__(self, value: int = 0) -> None:
        self._value = int(value)

    def __int__(self) -> int:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and int(other) == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUmodule(_Handle):
    pass


class CUfunction(_Handle):
    pass


class CUdeviceptr(_Handle):
    pass


# -- the GPUs, as the testbed's nvidia-smi double and device nodes show them ----------------

DEVICE_GLOB = "/dev/nvidia[0-9]*"  # as torch's double: a container's passed-in GPUs


def _smi(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


@cache
def _driver_loaded() -> bool:
    return re.search(r"CUDA Version:\s*\d+\.\d+", _smi() or "") is not None


@cache
def _capabilities() -> tuple[tuple[int, int], ...]:
    found = []
    for line in (_smi("--query-gpu=compute_cap", "--format=csv,noheader") or "").splitlines():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append((int(major), int(minor)))
    return tuple(found)


def _visible() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x") == "":
        return 0
    return min(len(glob.glob(DEVICE_GLOB)), len(_capabilities()))


def _nodes_denied() -> list[str]:
    denied = []
    for node in ["/dev/nvidiactl", "/dev/nvidia-uvm", *sorted(glob.glob(DEVICE_GLOB))]:
        try:
            os.close(os.open(node, os.O_RDWR))
        except FileNotFoundError:
            continue
        except PermissionError:
            denied.append(node)
    return denied


# -- state ----------------------------------------------------------------------------------

_initialised = False
_current: int | None = None  # the device of the current context
_modules: dict[int, tuple[int, dict[str, int]]] = {}  # module -> (SM, function -> handle)
_functions: dict[int, str] = {}
_memory: dict[int, bytearray] = {}  # device address -> its bytes
_next = [0x7F0000000000]


def _new(size: int = 0x1000) -> int:
    _next[0] += max(size, 0x1000)
    return _next[0]


def _device_bytes(address: int) -> tuple[bytearray, int] | None:
    for start, data in _memory.items():
        if start <= address < start + len(data):
            return data, address - start
    return None


def cuGetErrorString(error: CUresult) -> tuple[CUresult, bytes]:
    if error not in _STRINGS:
        return CUresult.CUDA_ERROR_INVALID_VALUE, b""
    return CUresult.CUDA_SUCCESS, _STRINGS[CUresult(error)].encode()


def cuInit(flags: int) -> tuple[CUresult]:
    global _initialised
    # First the nodes: libcuda loads for any user, opening the nodes is what fails (and the
    # nvidia-smi double this one asks fails for that user too).
    if _nodes_denied():
        return (CUresult.CUDA_ERROR_UNKNOWN,)
    if not _driver_loaded():
        raise RuntimeError("Failed to dlopen libcuda.so.1")
    if _visible() == 0:
        return (CUresult.CUDA_ERROR_NO_DEVICE,)
    _initialised = True
    return (CUresult.CUDA_SUCCESS,)


def cuDeviceGetCount() -> tuple[CUresult, int]:
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, 0
    return CUresult.CUDA_SUCCESS, _visible()


def cuDeviceGet(ordinal: int) -> tuple[CUresult, CUdevice]:
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, CUdevice()
    if not 0 <= ordinal < _visible():
        return CUresult.CUDA_ERROR_INVALID_DEVICE, CUdevice()
    return CUresult.CUDA_SUCCESS, CUdevice(ordinal)


def cuDevicePrimaryCtxRetain(dev: CUdevice) -> tuple[CUresult, CUcontext]:
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, CUcontext()
    if not 0 <= int(dev) < _visible():
        return CUresult.CUDA_ERROR_INVALID_DEVICE, CUcontext()
    return CUresult.CUDA_SUCCESS, CUcontext(0x1000 + int(dev))


def cuDevicePrimaryCtxRelease(dev: CUdevice) -> tuple[CUresult]:
    if not _initialised:
        return (CUresult.CUDA_ERROR_NOT_INITIALIZED,)
    return (CUresult.CUDA_SUCCESS,)


def cuCtxSetCurrent(ctx: CUcontext) -> tuple[CUresult]:
    global _current
    if not _initialised:
        return (CUresult.CUDA_ERROR_NOT_INITIALIZED,)
    if not 0 <= int(ctx) - 0x1000 < _visible():
        return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
    _current = int(ctx) - 0x1000
    return (CUresult.CUDA_SUCCESS,)


def cuCtxSynchronize() -> tuple[CUresult]:
    return (CUresult.CUDA_SUCCESS if _current is not None else CUresult.CUDA_ERROR_INVALID_CONTEXT,)


def _image(image: Any) -> bytes | None:
    """The cubin's bytes: a buffer, or an address whose ELF header says how long it is."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if not isinstance(image, int) or image == 0:
        return None
    header = ctypes.string_at(image, 64)
    if header[:4] != b"\x7fELF":
        return header
    phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
    return ctypes.string_at(image, max(64, phoff + phentsize * phnum, shoff + shentsize * shnum))


def _parse_cubin(data: bytes) -> tuple[int, list[str]] | None:
    """(SM, function names) of a CUDA ELF; None when it is not one."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or struct.unpack_from("<H", data, 18)[0] != 190:
        return None
    (flags,) = struct.unpack_from("<I", data, 0x30)
    # ABI version 8 (CUDA 12.8 on) keeps the SM in bits 8-15, earlier ones in bits 0-7.
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    functions = []
    for section in sections:
        start = names_at + section[0]
        name = data[start : data.index(b"\0", start)].decode()
        if name.startswith(".text."):
            functions.append(name[len(".text.") :])
    return sm, functions


def cuModuleLoadData(image: Any) -> tuple[CUresult, CUmodule]:
    if _current is None:
        return CUresult.CUDA_ERROR_INVALID_CONTEXT, CUmodule()
    data = _image(image)
    parsed = _parse_cubin(data) if data is not None else None
    if parsed is None:
        return CUresult.CUDA_ERROR_INVALID_IMAGE, CUmodule()
    sm, functions = parsed
    major, minor = _capabilities()[_current]
    if sm // 10 != major or sm % 10 > minor:
        return CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, CUmodule()
    handle = _new()
    names = {name: _new() for name in functions}
    _modules[handle] = (sm, names)
    _functions.update({h: name for name, h in names.items()})
    return CUresult.CUDA_SUCCESS, CUmodule(handle)


def cuModuleGetFunction(hmod: CUmodule, name: bytes) -> tuple[CUresult, CUfunction]:
    if int(hmod) not in _modules:
        return CUresult.CUDA_ERROR_INVALID_HANDLE, CUfunction()
    found = _modules[int(hmod)][1].get(name.decode())
    if found is None:
        return CUresult.CUDA_ERROR_NOT_FOUND, CUfunction()
    return CUresult.CUDA_SUCCESS, CUfunction(found)


def cuModuleUnload(hmod: CUmodule) -> tuple[CUresult]:
    if _modules.pop(int(hmod), None) is None:
        return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
    return (CUresult.CUDA_SUCCESS,)


def cuMemAlloc(bytesize: int) -> tuple[CUresult, CUdeviceptr]:
    if _current is None:
        return CUresult.CUDA_ERROR_INVALID_CONTEXT, CUdeviceptr()
    address = _new(bytesize)
    _memory[address] = bytearray(bytesize)
    return CUresult.CUDA_SUCCESS, CUdeviceptr(address)


def cuMemFree(dptr: CUdeviceptr) -> tuple[CUresult]:
    if _memory.pop(int(dptr), None) is None:
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    return (CUresult.CUDA_SUCCESS,)


def cuMemcpyHtoD(dstDevice: CUdeviceptr, srcHost: int, ByteCount: int) -> tuple[CUresult]:
    found = _device_bytes(int(dstDevice))
    if found is None or found[1] + ByteCount > len(found[0]):
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    data, at = found
    data[at : at + ByteCount] = ctypes.string_at(srcHost, ByteCount)
    return (CUresult.CUDA_SUCCESS,)


def cuMemcpyDtoH(dstHost: int, srcDevice: CUdeviceptr, ByteCount: int) -> tuple[CUresult]:
    found = _device_bytes(int(srcDevice))
    if found is None or found[1] + ByteCount > len(found[0]):
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    data, at = found
    ctypes.memmove(dstHost, bytes(data[at : at + ByteCount]), ByteCount)
    return (CUresult.CUDA_SUCCESS,)


def _twice(params: int, block_x: int) -> CUresult:
    """extern "C" __global__ void sglang_deploy_twice(float *x) { x[threadIdx.x] *= 2.0f; }"""
    pointer = ctypes.c_uint64.from_address(ctypes.c_void_p.from_address(params).value or 0).value
    found = _device_bytes(pointer)
    if found is None or found[1] + 4 * block_x > len(found[0]):
        return CUresult.CUDA_ERROR_INVALID_VALUE  # the real one faults: illegal address
    data, at = found
    values = struct.unpack_from(f"<{block_x}f", data, at)
    struct.pack_into(f"<{block_x}f", data, at, *(v * 2.0 for v in values))
    return CUresult.CUDA_SUCCESS


KERNELS: dict[str, Callable[[int, int], CUresult]] = {"sglang_deploy_twice": _twice}


def cuLaunchKernel(
    f: CUfunction,
    gridDimX: int,
    gridDimY: int,
    gridDimZ: int,
    blockDimX: int,
    blockDimY: int,
    blockDimZ: int,
    sharedMemBytes: int,
    hStream: Any,
    kernelParams: int,
    extra: Any,
) -> tuple[CUresult]:
    name = _functions.get(int(f))
    if name is None:
        return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
    if name not in KERNELS:
        raise NotImplementedError(f"TEST DOUBLE: no model of kernel {name} to run")
    if (gridDimX, gridDimY, gridDimZ, blockDimY, blockDimZ) != (1, 1, 1, 1, 1):
        raise NotImplementedError("TEST DOUBLE: runs one block of blockDimX threads only")
    return (KERNELS[name](int(kernelParams), blockDimX),)
