"""Running the real deploy in end-to-end tests and benches: the cu128 lane's package indexes on
loopback (every package the engine's lock against the index snapshot holds, as double-code,
REAL or index-double wheels, tests/doubles/wheels.py, and uv), `pyinfra -y INVENTORY
deploy.py` as a subprocess (the one way every e2e module runs a deploy file: deploy.py, pve.py
or a test's own), and its per-operation results read back from pyinfra's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from tests.doubles import cuda_redist, snapshot_graph
from tests.doubles import wheels as doubles
from tests.e2e.index import LocalIndex, pypi_release_wheel, pypi_wheel, uv_wheel
from tests.testbed import Container, inventory_file

PYINFRA = Path(sys.executable).parent / "pyinfra"
REPO = Path(__file__).resolve().parents[2]
LANE = "cu128"
MODEL_CONFIG = json.dumps(
    {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"}
)
DEPLOY_TIMEOUT_S = 900
# Under the main index's server: NVIDIA's redist tree of the lane's compiler archives (doubles).
REDIST_PATH = "nvidia-redist"


@dataclass
class Indexes:
    """The four indexes of the cu128 lane: main (sglang, flashinfer, uv), torch, kernel and
    FlashInfer's (flashinfer-jit-cache, per lane); the main one's server also serves the double
    of NVIDIA's compiler archives under REDIST_PATH."""

    main: LocalIndex
    torch: LocalIndex
    kernel: LocalIndex
    flashinfer: LocalIndex
    redist: cuda_redist.Redist | None = None

    def data(self) -> dict[str, Any]:
        found = {
            "package_index_url": self.main.url,
            "torch_index_url": self.torch.base + "/{lane}",
            "kernel_index_url": self.kernel.base + "/{lane}",
            "flashinfer_index_url": self.flashinfer.base + "/{lane}",
            # The throughput check costs each deploy that starts ranks a benchmark run, and the
            # testbed's models have no tokenizer: only tests/e2e/test_throughput.py turns it on.
            "throughput_check": "off",
            # A deploy that changes the ranks' command line on a serving host is a canary unless
            # the strategy is set: the tests of rolls roll; tests/e2e/test_canary.py judges.
            "rollout": {"strategy": "rolling"},
        }
        if self.redist is not None:
            found["cuda_redist_url"] = f"{self.main.base}/{REDIST_PATH}"
            found["cuda_redist_manifest"] = str(self.redist.manifest)
        return found

    def all(self) -> list[LocalIndex]:
        return [self.main, self.torch, self.kernel, self.flashinfer]

    def requests(self) -> int:
        """How many requests the four servers have logged so far."""
        total = 0
        for index in self.all():
            log = index.root.parent / f"{index.root.name}.http.log"
            if log.exists():
                total += sum(1 for line in log.read_text().splitlines() if '"GET ' in line)
        return total


# What the real indexes hold beside our pins, copied from captures: SGLang's kernel index has no
# sglang-kernel on cu128 but an older sgl-kernel, and dev builds of sglang on cu129 and cu130
# (tests/fixtures/sglang-whl/); PyTorch's indexes mirror typing-extensions at a lagging version
# (../shared/reference/package-indexes.md). With uv's first-index rule, either would shadow
# the main index; the engine's explicit indexes must never read them. The index snapshot holds
# none of them (no lock reads them), so their doubles carry no captured METADATA.
KERNEL_CU128_ONLY = "0.3.14.post1+cu128"  # tests/fixtures/sglang-whl/cu128/sgl-kernel.txt
SGLANG_DEV = "0.5.15.dev20260701+ga7390b17f8"  # tests/fixtures/sglang-whl/cu130/sglang.txt
MIRRORED_TYPING_EXTENSIONS = "4.12.2"
# What the snapshot's locks resolve on the main index (the OpenAI client's pydantic needs
# typing-extensions>=4.16.0): the one the engine installs, never PyTorch's mirror.
MAIN_TYPING_EXTENSIONS = "4.16.0"


def graph_wheels(outdir: Path, release: str, lane: str = LANE) -> list[tuple[str, Path]]:
    """(snapshot index, wheel) of every package the build's lock against the index snapshot
    holds (tests/doubles/snapshot_graph.py) but the double-code ones (doubles.DOUBLED, from
    release_wheels): the REAL closure from PyPI, an index double with its captured METADATA
    for the rest (tests/doubles/wheels.py says which and why)."""
    build = snapshot_graph.e2e_graph().build(release, lane)
    real = build.closure(doubles.REAL)
    found: list[tuple[str, Path]] = []
    for pin in build.pins:
        if pin.name in doubles.DOUBLED:
            continue
        if pin.name in real:
            wheel = pypi_release_wheel(pin.name, pin.version)
        else:
            metadata = snapshot_graph.captured(pin.name, pin.version, pin.index)
            wheel = doubles.index_double(outdir / pin.index, metadata)
        found.append((pin.index, wheel))
    return found


