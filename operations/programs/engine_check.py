"""The engine check, run with a new environment's own Python before `current` may point at it.

`python engine_check.py '<json>'` with {"packages": {project: module}, "gpu_count": N,
"cuda_home": DIR, "arch": "sm_120a"}: prints one line `@@probe {...}` holding what the
environment really is (installed versions, torch's CUDA build, each import, on each GPU its
capability and one small CUDA operation, and a small kernel compiled for `arch` with
CUDA_HOME's nvcc, as SGLang's and FlashInfer's JIT do, then loaded and run on each GPU
through the CUDA driver API of the environment's own cuda-python, `cuda.bindings.driver`).
operations/plan/engine_probe.py judges the result; this script only observes, so an import that
fails or a GPU that cannot run is reported, never raised. Only the standard library and the
environment's own packages: it runs inside the environment on the host.
"""

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from importlib import import_module, metadata
from typing import Any


def _error(exc: BaseException) -> str:
    # The last line of the traceback names the failing library (libcudart.so.13, ...).
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


KERNEL = 'extern "C" __global__ void sglang_deploy_twice(float *x) { x[threadIdx.x] *= 2.0f; }\n'


def compile_kernel(cuda_home: str, arch: str, work: str) -> tuple[str, bytes | None]:
    """The kernel as a cubin for `arch`, built the way the JIT builds run nvcc: CUDA_HOME set
    and its bin first on PATH (nvcc finds cicc, ptxas and the host compiler there)."""
    source = os.path.join(work, "twice.cu")
    cubin = os.path.join(work, "twice.cubin")
    with open(source, "w") as out:
        out.write(KERNEL)
    env = dict(os.environ, CUDA_HOME=cuda_home)
    env["PATH"] = os.path.join(cuda_home, "bin") + os.pathsep + env.get("PATH", "")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    try:
        run = subprocess.run(
            [nvcc, f"-arch={arch}", "-cubin", "-o", cubin, source],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{nvcc}: {exc}", None
    if run.returncode != 0 or not os.path.isfile(cubin):
        said = " / ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
        return f"{nvcc} -arch={arch} exited {run.returncode}: {said}", None
    with open(cubin, "rb") as handle:
        return "ok", handle.read()


def _cu(driver: Any, name: str, *args: object) -> Any:
    """One driver API call through cuda-python: (CUresult, outputs...); raises on an error,
    naming the call, the CUresult and the driver's own text for it."""
    result, *outputs = getattr(driver, name)(*args)
    if int(result) != 0:
        _, text = driver.cuGetErrorString(result)
        label = getattr(result, "name", str(int(result)))
        raise RuntimeError(f"{name}: CUDA error {int(result)} {label} ({(text or b'?').decode()})")
    return outputs[0] if len(outputs) == 1 else None


def run_kernel(cubin: bytes, index: int) -> str:
    """Loads the cubin on GPU `index` through the CUDA driver API (cuda-python's
    cuda.bindings.driver, a requirement of every SGLang release) and doubles four floats.
    Pointers go in as addresses (ints), which every cuda-python release accepts."""
    driver = import_module("cuda.bindings.driver")
    _cu(driver, "cuInit", 0)
    device = _cu(driver, "cuDeviceGet", index)
    # The primary context: the one torch uses on that device, so the check adds no other.
    context = _cu(driver, "cuDevicePrimaryCtxRetain", device)
    try:
        _cu(driver, "cuCtxSetCurrent", context)
        image = ctypes.create_string_buffer(cubin, len(cubin))
        module = _cu(driver, "cuModuleLoadData", ctypes.addressof(image))
        try:
            function = _cu(driver, "cuModuleGetFunction", module, b"sglang_deploy_twice")
            data = (ctypes.c_float * 4)(1.0, 2.0, 3.0, 4.0)
            pointer = _cu(driver, "cuMemAlloc", 16)
            try:
                _cu(driver, "cuMemcpyHtoD", pointer, ctypes.addressof(data), 16)
                argument = ctypes.c_uint64(int(pointer))
                params = (ctypes.c_void_p * 1)(ctypes.addressof(argument))
                _cu(driver, "cuLaunchKernel", function, 1, 1, 1, 4, 1, 1, 0, 0,
                    ctypes.addressof(params), 0)  # fmt: skip
                _cu(driver, "cuCtxSynchronize")
                _cu(driver, "cuMemcpyDtoH", ctypes.addressof(data), pointer, 16)
            finally:
                driver.cuMemFree(pointer)
        finally:
            driver.cuModuleUnload(module)
    finally:
        driver.cuDevicePrimaryCtxRelease(device)
    return "ok" if list(data) == [2.0, 4.0, 6.0, 8.0] else f"computed {list(data)}"


def check_compiler(spec: dict, out: dict, devices: int) -> None:  # type: ignore[type-arg]
    if not spec.get("cuda_home") or not spec.get("arch"):
        return
    with tempfile.TemporaryDirectory(prefix="sglang-deploy-nvcc-") as work:
        out["compile"], cubin = compile_kernel(spec["cuda_home"], spec["arch"], work)
    if cubin is None:
        return
    out["kernel_runs"] = []
    for index in range(devices):
        try:
            out["kernel_runs"].append(run_kernel(cubin, index))
        except BaseException as exc:
            out["kernel_runs"].append(_error(exc))


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def main(spec: dict) -> dict:  # type: ignore[type-arg]
    # Who the check ran as: the deploy runs it as the service user and refuses any other.
    out: dict = {"versions": {}, "imports": {}, "devices": [], "user": _user()}  # type: ignore[type-arg]
    for project in ["sglang", *spec["packages"]]:
        try:
            out["versions"][project] = metadata.version(project)
        except metadata.PackageNotFoundError:
            out["versions"][project] = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch = import_module("torch")
            out["imports"]["torch"] = "ok"
            out["torch_cuda"] = torch.version.cuda
            out["cuda_available"] = bool(torch.cuda.is_available())
        # torch warns (and returns False) instead of raising when the driver is too old.
        out["cuda_warnings"] = [str(w.message).strip() for w in caught][-3:]
    except BaseException as exc:
        out["imports"]["torch"] = _error(exc)
        check_compiler(spec, out, 0)
        print("@@probe " + json.dumps(out))
        return out
    if out["cuda_available"]:
        out["device_count"] = int(torch.cuda.device_count())
        out["arch_list"] = list(torch.cuda.get_arch_list())
        for index in range(out["device_count"]):
            device: dict = {"index": index}  # type: ignore[type-arg]
            try:
                major, minor = torch.cuda.get_device_capability(index)
                device["capability"] = f"{major}.{minor}"
                # One real kernel launch and a copy back: proves the build runs on this chip.
                value = (torch.ones(4, device=f"cuda:{index}") * 2).sum().item()
                device["op"] = "ok" if value == 8 else f"computed {value}, expected 8"
            except BaseException as exc:
                device["op"] = _error(exc)
            out["devices"].append(device)
    check_compiler(spec, out, out.get("device_count") or 0)
    for module in spec["packages"].values():
        if module in out["imports"]:
            continue
        try:
            import_module(module)
            out["imports"][module] = "ok"
        except BaseException as exc:
            out["imports"][module] = _error(exc)
    try:
        import_module("sglang.launch_server")
        out["imports"]["sglang.launch_server"] = "ok"
    except BaseException as exc:
        out["imports"]["sglang.launch_server"] = _error(exc)
    print("@@probe " + json.dumps(out))
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
