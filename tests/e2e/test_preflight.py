"""Preflight end to end: the real `pyinfra -y INVENTORY deploy.py` against testbed containers.

A good host passes the gate and goes on to the next step; each bad host is refused with its own
message and left byte for byte as it was (a checksummed listing of /etc/systemd/system, /opt and
/dev/shm before and after); `--dry` shows the same preflight and changes nothing.

Three containers serve the whole module (boots are the slow part and the machine is shared):
`good`, `bad` (its nvidia-smi double's fixture folder is swapped between runs, so one container
plays every GPU scenario) and `no_uvm` (device nodes are fixed at boot).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import testbed as tb
from tests.e2e.deploying import Run, run_deploy
from tests.testbed import Container, ContainerSpec
from tests.testbed.container import DOUBLE_FIXTURE_DIR_IN_CONTAINER, scenario_dir

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 300
SNAPSHOT_PATHS = ("/etc/systemd/system", "/opt", "/dev/shm")

MODEL = "/srv/models/tiny"
BIG_MODEL = "/srv/models/big"
# A model whose source lacks its tokenizer: the throughput check's client could not load it.
NO_TOKENIZER_MODEL = "/srv/models/no-tokenizer"
# A controller source, written on the controller by the test (a Bad's data names it so).
CONTROLLER_MODEL = "@controller-model"
MODEL_FILES: dict[str, str | bytes] = {
    f"{MODEL}/config.json": json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]}),
    f"{MODEL}/model-00001-of-00001.safetensors": bytes(range(256)) * 16,
    # A real model's tokenizer (its content is not read before the throughput check's client).
    f"{MODEL}/tokenizer.json": "{}",
}
# What the containers can really offer: a few GB of /dev/shm and the machine's RAM. The model's
# size (a few KiB, measured on the host) is what the capacity checks use; one rank keeps the
# memory check (model + 4 GiB per rank) within any CI machine.
# The package indexes point at a closed loopback port: a run never leaves this machine, and the
# engine step after the gate fails there (tests/e2e/test_engine.py serves real ones).
NO_INDEX = "http://127.0.0.1:9/simple"
GOOD_DATA: dict[str, Any] = {
    "model_source": MODEL,
    "dp_size": 1,
    "package_index_url": NO_INDEX,
    "torch_index_url": NO_INDEX,
    "kernel_index_url": NO_INDEX,
    "flashinfer_index_url": NO_INDEX,
}


@dataclass
class Hosts:
    good: Container
    bad: Container
    no_uvm: Container


@pytest.fixture(scope="module")
def hosts(testbed: tb.Testbed) -> Iterator[Hosts]:
    good, bad, no_uvm = testbed.boot(
        ContainerSpec(extra_files=MODEL_FILES),
        ContainerSpec(extra_files=MODEL_FILES),
        ContainerSpec(missing_devices={"nvidia-uvm"}, extra_files=MODEL_FILES),
    )
    try:
        # A sparse shard 1 GiB larger than this container's /dev/shm (its size follows the
        # machine's RAM): the model's apparent size is what must fit, no bytes are written.
        shm = int(ssh(bad, "df -B1 --output=size /dev/shm | tail -n1"))
        ssh(
            bad,
            f"mkdir -p {BIG_MODEL} && cp {MODEL}/config.json {MODEL}/tokenizer.json {BIG_MODEL}/ "
            f"&& truncate -s {shm + 2**30} {BIG_MODEL}/model-00001-of-00001.safetensors",
        )
        ssh(
            bad,
            f"mkdir -p {NO_TOKENIZER_MODEL} && cp {MODEL}/config.json "
            f"{MODEL}/model-00001-of-00001.safetensors {NO_TOKENIZER_MODEL}/",
        )
        yield Hosts(good, bad, no_uvm)
    finally:
        for c in (good, bad, no_uvm):
            testbed.destroy(c)


def ssh(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{c.name}: {cmd}: rc {rc}\n{out}\n{err}"
    return out


def use_scenario(c: Container, scenario: str) -> None:
    """Swap the nvidia-smi double's fixture folder; the double reads it on every call."""
    target = c.root / DOUBLE_FIXTURE_DIR_IN_CONTAINER
    shutil.rmtree(target)
    target.mkdir()
    for item in scenario_dir(scenario).iterdir():
        if item.is_file() and item.name != "SOURCE.md":
            shutil.copyfile(item, target / item.name)


def panel(run: Run, c: Container) -> str:
    """The host's plan panel, box drawing removed and whitespace collapsed to one space."""
    lines = run.output.splitlines()
    title = re.compile(rf"╭─+ {re.escape(c.name)}: (ready|refused) ─")
    starts = [i for i, line in enumerate(lines) if title.search(line)]
    assert len(starts) == 1, f"expected one panel for {c.name}:\n{run.output}"
    block = []
    for line in lines[starts[0] :]:
        block.append(line)
        if line.startswith("╰"):
            break
    text = re.sub(r"[│┃╭╮╰╯─━┏┓┗┛┡┩┣┫╇╋┳┻┠┨┯┷┼┬┴├┤└┘┌┐]", " ", "\n".join(block))
    return " ".join(text.split())