def support_wheels(outdir: Path, release: str, lane: str = LANE) -> list[Path]:
    """graph_wheels' wheels alone (a wheelhouse's share beside the double-code ones)."""
    return [wheel for _, wheel in graph_wheels(outdir, release, lane)]


def _check_versions(release: str, lane: str, built: dict[str, Path]) -> None:
    """The double-code wheels are the versions the snapshot's lock chose (else the e2e lock
    would meet another graph than tests/unit/test_real_metadata.py's)."""
    build = snapshot_graph.e2e_graph().build(release, lane)
    for role, wheel in built.items():
        name, version, _, _ = parse_wheel_filename(wheel.name)
        locked = build.pin(name).version
        if str(version) != locked:
            raise AssertionError(
                f"{release} on {lane}: the {role} double is {name} {version}, but the lock "
                f"against the index snapshot chose {locked}"
            )


def make_indexes(
    root: Path,
    wheels: dict[str, dict[str, Path]],
    lane: str = LANE,
    *,
    start: bool = True,
    other_lanes: dict[str, dict[str, dict[str, Path]]] | None = None,
) -> Indexes:
    """The four indexes laid out like the real ones (see above), holding, for each release
    and lane, every package its lock against the index snapshot holds where that lock found
    it: the double-code wheels `wheels` (placed where the knowledge base says), the REAL ones
    and the index doubles (graph_wheels); and the double of NVIDIA's compiler archives for
    `lane` (tests/doubles/cuda_redist.py)."""
    indexes = Indexes(
        LocalIndex(root / "main"),
        LocalIndex(root / "torch"),
        LocalIndex(root / "kernel"),
        LocalIndex(root / "flashinfer"),
    )
    by_name = {"torch": indexes.torch, "kernel": indexes.kernel, "flashinfer": indexes.flashinfer}
    by_kind = {"pytorch": indexes.torch, "sglang": indexes.kernel, "flashinfer": indexes.flashinfer}
    graph_dir = root / "graph-wheels"
    for each_lane, by_release in {lane: wheels, **(other_lanes or {})}.items():
        for release, built in by_release.items():
            _check_versions(release, each_lane, built)
            for role, (index, index_lane) in doubles.placement(release, each_lane).items():
                if index == "main":  # a plain PyPI build (the cu130 kernel from 0.5.19)
                    indexes.main.add(built[role])
                else:
                    by_name[index].add(built[role], sub=index_lane)
            for role in ("sglang", "flashinfer", "cuda-python"):
                indexes.main.add(built[role])
            if "flashinfer-jit-cache" in built:  # FlashInfer's prebuilt modules, per lane
                indexes.flashinfer.add(built["flashinfer-jit-cache"], sub=each_lane)
            graph = graph_wheels(graph_dir, release, each_lane)
            indexes.main.add(*(w for index, w in graph if index == "main"))
            for index, wheel in graph:
                if index != "main":  # pytorch-<lane>, sglang-<lane>, flashinfer-<lane>: none today
                    kind, _, sub = index.partition("-")
                    by_kind[kind].add(wheel, sub=sub)
    extras = root / "extras"
    mirrored = pypi_wheel("typing_extensions", MIRRORED_TYPING_EXTENSIONS, "any")
    for sub in ("cu128", "cu129", "cu130"):
        indexes.torch.add(mirrored, sub=sub)
    indexes.kernel.add(
        doubles.kernel_wheel(
            extras, "sgl-kernel", KERNEL_CU128_ONLY, "12.8", captured_metadata=False
        ),
        sub="cu128",
    )
    dev = doubles.plain_wheel(extras, "sglang", SGLANG_DEV, summary="TEST DOUBLE: a dev build")
    for sub in ("cu129", "cu130"):
        indexes.kernel.add(dev, sub=sub)
    indexes.main.add(uv_wheel())
    if doubles.knowledge()["lanes"][lane]["compiler"]["from"] == "nvidia-redist":
        indexes.redist = cuda_redist.build(indexes.main.root / REDIST_PATH, lane)
    if start:
        for server in indexes.all():
            server.start()
    return indexes


@dataclass
class Run:
    rc: int
    output: str
    # Operation name (the part after the deploy's name) -> this host's status line.
    statuses: dict[str, str] = field(default_factory=dict)

    def engine_ops(self) -> dict[str, str]:
        return {k: v for k, v in self.statuses.items() if k.startswith("Engine:")}

    def status(self, part: str) -> str:
        """The status line of the first operation whose name contains `part`; "not run"."""
        return next((v for k, v in self.statuses.items() if part in k), "not run")

    def __str__(self) -> str:
        return f"rc={self.rc}\n{self.output[-6000:]}"


