"""What the serving end-to-end tests share (tests/e2e/test_serve.py, test_status.py, test_tune.py
and others): the release and model they deploy, the package indexes holding the SGLang server
double and the real router, and helpers that deploy with the real `pyinfra -y INVENTORY
deploy.py` and look at the ranks from outside (their units, their /health while a run goes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.kb.pins import router_file
from tests.doubles import wheels as doubles
from tests.e2e.deploying import (
    LANE,
    MODEL_CONFIG,
    REPO,
    Indexes,
    Run,
    make_indexes,
    run_deploy,
)
from tests.e2e.index import pinned_wheels
from tests.testbed import Container, ContainerSpec, Testbed

RELEASE = "0.5.11"
MODEL_DIR = "/srv/models/qwen"
# A model directory with a tokenizer file: the load client (programs/tokenizer_files.py) needs
# one, so the throughput, canary and tune tests serve this one.
TOKENIZED_MODEL_DIR = "/srv/models/qwen-tok"
ROUTER_PORT = 8000


def release_indexes(
    tmp_path_factory: pytest.TempPathFactory, name: str, releases: tuple[str, ...]
) -> Iterator[Indexes]:
    """The package indexes for a serving test: each release's wheel doubles, and the real
    routers (smg 1.13.0, sglang-router 0.3.2) and their web stacks from PyPI, served like
    everything else: exactly the pinned sets (operations/kb/pins), which the deploy installs
    with --require-hashes. Stopped after."""
    out = tmp_path_factory.mktemp(f"{name}-wheels")
    made = make_indexes(
        tmp_path_factory.mktemp(f"{name}-index"),
        {r: doubles.release_wheels(out / r, r, LANE) for r in releases},
    )
    # Both routers: smg (the default) and sglang-router 0.3.2 (a host moving from it, or back).
    made.main.add(*pinned_wheels(router_file("1.13.0", "3.11", "smg")))
    made.main.add(*pinned_wheels(router_file("0.3.2", "3.11")))
    yield made
    for index in made.all():
        index.stop()


@pytest.fixture(scope="module", name="indexes")
def serving_indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    yield from release_indexes(tmp_path_factory, "serve", (RELEASE,))


def base_data(container: Container, indexes: Indexes, **extra: Any) -> dict[str, Any]:
    return {
        **indexes.data(),
        "sglang_version": RELEASE,
        "model_source": MODEL_DIR,
        # Each container binds its own loopback address: they share the network namespace.
        "server_host": container.address,
        "health_timeout_s": 120,
        "ram_per_rank_gb": 0.25,
        **extra,
    }


def deploy(tmp_path: Path, data: dict[Container, dict[str, Any]], *args: str) -> Run:
    return run_deploy(tmp_path, data, *args)


def ok(run: Run) -> None:
    assert run.rc == 0, str(run)


def serve_ops(run: Run) -> dict[str, str]:
    return {k: v for k, v in run.statuses.items() if k.startswith(("Serve:", "Router:"))}


def unit_states(c: Container, ranks: range) -> dict[int, tuple[str, int]]:
    """rank -> (ActiveState, MainPID)."""
    states = {}
    for rank in ranks:
        _, out, _ = c.ssh_run(f"systemctl show sglang@{rank}.service -p ActiveState -p MainPID")
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        states[rank] = (props.get("ActiveState", ""), int(props.get("MainPID") or 0))
    return states


def http(url: str, body: dict[str, Any] | None = None, key: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if body else "GET")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read().decode()
            try:
                return response.status, json.loads(raw)
            except ValueError:
                return response.status, raw  # the router's /health says "OK"
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, OSError):
        return 0, None  # nothing listening (yet)


def requests_served(c: Container, port: int) -> int:
    """Chat requests a rank has served, from its /metrics: SGLang's sglang:num_requests_total
    counter (the double counts it as SGLang does: tests/doubles/packages/sglang)."""
    status, text = http(f"http://{c.address}:{port}/metrics")
    assert status == 200, (c.name, port, status)
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.]+)$", str(text), re.M)
    assert match, text
    return int(float(match.group(1)))


def health(c: Container, port: int) -> int:
    return http(f"http://{c.address}:{port}/health")[0]


def converge(tmp_path: Path, c: Container, indexes: Indexes, **extra: Any) -> Run:
    run = deploy(tmp_path, {c: base_data(c, indexes, **extra)})
    ok(run)
    return run


def serving_spec() -> ContainerSpec:
    """A GPU-shaped container (8 x RTX PRO 6000 double) holding a tiny model at MODEL_DIR."""
    return ContainerSpec(
        extra_files={
            f"{MODEL_DIR}/config.json": MODEL_CONFIG,
            f"{MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
        }
    )


STATUS_TIMEOUT_S = 180


def status_inventory(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    """An inventory file for `python -m operations.status`: host name -> its data."""
    path = tmp_path / "status-inventory.py"
    entries = "".join(f"    ({name!r}, {data!r}),\n" for name, data in hosts.items())
    path.write_text(f"testbed = [\n{entries}]\n")
    return path


def run_status(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m operations.status INVENTORY ARGS` as a user runs it; never a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "operations.status", str(inventory), *args],
        capture_output=True,
        text=True,
        timeout=STATUS_TIMEOUT_S,
        cwd=REPO,
        check=False,
        # As a log file gets it: no width said, the wide table (a COLUMNS is kept, as a terminal's).
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@dataclass
class HealthWatch:
    """Each rank's /health (UNIT -> URL) asked from outside every `every_s` while the block
    runs: which ranks were ever down and the most down at once (a tune or a roll may take one
    rank out; the others must serve throughout). An observer, not a synchronisation: nothing
    waits on it."""

    urls: dict[str, str]
    every_s: float = 0.5
    down_ever: set[str] = field(default_factory=set)
    most_down: int = 0
    asked: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @staticmethod
    def healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return int(resp.status) == 200
        except (OSError, ValueError):
            return False

    def _watch(self) -> None:
        while not self.stop.wait(self.every_s):
            down = {unit for unit, url in self.urls.items() if not self.healthy(url)}
            self.down_ever |= down
            self.most_down = max(self.most_down, len(down))
            self.asked += 1

    def __enter__(self) -> HealthWatch:
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


def health_urls(c: Container, dp_size: int, base_port: int = 30000) -> dict[str, str]:
    """Each rank's /health as the test reaches it (the ranks bind the container's address;
    base_port: the setting's default)."""
    return {
        layout.unit_name(r): layout.health_url(c.address, base_port + r) for r in range(dp_size)
    }


def tokenized_model_host(testbed: Testbed) -> Iterator[Container]:
    """One testbed container holding TOKENIZED_MODEL_DIR (a module fixture's body: boots it,
    yields it, destroys it)."""
    spec = ContainerSpec(
        extra_files={
            f"{TOKENIZED_MODEL_DIR}/config.json": MODEL_CONFIG,
            f"{TOKENIZED_MODEL_DIR}/tokenizer.json": b"{}",
            f"{TOKENIZED_MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
        }
    )
    (container,) = testbed.boot(spec)
    yield container
    testbed.destroy(container)
