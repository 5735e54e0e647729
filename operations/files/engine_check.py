"""The engine check, run with a new environment's own Python before `current` may point at it.

`python engine_check.py '<json>'` with {"packages": {project: module}, "gpu_count": N}: prints
one line `@@probe {...}` holding what the environment really is (installed versions, torch's
CUDA build, each import, and on each GPU its capability and one small CUDA operation).
operations/engine.py judges the result; this script only observes, so an import that fails or a
GPU that cannot run is reported, never raised. Only the standard library and the environment's
own packages: it runs inside the environment on the host.
"""

import json
import sys
import traceback
import warnings
from importlib import import_module, metadata


def _error(exc: BaseException) -> str:
    # The last line of the traceback names the failing library (libcudart.so.13, ...).
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def main(spec: dict) -> dict:  # type: ignore[type-arg]
    out: dict = {"versions": {}, "imports": {}, "devices": []}  # type: ignore[type-arg]
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
