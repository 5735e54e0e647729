"""What the deploy benches share (bench/serve_bench.py, bench/roll_bench.py): the pyinfra run
as a user's shell makes it, timed; each host's data; the paired rounds and their median ratio;
the slow-rank drop-in and the router's pinned wheels the roll tests use too."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from operations.kb.pins import router_file
from tests.e2e.deploying import BENCH_MODEL_DIR, BENCH_RELEASE, Indexes, bench_hosts
from tests.e2e.index import pinned_wheels, stop_process
from tests.testbed import Container

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY_TIMEOUT_S = 900
ROUTER_RELEASE = "1.13.0"  # smg, the router the deploy installs by default
# A runtime drop-in every rank unit reads and no unit file names (the SGLang double reads it).
SLOW_DROPIN = "/run/systemd/system/sglang@.service.d"

# As a user's shell runs it: Python writes bytecode, so from the second run on neither side
# compiles this repository's modules again (this workplace sets PYTHONDONTWRITEBYTECODE, under
# which every run paid for compiling them, the full deploy more than the trivial one). pyinfra's
# CLI turns bytecode writing off in its own process; operations/__init__.py turns it back on for
# our package, so this holds for the deploy's modules too.
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

_running: list[subprocess.Popen[str]] = []


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    # SIGTERM ends the bench like Ctrl-C does: through the `finally` that stops everything.
    raise KeyboardInterrupt


def bench_main(
    name: str, hosts: int, measure: Callable[[Path, Indexes, list[Container]], int]
) -> int:
    """A deploy bench's main: root or skipped; `hosts` bench containers and their indexes
    (deploying.bench_hosts) in a temporary directory for `measure`; on the way out (Ctrl-C and
    SIGTERM included) every deploy it started stopped by PID, then the containers."""
    if os.geteuid() != 0:
        print(f"{name}: needs root (systemd-nspawn testbed); skipped")
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp,
            bench_hosts(Path(tmp), hosts) as (indexes, containers),
        ):
            try:
                return measure(Path(tmp), indexes, containers)
            finally:
                # A second Ctrl-C must not cut the cleanup short.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                for proc in list(_running):
                    stop_process(proc)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; containers and index servers stopped", file=sys.stderr)
        return 130


def pyinfra(inventory: Path, deploy_file: Path, *args: str) -> tuple[float, str]:
    """Run one deploy to the end; its wall time and output. Fails loudly when it fails."""
    started = time.monotonic()
    # Its own session: Ctrl-C reaches the bench only, which then stops this run by PID.
    proc = subprocess.Popen(
        [str(PYINFRA), "-y", str(inventory), str(deploy_file), *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=USER_ENV,
    )
    _running.append(proc)
    try:
        output, _ = proc.communicate(timeout=DEPLOY_TIMEOUT_S)
    finally:
        stop_process(proc)
        _running.remove(proc)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{deploy_file.name} failed (rc {proc.returncode}):\n{output[-4000:]}")
    return elapsed, output


def host_data(container: Container, indexes: Indexes, **extra: Any) -> dict[str, Any]:
    """A bench host's data: BENCH_RELEASE, the tiny model, 8 ranks on its own address."""
    return {
        **indexes.data(),
        "sglang_version": BENCH_RELEASE,
        "model_source": BENCH_MODEL_DIR,
        "dp_size": 8,
        # Containers share the network namespace: each binds its own loopback address.
        "server_host": container.address,
        "health_timeout_s": 120,
        "ram_per_rank_gb": 0.25,
        **extra,
    }


def slow_ranks(container: Container, generate_s: float, load_s: float) -> None:
    """Each chat request takes `generate_s` and each (re)start loads for `load_s` (a runtime
    drop-in the SGLang double reads), so a roll has requests in flight to drain."""
    slow = (
        f"mkdir -p {SLOW_DROPIN} && printf '[Service]\\n"
        f"Environment=SGLANG_DOUBLE_GENERATE_SECONDS={generate_s}\\n"
        f"Environment=SGLANG_DOUBLE_LOAD_SECONDS={load_s}\\n' > {SLOW_DROPIN}/load.conf"
        " && systemctl daemon-reload"
    )
    rc, _, err = container.ssh_run(slow)
    if rc != 0:
        raise RuntimeError(f"{container.name}: the slow-rank drop-in failed: {err}")


def router_wheels() -> list[Path]:
    """The real router (smg) and its dependencies: exactly the pinned set (operations/kb/pins),
    which the deploy installs with --require-hashes."""
    return pinned_wheels(router_file(ROUTER_RELEASE, "3.11", "smg"))


def paired(sides: Sequence[tuple[str, Callable[[], float]]], rounds: int) -> dict[str, list[float]]:
    """Each side's times over `rounds` rounds, A B then B A...: a round's runs are neighbours
    in time, and the order turns each round so a drift hits every side alike."""
    runs: dict[str, list[float]] = {name: [] for name, _ in sides}
    for number in range(rounds):
        by = number % len(sides)
        for name, side in [*sides[by:], *sides[:by]]:
            runs[name].append(side())
    return runs


def pair_ratio(runs: dict[str, list[float]], top: str, bottom: str) -> float:
    """The median of each round's top / bottom."""
    return statistics.median(t / b for t, b in zip(runs[top], runs[bottom], strict=True))


def spread(values: Sequence[float]) -> str:
    """min-max of a series of ratios, for the noise the report states."""
    return f"{min(values):.2f}-{max(values):.2f}"
