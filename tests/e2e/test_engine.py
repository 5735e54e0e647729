"""The engine step end to end: real `pyinfra -y INVENTORY deploy.py` runs against a testbed
container, installing the double wheels (tests/doubles/wheels.py) from package indexes served on
loopback and laid out like the real ones (tests/e2e/deploying.py make_indexes: no cu128
sglang-kernel, dev builds of sglang on the kernel index, a lagging mirror on PyTorch's).

One container serves the whole module; every test uses its own engine_root on it, so each test
sets up the state it needs and no test depends on another's order.
"""

from __future__ import annotations

import json
import shlex
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import kb as kbmod
from operations.facts.engine import MARKER
from operations.layout import ENGINE_PROVEN
from operations.plan.engine_spec import Toolkit, engine_spec, read_redist_manifest
from operations.settings import Layer, load
from tests import testbed as tb
from tests.doubles import cuda_redist
from tests.doubles import wheels as doubles
from tests.e2e.deploying import (
    LANE,
    MAIN_TYPING_EXTENSIONS,
    MODEL_CONFIG,
    Indexes,
    Run,
    make_indexes,
    run_deploy,
    support_wheels,
)
from tests.e2e.index import LocalIndex, free_port, pypi_wheel, uv_wheel, wait_for, wheelhouse
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

OLD, NEW = "0.5.11", "0.5.19"  # both publish a cu128 lane and serve Qwen3.6
MODEL_DIR = "/mnt/models/Qwen3.6-27B"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def double_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    out = tmp_path_factory.mktemp("wheels")
    return {release: doubles.release_wheels(out / release, release, LANE) for release in (OLD, NEW)}


@pytest.fixture(scope="module")
def indexes(
    tmp_path_factory: pytest.TempPathFactory, double_wheels: dict[str, dict[str, Path]]
) -> Iterator[Indexes]:
    out = tmp_path_factory.mktemp("wheels-cu130")
    cu130 = {OLD: doubles.release_wheels(out, OLD, "cu130")}
    made = make_indexes(
        tmp_path_factory.mktemp("index"), double_wheels, other_lanes={"cu130": cu130}
    )
    yield made
    for index in made.all():
        index.stop()


@pytest.fixture(scope="module")
def target(testbed: tb.Testbed) -> Iterator[Container]:
    """One GPU-shaped container (8 x RTX PRO 6000 double) holding a model directory."""
    (container,) = testbed.boot(
        ContainerSpec(extra_files={f"{MODEL_DIR}/config.json": MODEL_CONFIG})
    )
    yield container
    testbed.destroy(container)


# -- running the deploy ---------------------------------------------------------------------


def deploy(container: Container, tmp_path: Path, data: dict[str, Any], *args: str) -> Run:
    host_data = {
        "model_source": MODEL_DIR,
        "dp_size": 1,
        "engine_lock_dir": str(tmp_path / "locks"),
        **data,
    }
    return run_deploy(tmp_path, {container: host_data}, *args)


def env_name(release: str, **data: Any) -> str:
    settings = load(
        "t", [Layer("t", {"model_source": MODEL_DIR, "sglang_version": release, **data})]
    )
    name: str = engine_spec(settings, kbmod.load()).name
    return name


def toolkit(indexes: Indexes) -> Toolkit:
    """The compiler the engine step installs from the double of NVIDIA's archives."""
    data = indexes.data()
    settings = load("t", [Layer("t", {"model_source": MODEL_DIR, **data})])
    manifest = read_redist_manifest(data["cuda_redist_manifest"])
    tools = engine_spec(settings, kbmod.load(), None, manifest).toolkit
    assert tools is not None
    return tools


def toolkit_ops(indexes: Indexes) -> dict[str, str]:
    """The compiler's operations of a converged run (the apt packages in the testbed image,
    the toolkit from the double of NVIDIA's archives) -> "No changes"."""
    return {
        "Engine: libnuma1 and g++": "No changes",
        f"Engine: nvcc {toolkit(indexes).version}": "No changes",
    }


def sh(container: Container, cmd: str) -> str:
    rc, out, err = container.ssh_run(cmd)
    assert rc == 0, f"{cmd}: rc={rc}\n{out}\n{err}"
    return out.strip()


def current(container: Container, root: str) -> str | None:
    rc, out, _ = container.ssh_run(f"readlink {shlex.quote(root + '/current')}")
    return out.strip() if rc == 0 else None