_STATUS = re.compile(r"^(Success|No changes|Error|Skipped)\b")
_STARTING = re.compile(r"^--> Starting operation: (?:(?P<deploy>.*) \| )?(?P<op>.+?)\s*$")
# The steps whose operations are named without their step (pyinfra prints "Engine | install"):
# keyed "Engine: install" here, as the tests name them; "Serve | Router: ..." stays "Router: ...".
_KEYED_BY_STEP = ("Engine", "Serve", "Smoke")
_NAMED = re.compile(r"^[A-Z][A-Za-z]+: ")


def parse_statuses(output: str, host_name: str) -> dict[str, str]:
    """pyinfra's log: '--> Starting operation: DEPLOY | OP' then '[host] Success' etc."""
    statuses: dict[str, str] = {}
    op: str | None = None
    prefix = f"[{host_name}] "
    for raw in output.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw).strip()
        started = _STARTING.match(line)
        if started:
            op = started.group("op")
            step = started.group("deploy")
            if step in _KEYED_BY_STEP and not _NAMED.match(op):
                op = f"{step}: {op}"
            continue
        if op and line.startswith(prefix):
            status = line[len(prefix) :]
            if _STATUS.match(status):
                statuses[op] = status
    return statuses


@dataclass
class Deploying:
    """A deploy started in the background (to interrupt it, or to run two at once)."""

    proc: subprocess.Popen[str]
    host_name: str

    def finish(self, timeout: float = DEPLOY_TIMEOUT_S) -> Run:
        output, _ = self.proc.communicate(timeout=timeout)
        return Run(self.proc.returncode, output, parse_statuses(output, self.host_name))

    def kill(self) -> None:
        """The pyinfra we started, by its PID: no chance to clean up, like a power cut."""
        self.proc.kill()
        self.proc.communicate(timeout=30)


def start_deploy(
    tmp_path: Path,
    data: dict[Container, dict[str, Any]],
    *args: str,
    deploy_file: str = "deploy.py",
    inventory: str = "inventory.py",
    env: dict[str, str] | None = None,
    repo: Path = REPO,
) -> Deploying:
    """`pyinfra -y INVENTORY DEPLOY_FILE ARGS` over the containers, started; deploy_file is
    relative to the repository (deploy.py, pve.py, tests/e2e/...); repo: another tree of this
    repository (an earlier version's, tests/e2e/test_upgrade.py), run with this one's venv."""
    path = inventory_file(tmp_path, data, filename=inventory)
    proc = subprocess.Popen(
        [str(PYINFRA), "-y", str(path), str(repo / deploy_file), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=repo,
        # rich sizes its tables to COLUMNS when not on a terminal: wide enough that no cell wraps.
        env={**os.environ, "COLUMNS": "1000", **(env or {})},
    )
    return Deploying(proc, next(iter(data)).name)


def run_deploy(
    tmp_path: Path,
    data: dict[Container, dict[str, Any]],
    *args: str,
    deploy_file: str = "deploy.py",
    inventory: str = "inventory.py",
    env: dict[str, str] | None = None,
    timeout: float = DEPLOY_TIMEOUT_S,
    repo: Path = REPO,
) -> Run:
    """`pyinfra -y INVENTORY deploy.py` over the containers, to its end; statuses are the
    first host's."""
    started = start_deploy(
        tmp_path, data, *args, deploy_file=deploy_file, inventory=inventory, env=env, repo=repo
    )
    try:
        return started.finish(timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        raise


BENCH_RELEASE = "0.5.11"
BENCH_MODEL_DIR = "/srv/models/qwen"


@contextmanager
def bench_hosts(work: Path, count: int) -> Iterator[tuple[Indexes, list[Container]]]:
    """What the deploy benches share: the cu128 indexes on loopback with the double wheels of
    BENCH_RELEASE, and `count` testbed containers (8 RTX PRO 6000 doubles each) with a tiny
    model at BENCH_MODEL_DIR. Indexes and containers are stopped on the way out."""
    from tests.testbed import ContainerSpec, Testbed, ensure_testbed

    indexes: Indexes | None = None
    bed: Testbed | None = None
    try:
        built = doubles.release_wheels(work / "wheels", BENCH_RELEASE, LANE)
        indexes = make_indexes(work / "index", {BENCH_RELEASE: built})
        bed = Testbed(ensure_testbed())
        spec = ContainerSpec(
            extra_files={
                f"{BENCH_MODEL_DIR}/config.json": MODEL_CONFIG,
                f"{BENCH_MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
            }
        )
        yield indexes, bed.boot(*[spec] * count)
    finally:
        if indexes is not None:
            for index in indexes.all():
                index.stop()
        if bed is not None:
            bed.close()
