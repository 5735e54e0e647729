"""The engine check's result, read and judged: programs/engine_check.py runs on the host with the
new environment's own Python and prints one `@@probe {...}` line; `parse_probe` reads it into a
`Probe`, and `evaluate` judges it against the EngineSpec and the host's driver, each failed
check naming the package, its CUDA build, the driver and the fix. Pure: operations/steps/engine.py
runs the script (verify_env) and acts on the verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from operations.plan.engine_spec import EngineSpec

PROBE_PREFIX = "@@probe "


# -- the check: a probe run with the new environment's Python on the GPUs, judged here -------


@dataclass(frozen=True)
class Device:
    index: int
    capability: str | None
    op: str | None


@dataclass(frozen=True)
class Probe:
    versions: dict[str, str | None]
    imports: dict[str, str]
    torch_cuda: str | None = None
    cuda_available: bool = False
    cuda_warnings: tuple[str, ...] = ()
    device_count: int | None = None
    arch_list: tuple[str, ...] = ()
    devices: tuple[Device, ...] = ()
    errors: tuple[str, ...] = ()
    compile: str | None = None  # "ok" or nvcc's error; None: not asked (no toolkit)
    kernel_runs: tuple[str, ...] = ()  # per GPU: the compiled kernel loaded and run
    user: str | None = None  # the user the check ran as


def parse_probe(text: str) -> Probe:
    """The probe's JSON line among whatever else the imports printed."""
    for line in reversed(text.splitlines()):
        if line.startswith(PROBE_PREFIX):
            try:
                data = json.loads(line[len(PROBE_PREFIX) :])
            except json.JSONDecodeError:
                continue
            break
    else:
        tail = text.strip().splitlines()[-3:]
        return Probe({}, {}, errors=("the engine check printed no result: " + " / ".join(tail),))
    return Probe(
        versions=dict(data.get("versions") or {}),
        imports=dict(data.get("imports") or {}),
        torch_cuda=data.get("torch_cuda"),
        cuda_available=bool(data.get("cuda_available")),
        cuda_warnings=tuple(data.get("cuda_warnings") or ()),
        device_count=data.get("device_count"),
        arch_list=tuple(data.get("arch_list") or ()),
        devices=tuple(
            Device(int(d["index"]), d.get("capability"), d.get("op"))
            for d in data.get("devices") or ()
        ),
        compile=data.get("compile"),
        kernel_runs=tuple(data.get("kernel_runs") or ()),
        user=data.get("user"),
    )


@dataclass(frozen=True)
class Driver:
    """The host's driver as nvidia-smi reported it in preflight."""

    version: str | None
    cuda: str | None  # the highest CUDA version it runs ("12.8")


def _driver_text(driver: Driver) -> str:
    return f"driver {driver.version or '?'} (runs CUDA <= {driver.cuda or '?'})"