def envs(container: Container, root: str) -> dict[str, bool]:
    """Environment name -> complete (has its marker)."""
    out = sh(
        container,
        f"cd {shlex.quote(root)}/envs 2>/dev/null && for d in */; do d=${{d%/}}; "
        f'[ -f "$d/{MARKER}" ] && echo "$d 1" || echo "$d 0"; done; true',
    )
    return {line.split()[0]: line.split()[1] == "1" for line in out.splitlines() if line.strip()}


def installed_versions(container: Container, root: str) -> tuple[str, str, str]:
    out = sh(
        container,
        f"{root}/current/bin/python -c 'import sglang, torch; "
        "print(sglang.__version__, torch.__version__, torch.version.cuda)'",
    )
    sglang, torch, cuda = out.split()
    return sglang, torch, cuda


def dead_indexes(indexes: Indexes, dead: str) -> dict[str, Any]:
    """The testbed's data with every index at `dead` (nothing listens there): only what is
    already on the host or in a wheelhouse can be installed. The rest of the data stays the
    testbed's own (its throughput_check: off among it)."""
    return {
        **indexes.data(),
        "package_index_url": dead + "/simple",
        "torch_index_url": dead + "/{lane}",
        "kernel_index_url": dead + "/{lane}",
        "flashinfer_index_url": dead + "/{lane}",
        "cuda_redist_url": dead,
    }


def ok(run: Run) -> None:
    assert run.rc == 0, str(run)
    failed = {
        k: v for k, v in run.engine_ops().items() if not v.startswith(("Success", "No changes"))
    }
    assert not failed, f"{failed}\n{run}"


# -- tests ----------------------------------------------------------------------------------


def test_fresh_install_then_a_second_run_changes_nothing(
    target: Container, indexes: Indexes, tmp_path: Path
) -> None:
    root = "/opt/sglang-fresh"
    data = {**indexes.data(), "engine_root": root, "sglang_version": OLD}

    first = deploy(target, tmp_path, data)

    ok(first)
    name = env_name(OLD)
    assert current(target, root) == f"envs/{name}"
    assert envs(target, root) == {name: True}
    assert installed_versions(target, root) == (OLD, "2.11.0+cu128", "12.8")
    # Each package from its own index: the kernel's cu129 build, the main index's
    # typing-extensions (not PyTorch's lagging mirror), never the kernel index's dev sglang;
    # FlashInfer's prebuilt modules for the lane from FlashInfer's index.
    found = sh(
        target,
        f"{root}/current/bin/python -c 'from importlib.metadata import version as v; "
        'print(v("sglang-kernel"), v("torchvision"), v("typing-extensions"), '
        'v("flashinfer-jit-cache"))\'',
    )
    assert found.split() == [
        "0.4.2+cu129",
        "0.26.0+cu128",
        MAIN_TYPING_EXTENSIONS,
        "0.6.8.post1+cu128",
    ]
    # The index URLs are in a root-only file, never on a command line.
    assert sh(target, f"stat -c %a {root}/projects/{name}/pyproject.toml") == "600"
    # The lock came back to the controller and is the environment's own.
    lock = tmp_path / "locks" / f"{name}.lock"
    assert lock.read_text() == sh(target, f"cat {root}/envs/{name}/uv.lock") + "\n"
    assert first.engine_ops()["Engine: switch current"] == "Success"
    # The compiler: apt finds libnuma1 and g++ in the image; nvcc from the redist double, whose
    # cubin the engine check ran on each GPU through the cuda-python double.
    (apt, nvcc) = toolkit_ops(indexes)
    assert first.engine_ops()[apt] == "No changes"
    assert first.engine_ops()[nvcc] == "Success"
    home = f"{root}/cuda/{toolkit(indexes).name}"
    assert "release 12.8, V12.8.93" in sh(target, f"{home}/bin/nvcc --version")
    # Issue 44: the check recorded that it passed on these GPUs, as the service user.
    record = json.loads(sh(target, f"cat {root}/envs/{name}/{ENGINE_PROVEN}"))
    assert record["user"] == "sglang" and record["gpus"] and record["driver"], record

    before = target.snapshot([root + "/envs", root + "/current"])
    requests_before = indexes.requests()
    second = deploy(target, tmp_path, data)

    ok(second)
    # So the plan says it is proven on this host's GPUs, with the day, not unproven.
    said = " ".join(second.output.split())
    assert f"proven on this host's GPUs on {record['date']}" in said, second
    assert "is unproven" not in said, second
    engine_ops = second.engine_ops()
    assert engine_ops == {
        **toolkit_ops(indexes),
        "Engine: compile caches of the engine": "No changes",
        "Engine: switch current": "No changes",
        "Engine: prune old environments": "No changes",
        "Engine: prune old compile caches": "No changes",
    }, second
    assert target.snapshot([root + "/envs", root + "/current"]) == before
    assert indexes.requests() == requests_before, "a converged run must download nothing"


