"""The GPU test doubles are real wheels that behave like the real packages where a deploy looks:
valid RECORDs, the knowledge base's pins, and a launch_server double that parses the release's
real command line and serves the endpoints the serve step checks."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from tests.doubles import snapshot_graph, wheels
from tests.doubles.snapshot_graph import Captured
from tests.e2e.index import free_port, wait_for
from tests.needs import missing
from tests.snapshot_index import find_python

pytestmark = pytest.mark.integration  # runs the engine doubles in a python

RELEASE = "0.5.11"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DOUBLES = Path(__file__).resolve().parents[1] / "doubles"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The double wheels of 0.5.11/cu128 unpacked into one directory (a PYTHONPATH)."""
    out = tmp_path_factory.mktemp("double-wheels")
    site = out / "site"
    for wheel in wheels.release_wheels(out, RELEASE, "cu128").values():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    return site


def run_python(site: Path, code: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )
    return proc.stdout.strip() if check else proc.stderr.strip()


def test_wheels_carry_valid_records_and_the_knowledge_base_pins(tmp_path: Path) -> None:
    built = wheels.release_wheels(tmp_path, RELEASE, "cu128")

    assert sorted(p.name for p in built.values()) == [
        "cuda_python-12.9.4-py3-none-any.whl",  # the cu128 override (knowledge base)
        # FlashInfer's prebuilt modules for cu128 (caches.yaml: available)
        "flashinfer_jit_cache-0.6.8.post1+cu128-py3-none-any.whl",
        "flashinfer_python-0.6.8.post1-py3-none-any.whl",
        "sglang-0.5.11-py3-none-any.whl",
        "sglang_kernel-0.4.2+cu129-py3-none-any.whl",
        "torch-2.11.0+cu128-py3-none-any.whl",
        "torchaudio-2.11.0+cu128-py3-none-any.whl",
        "torchvision-0.26.0+cu128-py3-none-any.whl",
    ]
    # Each carries its whole captured METADATA (test_every_double_carries_...).
    assert carried(built["torch"], snapshot_graph.captured("torch", "2.11.0+cu128")) == []
    jit = built["flashinfer-jit-cache"]
    assert carried(jit, snapshot_graph.captured("flashinfer-jit-cache", "0.6.8.post1+cu128")) == []
    assert "Requires-Dist" not in wheels.metadata_of(jit)  # as the real one: no requirements
    with zipfile.ZipFile(jit) as zf:  # the AOT module of each module the rank double builds
        assert sorted(n for n in zf.namelist() if n.endswith(".so")) == [
            "flashinfer_jit_cache/jit_cache/batch_decode_with_kv_cache/"
            "batch_decode_with_kv_cache.so",
            "flashinfer_jit_cache/jit_cache/batch_prefill_with_kv_cache/"
            "batch_prefill_with_kv_cache.so",
        ]
    assert "flashinfer-jit-cache" not in wheels.release_wheels(tmp_path / "u", "0.5.19", "cu128")
    for wheel in built.values():
        with zipfile.ZipFile(wheel) as zf:
            record = next(n for n in zf.namelist() if n.endswith("RECORD"))
            for line in zf.read(record).decode().splitlines():
                path, digest, size = line.rsplit(",", 2)
                if path == record:
                    continue
                data = zf.read(path)
                b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == "sha256=" + b64.decode() and int(size) == len(data), path


def carried(wheel: Path, captured: Captured) -> list[str]:
    """What the wheel's METADATA says differently from the captured file it stands for: each
    Requires-Dist line dropped or added, a changed Requires-Python, a Summary that does not say
    TEST DOUBLE and name the file (empty: it carries the captured METADATA whole)."""
    fields = wheels.metadata_of(wheel)
    own = fields.get("Requires-Dist", [])
    found = [f"dropped Requires-Dist: {line}" for line in captured.requires_dist if line not in own]
    found += [f"added Requires-Dist: {line}" for line in own if line not in captured.requires_dist]
    if not found and own != captured.requires_dist:
        found.append("Requires-Dist reordered")
    if fields.get("Requires-Python", [None])[0] != captured.requires_python:
        found.append(f"Requires-Python {fields.get('Requires-Python')}")
    summary = fields["Summary"][0]
    if not summary.startswith("TEST DOUBLE") or captured.source not in summary:
        found.append(f"Summary {summary!r}")
    for key in ("Name", "Version"):
        if fields[key] != captured.fields(key):
            found.append(f"{key} {fields[key]} != {captured.fields(key)}")
    return found