def evaluate(probe: Probe, spec: EngineSpec, driver: Driver) -> list[str]:
    """Every failed check, each naming the package, its CUDA build, the driver and the fix;
    empty when the environment can serve on this host's GPUs."""
    problems = list(probe.errors)
    if probe.errors:
        return problems
    problems += _compiler_problems(probe, spec, driver)
    fix_lane = (
        f"pin a cuda_lane this driver runs, or upgrade the host driver to >= {spec.min_driver}"
    )
    found = probe.versions.get("sglang")
    if found != spec.release:
        problems.append(f"sglang: expected {spec.release}, found {found}")
    for pin in spec.pins:
        found = probe.versions.get(pin.name)
        if found != pin.version:
            problems.append(
                f"{pin.name}: expected the {pin.version} build (from the {pin.index} index, "
                f"lane {pin.index_lane}), found {found}; the environment did not install its "
                "lock: rerun the deploy"
            )
    torch_import = probe.imports.get("torch")
    if torch_import != "ok":
        problems.append(f"torch {spec.torch}: import failed: {torch_import}")
        return problems
    if probe.torch_cuda != spec.cuda:
        problems.append(
            f"torch {spec.torch}: torch.version.cuda is {probe.torch_cuda}, the {spec.lane} lane "
            f"needs CUDA {spec.cuda}: the wheel is mislabelled or from another index"
        )
    if not probe.cuda_available:
        said = "; ".join(probe.cuda_warnings) or "no warning"
        problems.append(
            f"torch {spec.torch} (CUDA {probe.torch_cuda}) cannot use the GPUs with this host's "
            f"{_driver_text(driver)}: torch.cuda.is_available() is False ({said}); the "
            f"{spec.lane} lane needs driver >= {spec.min_driver}: {fix_lane}"
        )
        return problems + _import_problems(probe, spec, driver)
    if probe.device_count != spec.gpu_count:
        problems.append(
            f"torch {spec.torch}: torch.cuda.device_count() is {probe.device_count}, expected "
            f"gpu_count {spec.gpu_count}: check CUDA_VISIBLE_DEVICES and the container's GPUs"
        )
    if spec.arch and spec.arch not in probe.arch_list:
        problems.append(
            f"torch {spec.torch}: not compiled for {spec.arch} (torch.cuda.get_arch_list(): "
            f"{', '.join(probe.arch_list) or 'none'}): a CUDA {spec.cuda} build should carry it; "
            "check the torch index serves PyTorch's own wheels"
        )
    for device in probe.devices:
        if device.capability != spec.compute_cap:
            problems.append(
                f"GPU {device.index}: compute capability {device.capability}, expected "
                f"{spec.compute_cap} (gpu_compute_cap)"
            )
        if device.op != "ok":
            problems.append(
                f"GPU {device.index}: a small CUDA operation with torch {spec.torch} failed "
                f"with the host's {_driver_text(driver)}: {device.op}; {fix_lane}"
            )
    return problems + _import_problems(probe, spec, driver)


def _compiler_problems(probe: Probe, spec: EngineSpec, driver: Driver) -> list[str]:
    """SGLang's tvm-ffi kernels and FlashInfer compile with the engine's nvcc at run time:
    a compiler that cannot build for the GPU's arch, or whose code the driver cannot load,
    fails the first request after the weights load."""
    tools = spec.toolkit
    if tools is None:
        return []
    arch = spec.compile_arch
    if probe.compile is None:
        return [f"nvcc {tools.version}: the engine check compiled nothing (a bug in the check)"]
    if probe.compile != "ok":
        return [
            f"nvcc {tools.version} ({tools.origin}) cannot compile for {arch}: "
            f"{probe.compile}; SGLang's and FlashInfer's JIT builds would fail the same way "
            "after the weights load: remove the toolkit directory named above so the next run "
            "unpacks it again, and check the host compiler (g++) is installed"
        ]
    return [
        f"GPU {index}: a kernel nvcc {tools.version} compiled for {arch} does not run with "
        f"the host's {_driver_text(driver)}: {run}"
        for index, run in enumerate(probe.kernel_runs)
        if run != "ok"
    ]


def _import_problems(probe: Probe, spec: EngineSpec, driver: Driver) -> list[str]:
    problems = []
    for project, module in spec.modules().items():
        result = probe.imports.get(module)
        if result == "ok" or project == "torch":
            continue
        pin = spec.pin(project)
        build = pin.version if pin else probe.versions.get(project)
        problems.append(
            f"{project} {build}: import {module} failed beside torch {spec.torch} with the "
            f"host's {_driver_text(driver)}: {result}; its CUDA build must match torch's CUDA "
            f"major ({spec.cuda}) and run on this driver: fix its build for the {spec.lane} lane "
            "in operations/kb/knowledge/sglang.yaml, or pin another cuda_lane"
        )
    launch = probe.imports.get("sglang.launch_server")
    if launch != "ok" and not problems:
        problems.append(f"sglang {spec.release}: import sglang.launch_server failed: {launch}")
    return problems