def test_pin_change_switches_and_pin_back_is_instant_without_an_index(
    target: Container, indexes: Indexes, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = "/opt/sglang-pins"
    old, new = env_name(OLD), env_name(NEW)
    ok(deploy(target, tmp_path, {**indexes.data(), "engine_root": root, "sglang_version": OLD}))

    upgrade = deploy(
        target, tmp_path, {**indexes.data(), "engine_root": root, "sglang_version": NEW}
    )

    ok(upgrade)
    assert current(target, root) == f"envs/{new}"
    assert envs(target, root) == {old: True, new: True}
    assert installed_versions(target, root) == (NEW, "2.13.0+cu128", "12.8")

    # Every index is down: switching back can only work without downloading anything.
    dead = f"http://127.0.0.1:{free_port()}"
    offline = dead_indexes(indexes, dead)
    back = deploy(target, tmp_path, {**offline, "engine_root": root, "sglang_version": OLD})

    ok(back)
    assert set(back.engine_ops()) == {
        *toolkit_ops(indexes),
        "Engine: compile caches of the engine",
        "Engine: switch current",
        "Engine: prune old environments",
        "Engine: prune old compile caches",
    }
    assert back.engine_ops()["Engine: switch current"] == "Success"
    assert current(target, root) == f"envs/{old}"
    assert installed_versions(target, root)[0] == OLD


def test_wrong_lane_torch_is_refused_and_current_stays(
    target: Container,
    indexes: Indexes,
    double_wheels: dict[str, dict[str, Path]],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = "/opt/sglang-lane"
    ok(deploy(target, tmp_path, {**indexes.data(), "engine_root": root, "sglang_version": OLD}))
    serving = current(target, root)
    torch_version = str(kbmod.load().releases[NEW].pin("torch"))
    companions = [double_wheels[NEW]["torchvision"], double_wheels[NEW]["torchaudio"]]

    # 1. The cu128 index serves only a CUDA 13 torch: the lane-tagged pin cannot be met.
    cu130 = LocalIndex(tmp_path_factory.mktemp("cu130-in-cu128"))
    cu130.add(doubles.torch_wheel(tmp_path / "w130", f"{torch_version}+cu130"), sub=LANE)
    cu130.add(*companions, sub=LANE)
    cu130.start()
    try:
        run = deploy(
            target,
            tmp_path,
            {
                **indexes.data(),
                "torch_index_url": cu130.base + "/{lane}",
                "engine_root": root,
                "sglang_version": NEW,
            },
        )
    finally:
        cu130.stop()
    assert run.rc != 0, str(run)
    assert f"torch=={torch_version}+cu128" in run.output, str(run)
    assert current(target, root) == serving

    # 2. A torch labelled +cu128 that is a CUDA 13.0 build inside: the check names it.
    liar = LocalIndex(tmp_path_factory.mktemp("mislabelled"))
    liar.add(doubles.torch_wheel(tmp_path / "wliar", f"{torch_version}+{LANE}", "13.0"), sub=LANE)
    liar.add(*companions, sub=LANE)
    liar.start()
    try:
        run = deploy(
            target,
            tmp_path,
            {
                **indexes.data(),
                "torch_index_url": liar.base + "/{lane}",
                "engine_root": root,
                "sglang_version": NEW,
            },
        )
    finally:
        liar.stop()
    assert run.rc != 0, str(run)
    assert f"torch {torch_version}+cu128: torch.version.cuda is 13.0" in run.output, str(run)
    assert "The NVIDIA driver on your system is too old (found version 12080)" in run.output
    assert current(target, root) == serving
    assert envs(target, root)[env_name(NEW)] is False  # left partial, never pointed at
    rc, _, _ = target.ssh_run(f"test -e {root}/envs/{env_name(NEW)}/{ENGINE_PROVEN}")
    assert rc != 0, "a check that failed left a record that it passed"

    # 3. The next run with the right index removes the partial environment and succeeds.
    ok(deploy(target, tmp_path, {**indexes.data(), "engine_root": root, "sglang_version": NEW}))
    assert current(target, root) == f"envs/{env_name(NEW)}"
    assert envs(target, root) == {env_name(OLD): True, env_name(NEW): True}


def _health(container: Container, port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{container.address}:{port}/health", timeout=2) as r:
            return int(r.status)
    except OSError as exc:
        return int(getattr(exc, "code", 0) or 0)


def test_index_down_during_install_fails_and_the_running_server_is_untouched(
    target: Container,
    double_wheels: dict[str, dict[str, Path]],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = "/opt/sglang-fault"
    own = make_indexes(tmp_path_factory.mktemp("own-index"), double_wheels)
    port = 31000
    try:
        ok(deploy(target, tmp_path, {**own.data(), "engine_root": root, "sglang_version": OLD}))
        # A server of the double, run from `current` like the serve step's units.
        sh(
            target,
            f"systemd-run --unit=sglang-engine-test -E CUDA_VISIBLE_DEVICES=0 "
            f"-E SGLANG_DOUBLE_LOAD_SECONDS=0 {root}/current/bin/python -m sglang.launch_server "
            f"--model-path {MODEL_DIR} --host {target.address} --port {port}",
        )
        wait_for(lambda: _health(target, port) == 200, 30, "the double server's /health")
        pid = sh(target, "systemctl show -p MainPID --value sglang-engine-test")

        own.kernel.stop()  # the kernel index goes away while the new release is installed
        run = deploy(target, tmp_path, {**own.data(), "engine_root": root, "sglang_version": NEW})

        assert run.rc != 0, str(run)
        assert "Engine: lock" in " ".join(
            k for k, v in run.statuses.items() if v.startswith("Error")
        ), str(run)
        assert current(target, root) == f"envs/{env_name(OLD)}"
        assert sh(target, "systemctl show -p MainPID --value sglang-engine-test") == pid
        assert _health(target, port) == 200
        assert not envs(target, root).get(env_name(NEW))  # never complete, never current

        own.kernel.start()
        ok(deploy(target, tmp_path, {**own.data(), "engine_root": root, "sglang_version": NEW}))
        assert envs(target, root) == {env_name(OLD): True, env_name(NEW): True}
        assert current(target, root) == f"envs/{env_name(NEW)}"
    finally:
        target.ssh_run(
            "systemctl stop sglang-engine-test; systemctl reset-failed sglang-engine-test"
        )
        for index in own.all():
            index.stop()


def test_offline_install_from_the_wheelhouse(
    target: Container,
    indexes: Indexes,
    double_wheels: dict[str, dict[str, Path]],
    tmp_path: Path,
) -> None:
    root = "/opt/sglang-offline"
    dead = f"http://127.0.0.1:{free_port()}"
    offline = {
        **dead_indexes(indexes, dead),
        "engine_root": root,
        "sglang_version": OLD,
    }
    # The compiler's archives beside both wheelhouses, as `wget` of the manifest's URLs leaves
    # them (docs/how-it-works/engine.md).
    assert indexes.redist is not None
    redist = cuda_redist.flat(indexes.redist, tmp_path / "cuda-redist")
    partial = wheelhouse(
        tmp_path / "partial",
        [p for role, p in double_wheels[OLD].items() if role != "kernel"]
        + [uv_wheel(), *support_wheels(tmp_path / "graph", OLD)],
    )

    refused = deploy(target, tmp_path, {**offline, "wheelhouse": str(partial)})

    assert refused.rc != 0, str(refused)
    assert "no wheel for sglang-kernel==0.4.2+cu129" in refused.output, str(refused)
    assert target.ssh_run(f"test -e {root}")[0] == 1, "a refused wheelhouse changes nothing"

    full = wheelhouse(
        tmp_path / "full",
        [*double_wheels[OLD].values(), uv_wheel(), *support_wheels(tmp_path / "graph", OLD)],
    )
    run = deploy(target, tmp_path, {**offline, "wheelhouse": str(full)})

    ok(run)
    assert current(target, root) == f"envs/{env_name(OLD)}"
    assert installed_versions(target, root) == (OLD, "2.11.0+cu128", "12.8")
    synced = sh(target, f"ls {root}/wheelhouse").split()
    assert sorted(synced) == sorted(p.name for p in full.glob("*.whl"))
    # FlashInfer's prebuilt modules came from the wheelhouse too.
    assert "flashinfer_jit_cache-0.6.8.post1+cu128-py3-none-any.whl" in synced
    jit = sh(
        target,
        f"{root}/current/bin/python -c 'import flashinfer; print(flashinfer.FLASHINFER_AOT_DIR)'",
    )
    assert jit.endswith("/site-packages/flashinfer_jit_cache/jit_cache"), jit
    uploaded = sh(target, f"ls {root}/cuda-redist").split()
    assert sorted(uploaded) == sorted(p.name for p in redist.iterdir())
    (_, nvcc) = toolkit_ops(indexes)
    assert run.engine_ops()[nvcc] == "Success"


def test_a_second_host_installs_the_recorded_lock(
    target: Container, indexes: Indexes, tmp_path: Path
) -> None:
    first, second = "/opt/sglang-lock-a", "/opt/sglang-lock-b"
    ok(deploy(target, tmp_path, {**indexes.data(), "engine_root": first}))
    lock = tmp_path / "locks" / f"{env_name(OLD)}.lock"
    # Marked so that only an install from this very file can carry the mark.
    lock.write_text("# recorded by the first host\n" + lock.read_text())

    run = deploy(target, tmp_path, {**indexes.data(), "engine_root": second})

    ok(run)
    installed = sh(target, f"cat {second}/envs/{env_name(OLD)}/uv.lock")
    assert installed.startswith("# recorded by the first host"), installed[:200]
    assert installed_versions(target, second) == (OLD, "2.11.0+cu128", "12.8")


def test_cu130_on_a_580_driver_host_converges_from_the_indexes(
    boot_containers: tb.BootContainers, indexes: Indexes, tmp_path: Path
) -> None:
    (host580,) = boot_containers(
        ContainerSpec(
            scenario="rtx-pro-6000-x8-driver-580",
            extra_files={f"{MODEL_DIR}/config.json": MODEL_CONFIG},
        )
    )
    root = "/opt/sglang-cu130"
    # The cu130 compiler is PyPI's real nvcc 13.0.88 and its four companion wheels (cached
    # once on this machine, tests/e2e/index.py pypi_wheel), served at their PyPI file paths as
    # cuda_wheels_url and checked against the knowledge base's sha256: no manifest. The real
    # nvcc compiles sm_120a in the container; its cubin runs on the cuda-python double.
    compiler = kbmod.load().lanes["cu130"].compiler
    assert compiler is not None
    files = indexes.main.root / "pypi-files"
    for archive in compiler.archives:
        (files / archive.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pypi_wheel(archive.name, archive.version), files / archive.path)
    data = {
        **indexes.data(),
        "engine_root": root,
        "cuda_lane": "cu130",
        "cuda_redist_manifest": None,
        "cuda_wheels_url": f"{indexes.main.base}/pypi-files",
        # Its own address: the testbed's containers share this machine's network namespace,
        # and the module's other container serves rank 0 on 127.0.0.1:30000 (with a listener
        # another unit holds, the health wait now refuses, as it must).
        "server_host": host580.address,
    }

    ok(deploy(host580, tmp_path, data))

    assert installed_versions(host580, root) == (OLD, "2.11.0+cu130", "13.0")
    again = deploy(host580, tmp_path, data)
    ok(again)
    assert set(again.engine_ops().values()) == {"No changes"}, again


def test_the_check_runs_as_the_service_user_in_a_user_namespaced_container(
    boot_containers: tb.BootContainers, indexes: Indexes, tmp_path: Path
) -> None:
    """An unprivileged-Proxmox-like guest (user namespace, real 0666 character nodes, as
    `pct set --devN ...,mode=0666` leaves them): the engine check's transient unit, as the
    service user with a rank's sandbox, starts there and passes."""
    (guest,) = boot_containers(
        ContainerSpec(
            private_users=True,
            gpu_node_mode=0o666,
            extra_files={f"{MODEL_DIR}/config.json": MODEL_CONFIG},
        )
    )
    root = "/opt/sglang-userns"
    data = {
        **indexes.data(),
        "engine_root": root,
        "sglang_version": OLD,
        "server_host": guest.address,
    }

    run = deploy(guest, tmp_path, data)

    ok(run)
    # The check ran in its own transient unit (systemd logs it starting), as the service user
    # (the check reports the user it ran as, and the step refuses any other).
    started = sh(guest, "journalctl -o cat --no-pager | grep -c 'sglang-deploy-engine-check-'")
    assert int(started) >= 1, started
    assert "passed its check on 8 GPU(s) as sglang, in a rank's sandbox" in run.output, run
    assert current(guest, root) == f"envs/{env_name(OLD)}"