@pytest.fixture(scope="module")
def graph() -> snapshot_graph.Graph:
    if find_python(snapshot_graph.E2E_PYTHON) is None:
        missing(f"no Python {snapshot_graph.E2E_PYTHON} here: uv lock needs one")
    return snapshot_graph.e2e_graph()


@pytest.mark.parametrize(("release", "lane"), snapshot_graph.E2E_BUILDS)
def test_every_double_carries_the_snapshots_whole_metadata(
    graph: snapshot_graph.Graph, release: str, lane: str, tmp_path: Path
) -> None:
    """Every wheel the e2e indexes serve for a build that is not a REAL one from PyPI (the
    double-code wheels and the index doubles) has the Requires-Dist, Requires-Python, Name and
    Version of the snapshot file of the same project and version, and there is one for every
    package the build's lock against the snapshot holds."""
    build = graph.build(release, lane)
    real = build.closure(wheels.REAL)
    made: dict[Path, Captured] = {}
    for pin in build.pins:
        if pin.name not in real and pin.name not in wheels.DOUBLED:
            entry = snapshot_graph.captured(pin.name, pin.version, pin.index)
            made[wheels.index_double(tmp_path / "graph", entry)] = entry
    for wheel in wheels.release_wheels(tmp_path / "doubles", release, lane).values():
        name, version, _, _ = parse_wheel_filename(wheel.name)
        made[wheel] = snapshot_graph.captured(name, str(version))

    problems = {wheel.name: carried(wheel, entry) for wheel, entry in made.items()}
    assert {name: found for name, found in problems.items() if found} == {}
    # One wheel per package of the lock: the REAL ones come from PyPI.
    doubled = {(entry.name, entry.version) for entry in made.values()}
    locked = {(p.name, p.version) for p in build.pins if p.name not in real}
    assert doubled == locked
    assert real >= {"openai", "httpx", "pydantic-core"}


def test_a_dropped_requirement_fails_the_check(tmp_path: Path) -> None:
    """The check above is not blind: the torch double of 0.5.11/cu128 built without its
    `cuda-bindings<13,>=12.9.4` line (the line whose absence let an unsolvable cu128 lane
    pass) is named."""
    real = snapshot_graph.captured("torch", "2.11.0+cu128")
    line = next(r for r in real.requires_dist if r.startswith("cuda-bindings"))
    assert line == 'cuda-bindings<13,>=12.9.4; platform_system == "Linux"'
    dropped = Captured(
        real.index,
        real.filename,
        real.metadata.replace(f"Requires-Dist: {line}\n", ""),
        real.source,
    )
    wheel = wheels.build_wheel(
        tmp_path, "torch", real.version, {}, summary="TEST DOUBLE", metadata=dropped
    )

    assert carried(wheel, real) == [f"dropped Requires-Dist: {line}"]


def test_rebuilding_a_wheel_gives_the_same_bytes(tmp_path: Path) -> None:
    a = wheels.torch_wheel(tmp_path / "a", "2.11.0+cu128")
    b = wheels.torch_wheel(tmp_path / "b", "2.11.0+cu128")
    assert a.read_bytes() == b.read_bytes()


def fake_driver(tmp_path: Path, cuda: str) -> dict[str, str]:
    """PATH with the nvidia-smi double replaying a fixture host whose banner says `cuda`."""
    source = FIXTURES / "nvidia-smi" / "rtx-pro-6000-x8"
    scenario = tmp_path / f"scenario-{cuda}"
    scenario.mkdir()
    for item in source.iterdir():
        text = item.read_text()
        if item.name == "banner.txt":
            text = text.replace("CUDA Version: 12.8", f"CUDA Version: {cuda}")
        (scenario / item.name).write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "nvidia-smi").write_bytes((DOUBLES / "nvidia-smi").read_bytes())
    (bindir / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "NVIDIA_SMI_DOUBLE_DIR": str(scenario)}


def captured_gpus(scenario: str) -> tuple[list[str], list[str]]:
    """A captured host's GPU device nodes (devices.txt) and each GPU's compute capability
    (gpus.csv), as the fixture says, not as a double computes them."""
    host = FIXTURES / "nvidia-smi" / scenario
    nodes = [n for n in (host / "devices.txt").read_text().split() if n[len("nvidia") :].isdigit()]
    rows = (host / "gpus.csv").read_text().splitlines()[1:]
    return nodes, [row.split(", ")[2] for row in rows]