def refused(run: Run, c: Container) -> bool:
    return f"[{c.name}] refused:" in run.output


def refusal(run: Run, c: Container) -> str:
    """What pyinfra logged refusing the host: a count, then every problem in full."""
    prefix = f"[{c.name}] "
    lines = [line.strip() for line in run.output.splitlines() if line.strip().startswith(prefix)]
    return "\n".join(
        line for line in lines if line.startswith((f"{prefix}refused:", f"{prefix}  - "))
    )


def deploy(tmp_path: Path, hosts_data: dict[Container, dict[str, Any]], *args: str) -> Run:
    return run_deploy(tmp_path, hosts_data, *args, timeout=RUN_TIMEOUT_S)


def path_without(tmp_path: Path, hidden: tuple[str, ...]) -> str:
    """A PATH of one directory linking every command of the controller's PATH but `hidden`."""
    bin_dir = tmp_path / "controller-bin"
    bin_dir.mkdir()
    for directory in reversed(os.environ.get("PATH", "").split(os.pathsep)):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            if entry.name not in hidden and not entry.is_dir():
                link = bin_dir / entry.name
                link.unlink(missing_ok=True)
                link.symlink_to(entry.path)
    assert not any((bin_dir / name).exists() for name in hidden)
    return str(bin_dir)


def snapshot(c: Container) -> dict[str, str]:
    return c.snapshot(SNAPSHOT_PATHS)


def went_on(run: Run, c: Container) -> bool:
    """The host ran an operation after the gate: a result line for it (success or error) under
    any operation but the gate's refusal, which is the only one the gate itself queues."""
    _, _, operations = run.output.partition("--> Beginning operation run...")
    for section in operations.split("--> Starting operation: ")[1:]:
        name, _, body = section.partition("\n")
        if name.startswith("Refuse: preflight"):
            continue
        for line in body.splitlines():
            if line.strip().startswith(f"[{c.name}] ") and not line.strip().endswith("Skipped"):
                return True
    return False


def assert_passed_gate(run: Run, c: Container) -> None:
    assert f"{c.name}: ready" in panel(run, c), run.output
    assert not refused(run, c), run.output
    # The steps after the gate (engine install, model staging) may still fail here for reasons
    # outside preflight (the package indexes are a closed port, see NO_INDEX), so the exit
    # status is not asserted: the host's own operations after the gate prove that it went on.
    assert went_on(run, c), run.output


@dataclass(frozen=True)
class Bad:
    """One way a host is unfit: which container, which nvidia-smi fixture, what the panel says."""

    host: str  # "bad" (its fixture folder is swapped) or "no_uvm"
    texts: tuple[str, ...]
    scenario: str = "rtx-pro-6000-x8"
    data: tuple[tuple[str, Any], ...] = ()
    # Commands taken off the controller's PATH for the run (every other one stays).
    hide: tuple[str, ...] = ()


