"""A first air-gapped deploy, end to end, as docs/how-to/air-gap.md walks through it: the engine
is locked on the controller with no host (`python -m operations.lock`), the wheelhouse is filled
from that lock alone for the host's one Python, with the default gateway (smg, `--router`) and
uv (scripts/fill_wheelhouse.py), every index goes down, and the real deploy installs the engine
and the router from the wheelhouse with no index at all, then serves behind the router with an
API key.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from operations import kb as kbmod
from operations.kb.pins import router_file
from operations.plan.engine_spec import engine_spec
from operations.settings import Layer, Router, load
from tests import testbed as tb
from tests.doubles import wheels as doubles
from tests.e2e.deploying import LANE, MODEL_CONFIG, Indexes, make_indexes, run_deploy
from tests.e2e.index import UV_VERSION, pinned_wheels
from tests.e2e.serving import http
from tests.testbed import Container, ContainerSpec, inventory_file

pytestmark = pytest.mark.e2e

RELEASE = "0.5.11"
MODEL_DIR = "/mnt/models/Qwen3.6-27B"
ROOT = "/opt/sglang-airgapped"
ROUTER_PORT = 8000
ROUTER_VERSION = Router(host="").version  # the settings' default: smg 1.13.0
API_KEY = "sk-airgap-5d1e8c3a9b7f2046"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    out = tmp_path_factory.mktemp("wheels")
    made = make_indexes(
        tmp_path_factory.mktemp("index"), {RELEASE: doubles.release_wheels(out, RELEASE, LANE)}
    )
    # The real gateway's wheels on the main index, as on PyPI: one file per name, so a package
    # both the engine's lock and smg's pins name (setproctitle) is the same file in both.
    made.main.add(*pinned_wheels(router_file(ROUTER_VERSION, "3.11", "smg")))
    yield made
    for index in made.all():
        index.stop()


@pytest.fixture(scope="module")
def target(testbed: tb.Testbed) -> Iterator[Container]:
    (container,) = testbed.boot(
        ContainerSpec(extra_files={f"{MODEL_DIR}/config.json": MODEL_CONFIG})
    )
    yield container
    testbed.destroy(container)


def controller(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )


def test_lock_on_the_controller_fill_the_wheelhouse_then_deploy_with_every_index_down(
    target: Container, indexes: Indexes, tmp_path: Path
) -> None:
    key_file = tmp_path / "api.key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)
    data = {
        **indexes.data(),
        "model_source": MODEL_DIR,
        "dp_size": 1,
        "engine_root": ROOT,
        # The default gateway (smg; no version: the settings' default) in front, with a key.
        "router": {"host": target.name, "port": ROUTER_PORT, "bind": target.address},
        "server_host": target.address,
        "api_key_file": str(key_file),
    }
    inventory = inventory_file(tmp_path, {target: data})
    settings = load("t", [Layer("t", {"model_source": MODEL_DIR})])
    name = engine_spec(settings, kbmod.load(), "3.11").name
    lock = tmp_path / "locks" / f"{name}.lock"

    # 1. The lock, made on the controller: no host is asked.
    made = controller("-m", "operations.lock", str(inventory), "--python", "3.11", cwd=REPO)
    assert made.returncode == 0, made.stderr
    assert f"{name}: locked for Python 3.11" in made.stdout
    text = lock.read_text()
    assert 'requires-python = "==3.11.*"' in text, text[:400]
    assert target.ssh_run(f"test -e {ROOT}")[0] == 1, "locking touched the host"
    wrong = controller("-m", "operations.lock", str(inventory), "--python", "3.13", cwd=REPO)
    assert wrong.returncode == 1 and "not built for Python 3.13" in wrong.stderr, wrong.stderr

    # 2. The wheelhouse: exactly the lock's wheels, for the host's Python alone.
    house = tmp_path / "wheelhouse"
    filled = controller(
        str(REPO / "scripts" / "fill_wheelhouse.py"),
        str(lock),
        str(house),
        "--python",
        "3.11",
        "--uv",
        UV_VERSION,
        # The router of the settings' default router.version (smg 1.13.0) and its wheels.
        "--router",
        # The lane's compiler archives (the lane from the lock's name) from the double of
        # NVIDIA's redist, checked against its manifest (as setting cuda_redist_manifest).
        "--cuda-url",
        data["cuda_redist_url"],
        "--cuda-manifest",
        data["cuda_redist_manifest"],
        cwd=REPO,
    )
    assert filled.returncode == 0, filled.stderr
    # The host's Python alone (a stable-ABI wheel, e.g. the router's protobuf cp310-abi3,
    # serves 3.11 too).
    other = [w for w in house.glob("*.whl") if "-abi3-" not in w.name]
    assert not [w for w in other if "-cp312-" in w.name or "-cp310-" in w.name]
    # The gateway: smg itself and every wheel its pins name (grpcio, protobuf...), not
    # sglang-router.
    assert [w.name for w in house.glob("smg-*.whl")], sorted(w.name for w in house.iterdir())
    assert not list(house.glob("sglang_router-*.whl"))
    assert [w.name for w in house.glob("grpcio_health_checking-*.whl")]
    # FlashInfer's prebuilt modules for the lane are in the lock, so in the wheelhouse too.
    assert [w.name for w in house.glob("flashinfer_jit_cache-*.whl")] == [
        "flashinfer_jit_cache-0.6.8.post1+cu128-py3-none-any.whl"
    ]
    # ... and beside it the compiler's archives by file name, where the offline deploy looks.
    assert indexes.redist is not None
    assert sorted(p.name for p in (tmp_path / "cuda-redist").iterdir()) == sorted(
        p.name for p in indexes.redist.archives
    )

    # 3. Air-gapped: every index down; the deploy installs the controller's lock offline.
    for index in indexes.all():
        index.stop()
    try:
        run = run_deploy(tmp_path, {target: {**data, "wheelhouse": str(house)}})
    finally:
        for index in indexes.all():
            index.start()

    assert run.rc == 0, str(run)
    rc, installed, _ = target.ssh_run(f"cat {ROOT}/envs/{name}/uv.lock")
    assert rc == 0 and installed == text, "the host installed another lock than the controller's"
    rc, out, err = target.ssh_run(
        f"{ROOT}/current/bin/python -c 'import sglang, torch; print(sglang.__version__, "
        "torch.__version__)'"
    )
    assert (rc, out.split()) == (0, [RELEASE, "2.11.0+cu128"]), err
    rc, out, err = target.ssh_run(
        f"{ROOT}/current/bin/python -c 'import flashinfer_jit_cache as j; print(j.__version__)'"
    )
    assert (rc, out.strip()) == (0, "0.6.8.post1+cu128"), err
    rc, out, err = target.ssh_run(f"{ROOT}/cuda/*/bin/nvcc --version")
    assert rc == 0 and "release 12.8, V12.8.93" in out, out + err

    # The router came from the wheelhouse too (every index was down): smg 1.13.0, serving.
    rc, out, err = target.ssh_run(f"ls {ROOT}/router")
    assert (rc, out.split()) == (0, [f"smg-{ROUTER_VERSION}"]), err
    gateway = f"http://{target.address}:{ROUTER_PORT}"
    code, body = http(
        f"{gateway}/v1/chat/completions",
        {"model": "Qwen/Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}]},
        key=API_KEY,
    )
    assert code == 200 and body["model"] == "Qwen/Qwen3.6-27B", (code, body)