def test_torch_double_reports_its_build_and_the_captured_hosts_gpus(
    unpacked: Path, tmp_path: Path
) -> None:
    nodes, caps = captured_gpus("rtx-pro-6000-x8")
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in nodes:
        (dev / node).touch()
    code = (
        "import json, torch\n"
        f"torch.cuda.DEVICE_GLOB = {str(dev / 'nvidia[0-9]*')!r}\n"
        "n = torch.cuda.device_count()\n"
        "print(json.dumps([torch.__version__, torch.version.cuda, torch.cuda.is_available(), "
        "torch.cuda.get_arch_list(), n, [torch.cuda.get_device_capability(i) for i in range(n)], "
        "(torch.ones(4, device='cuda:7') * 2).sum().item()]))"
    )
    version, cuda, available, archs, count, found, value = json.loads(
        run_python(unpacked, code, fake_driver(tmp_path, "12.8"))
    )

    assert (version, cuda, available) == ("2.11.0+cu128", "12.8", True)
    # torch 2.x cu12.8+ x86_64 builds' torch.cuda.get_arch_list(), sm_120 included.
    assert archs == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert (count, len(nodes)) == (8, 8)
    assert [f"{major}.{minor}" for major, minor in found] == caps == ["12.0"] * 8
    assert value == 8.0


def test_a_rank_loads_the_jit_caches_modules_and_builds_only_without_it(
    unpacked: Path, tmp_path: Path
) -> None:
    """The rank-start double with 0.5.11's wheels (flashinfer-jit-cache 0.6.8.post1+cu128
    among them) loads both modules from the jit cache's AOT directory; without the jit cache it
    builds them into FlashInfer's workspace; a jit cache whose version does not start with
    flashinfer's makes `import flashinfer` raise (flashinfer jit/env.py:100-132)."""
    code = "from sglang import _startup_double as d; d.jit(0)"
    home = {"HOME": str(tmp_path / "home")}
    said = run_python(unpacked, code, home)
    aot = unpacked / "flashinfer_jit_cache" / "jit_cache"
    assert said.splitlines() == [
        f"[double] flashinfer jit: loaded batch_prefill_with_kv_cache from {aot}",
        f"[double] flashinfer jit: loaded batch_decode_with_kv_cache from {aot}",
    ]
    built = wheels.release_wheels(tmp_path / "w", RELEASE, "cu128")
    bare, other = tmp_path / "bare", tmp_path / "other"
    for role in ("sglang", "flashinfer"):
        for site in (bare, other):
            zipfile.ZipFile(built[role]).extractall(site)
    assert run_python(bare, code, home).count("flashinfer jit: built ") == 2
    files = wheels._package_files("flashinfer_jit_cache", {"VERSION": "0.6.8+cu128"})
    zipfile.ZipFile(
        wheels.build_wheel(tmp_path / "x", "flashinfer-jit-cache", "0.6.8+cu128", files)
    ).extractall(other)
    error = run_python(other, code, home, check=False)
    assert error.splitlines()[-1].startswith(
        "RuntimeError: flashinfer-jit-cache version (0.6.8+cu128) does not match flashinfer "
        "version (0.6.8.post1)"
    ), error