BAD = {
    "version-mismatch": Bad(
        "bad",
        (
            "nvidia-smi answers",
            "Driver/library version mismatch",
            "must be the exact version of the host's kernel module",
            "--no-kernel-module",
        ),
        scenario="version-mismatch",
    ),
    "no-driver": Bad(
        "bad",
        ("nvidia-smi answers", "couldn't communicate with the NVIDIA driver", "c 195:* rwm"),
        scenario="no-driver",
    ),
    "four-gpus": Bad(
        "bad",
        ("GPU count", "8 GPUs (gpu_count)", "4: NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        scenario="rtx-pro-6000-x4",
    ),
    "h200": Bad(
        "bad",
        ("compute capability", "12.0 (sm_120)", "NVIDIA H200 (9.0)"),
        scenario="h200-x8",
    ),
    "gb10": Bad(
        "bad", ("compute capability", "NVIDIA GB10 (12.1)", "1: NVIDIA GB10"), scenario="gb10"
    ),
    "driver-565": Bad(
        "bad",
        ("driver 565.57.01 runs CUDA 12.7", "sm_120", "needs CUDA >= 12.8", ">= 570"),
        scenario="driver-565",
    ),
    "cuda-na": Bad(
        "bad",
        ("CUDA user space", "CUDA Version: N/A", "libcuda.so.1"),
        scenario="cuda-na",
    ),
    "no-nvidia-uvm": Bad(
        "no_uvm", ("GPU device nodes", "missing /dev/nvidia-uvm", "nvidia-uvm included")
    ),
    "model-source-missing": Bad(
        "bad",
        ("model source", "a model directory at /srv/models/absent", "no such directory"),
        data=(("model_source", "/srv/models/absent"),),
    ),
    "controller-dir-missing": Bad(
        "bad",
        (
            "model source",
            "a model directory at /nonexistent/dir on the controller",
            "no such directory on the controller",
            "on the controller: copy the model directory to /nonexistent/dir",
        ),
        data=(("model_source", "controller:/nonexistent/dir"),),
    ),
    "controller-without-rsync": Bad(
        "bad",
        (
            "controller tools",
            "no rsync command on the controller",
            "on the controller: apt-get install rsync",
        ),
        data=(("model_source", f"controller:{CONTROLLER_MODEL}"),),
        hide=("rsync",),
    ),
    "model-without-tokenizer": Bad(
        "bad",
        (
            "model tokenizer",
            f"tokenizer.json or tokenizer_config.json or tokenizer.model in {NO_TOKENIZER_MODEL}",
            "or on the controller set throughput_check: off",
        ),
        data=(("model_source", NO_TOKENIZER_MODEL), ("throughput_check", "after_change")),
    ),
    "shm-too-small": Bad(
        "bad",
        ("/dev/shm size", "nothing was copied", "enlarge the tmpfs"),
        data=(("model_source", BIG_MODEL),),
    ),
}


def test_good_host_passes_preflight(hosts: Hosts, tmp_path: Path) -> None:
    run = deploy(tmp_path, {hosts.good: GOOD_DATA})

    assert_passed_gate(run, hosts.good)
    shown = panel(run, hosts.good)
    assert "8 x NVIDIA RTX PRO 6000 Blackwell Server Edition, driver 570.172.08" in shown
    assert "preflight failed" not in shown


@pytest.mark.parametrize("case", list(BAD))
def test_bad_host_is_refused_and_left_unchanged(hosts: Hosts, tmp_path: Path, case: str) -> None:
    bad = BAD[case]
    c: Container = getattr(hosts, bad.host)
    if c is hosts.bad:
        use_scenario(c, bad.scenario)
    before = snapshot(c)

    local = tmp_path / "controller-model"
    for path, content in MODEL_FILES.items():
        (local / Path(path).name).parent.mkdir(exist_ok=True)
        written = local / Path(path).name
        if isinstance(content, str):
            written.write_text(content)
        else:
            written.write_bytes(content)
    data = {k: v.replace(CONTROLLER_MODEL, str(local)) for k, v in bad.data}
    env = {"PATH": path_without(tmp_path, bad.hide)} if bad.hide else None
    run = run_deploy(tmp_path, {c: {**GOOD_DATA, **data}}, timeout=RUN_TIMEOUT_S, env=env)

    assert run.rc != 0, run.output
    shown = panel(run, c)
    assert f"{c.name}: refused" in shown, run.output
    missing = [t for t in bad.texts if t not in shown]
    assert not missing, f"{missing} not in the panel of {c.name}:\n{run.output}"
    # The same, unclipped, in pyinfra's log: the table is cut to the terminal's width.
    logged = refusal(run, c)
    missing = [t for t in bad.texts if t not in logged]
    assert not missing, f"{missing} not in the refusal of {c.name}:\n{run.output}"
    assert not went_on(run, c), run.output
    assert snapshot(c) == before


def test_dry_run_shows_the_same_preflight_and_changes_nothing(hosts: Hosts, tmp_path: Path) -> None:
    use_scenario(hosts.bad, "version-mismatch")
    before = {c.name: snapshot(c) for c in (hosts.good, hosts.bad)}

    run = deploy(tmp_path, {hosts.good: GOOD_DATA, hosts.bad: GOOD_DATA}, "--dry")

    assert "Traceback" not in run.output
    bad = panel(run, hosts.bad)
    assert f"{hosts.bad.name}: refused" in bad
    assert "preflight failed, nothing will be changed" in bad
    assert "Driver/library version mismatch" in bad
    assert f"{hosts.good.name}: ready" in panel(run, hosts.good)
    assert "--> Beginning operation run..." not in run.output
    assert {c.name: snapshot(c) for c in (hosts.good, hosts.bad)} == before


def test_one_bad_one_good_in_one_run(hosts: Hosts, tmp_path: Path) -> None:
    use_scenario(hosts.bad, "version-mismatch")
    before = snapshot(hosts.bad)

    run = deploy(tmp_path, {hosts.bad: GOOD_DATA, hosts.good: GOOD_DATA})

    assert run.rc != 0, run.output
    assert refused(run, hosts.bad), run.output
    assert "Driver/library version mismatch" in panel(run, hosts.bad)
    assert not went_on(run, hosts.bad), run.output
    assert snapshot(hosts.bad) == before
    assert_passed_gate(run, hosts.good)