def test_torch_double_without_a_driver_sees_no_gpu(unpacked: Path, tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    code = (
        "import json, warnings, torch\n"
        f"torch.cuda.DEVICE_GLOB = {str(dev / 'nvidia[0-9]*')!r}\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    ok = torch.cuda.is_available()\n"
        "print(json.dumps([ok, torch.cuda.get_arch_list(), [str(x.message) for x in w]]))"
    )
    # No nvidia-smi on PATH: no libcuda either.
    ok, archs, said = json.loads(run_python(unpacked, code, {"PATH": "/usr/bin:/bin"}))

    assert (ok, archs) == (False, [])
    # The start of real torch's text (c10/cuda/CUDAFunctions.cpp); the double stops there.
    assert len(said) == 1 and said[0].startswith(
        "CUDA initialization: Found no NVIDIA driver on your system."
    )


@pytest.mark.parametrize(
    ("build", "driver", "available"),
    [
        ("2.11.0+cu130", "12.8", False),
        ("2.11.0+cu129", "12.8", True),
        ("2.11.0+cu130", "13.0", True),
    ],
)
def test_torch_double_runs_where_real_torch_runs(
    tmp_path: Path, build: str, driver: str, available: bool
) -> None:
    """A newer CUDA major than the driver's is refused with real torch's warning
    (tests/fixtures/cuda-errors/torch-driver-too-old.txt); a newer minor runs."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheels.torch_wheel(tmp_path, build)) as zf:
        zf.extractall(site)
    nodes = tmp_path / "dev"
    nodes.mkdir()
    (nodes / "nvidia0").touch()
    code = (
        "import json, warnings, torch\n"
        f"torch.cuda.DEVICE_GLOB = {str(nodes / 'nvidia[0-9]*')!r}\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    ok = torch.cuda.is_available()\n"
        "print(json.dumps([ok, [str(x.message) for x in w]]))"
    )
    ok, said = json.loads(run_python(site, code, fake_driver(tmp_path, driver)))

    assert ok is available
    real = (FIXTURES / "cuda-errors" / "torch-driver-too-old.txt").read_text().strip()
    assert said == ([] if available else [real])


def test_companions_and_the_kernel_refuse_another_cuda_build_like_the_real_ones(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    for wheel in (
        wheels.torch_wheel(tmp_path, "2.11.0+cu128"),
        wheels.companion_wheel(tmp_path, "torchvision", "0.26.0+cu130", "13.0"),
        wheels.companion_wheel(tmp_path, "torchaudio", "2.11.0+cu129", "12.9"),
        wheels.kernel_wheel(tmp_path, "sglang-kernel", "0.4.2", "13.0"),
        wheels.kernel_wheel(tmp_path / "k", "sglang-kernel", "0.4.2+cu129", "12.9"),
    ):
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site if "0.4.2+cu129" not in wheel.name else tmp_path / "site129")
    errors = {
        module: run_python(site, f"import {module}", check=False)
        for module in ("torchvision", "torchaudio", "sgl_kernel")
    }
    captured = FIXTURES / "cuda-errors"
    assert errors["torchvision"].endswith(
        (captured / "torchvision-cuda-mismatch.txt").read_text().strip()
    )
    real = (captured / "torchaudio-cuda-mismatch.txt").read_text().strip()
    assert errors["torchaudio"].endswith(real)
    assert errors["sgl_kernel"].endswith(
        "ImportError: " + (captured / "libcudart-13-missing.txt").read_text().strip()
    )


def launch(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *args],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_launch_server_refuses_unknown_flags_like_argparse(unpacked: Path, tmp_path: Path) -> None:
    proc = launch(unpacked, "--model-path", str(tmp_path), "--mamba-radix-cache-strategy", "auto")

    assert proc.returncode == 2
    assert "unrecognized arguments: --mamba-radix-cache-strategy" in proc.stderr


def test_launch_server_needs_gpus_and_a_readable_model(unpacked: Path, tmp_path: Path) -> None:
    no_gpu = launch(unpacked, "--model-path", str(tmp_path))
    no_model = launch(unpacked, "--model-path", str(tmp_path / "nope"), CUDA_VISIBLE_DEVICES="0")

    assert no_gpu.returncode == 1 and "No CUDA GPUs" in no_gpu.stderr
    assert no_model.returncode == 1 and "cannot read the model directory" in no_model.stderr


ServerFactory = Callable[[float], str]


@pytest.fixture
def start_server(unpacked: Path, tmp_path: Path) -> Iterator[ServerFactory]:
    """start_server(load_seconds) -> base URL of the double, API key from --config; every
    server started is stopped by its PID after the test."""
    procs: list[subprocess.Popen[bytes]] = []
    config = tmp_path / "secrets.yaml"
    config.write_text('api-key: "k3y"\n')

    def start(load_seconds: float) -> str:
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(tmp_path),
                "--served-model-name",
                "Qwen/Qwen3.6-27B",
                "--port",
                str(port),
                "--enable-metrics",
                "--config",
                str(config),
            ],
            env={
                "PATH": os.environ["PATH"],
                "PYTHONPATH": str(unpacked),
                "CUDA_VISIBLE_DEVICES": "0",
                "SGLANG_DOUBLE_LOAD_SECONDS": str(load_seconds),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: status(base + "/health") in (200, 503), 15, "the double", proc)
        return base

    yield start
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def status(url: str, key: str | None = None, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_server_double_answers_503_while_loading(start_server: ServerFactory) -> None:
    server = start_server(600)

    assert status(server + "/health") == 503
    assert status(server + "/v1/chat/completions", key="k3y", body=b"{}") == 503


def test_server_double_loads_then_serves_behind_the_api_key(start_server: ServerFactory) -> None:
    server = start_server(0.2)
    wait_for(lambda: status(server + "/health") == 200, 15, "/health 200 after loading")

    assert status(server + "/metrics") == 200  # open, like the real one
    assert status(server + "/v1/models") == 401
    assert status(server + "/v1/models", key="wrong") == 401
    assert status(server + "/v1/models", key="k3y") == 200
    request = urllib.request.Request(
        server + "/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Authorization": "Bearer k3y", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        reply = json.load(response)
    assert "Qwen/Qwen3.6-27B" in reply["choices"][0]["message"]["content"]
