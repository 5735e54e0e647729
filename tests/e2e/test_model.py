"""Model staging end to end: the real `pyinfra -y INVENTORY` against one testbed container.

One container for the whole module (boots are the slow part, and other engineers share this
machine); the cases run in order and each starts from the state the previous one left, like
successive deploys of one host.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import Container, ContainerSpec, Testbed, inventory_file
from tests.testbed.container import ExtraFile
from tests.unit.builders import make_settings

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = Path(__file__).resolve().parent / "model_deploy.py"
SOURCE = "/srv/models/tiny"
SERVED = "/dev/shm/models/e2e--tiny"
SHARD_MB = 60
BASE_DATA: dict[str, Any] = {
    "model_name": "e2e/tiny",
    "model_source": SOURCE,
    "dp_size": 1,
}
CONFIG = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
DEADLINE_S = 60.0
HF_DOUBLE = ROOT / "tests" / "doubles" / "hf"
TOKEN = "hf_e2e_secret_token_value"


@pytest.fixture(scope="module")
def host(testbed: Testbed) -> Iterator[Container]:
    files: dict[str, ExtraFile] = {
        f"{SOURCE}/config.json": CONFIG,
        # The hub CLI double where model_hub_cli points: present, so nothing is pip-installed.
        "/opt/sglang-hub/bin/hf": (HF_DOUBLE.read_text(), 0o755),
    }
    (c,) = testbed.boot(ContainerSpec(extra_files=files))
    try:
        for i in range(1, 4):
            shard = f"{SOURCE}/model-0000{i}-of-00003.safetensors"
            run(c, f"head -c {SHARD_MB}M /dev/urandom > {shard}")
        yield c
    finally:
        testbed.destroy(c)


def run(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{cmd}: rc {rc}\n{out}\n{err}"
    return out


def deploy(
    c: Container,
    tmp_path: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    **data: Any,
) -> subprocess.CompletedProcess[str]:
    inventory = inventory_file(tmp_path, {c: {**BASE_DATA, **data}})
    return subprocess.run(
        [str(PYINFRA), "-y", str(inventory), str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
        env={**os.environ, **(env or {})},
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    return text


def tree_sums(c: Container, path: str) -> str:
    return run(c, f"cd {path}/ && sha256sum config.json model-*.safetensors")


def served_entries(c: Container) -> list[str]:
    return run(c, "ls -a /dev/shm/models 2>/dev/null || true").split()


def test_1_stage(host: Container, tmp_path: Path) -> None:
    text = ok(deploy(host, tmp_path))
    assert "stage: copying 4 file(s)" in text, text
    assert tree_sums(host, SERVED) == tree_sums(host, SOURCE)
    assert run(host, f"readlink {SERVED}").startswith(".e2e--tiny@")
    assert run(host, "systemctl is-enabled sglang-stage-model.service").strip() == "enabled"


def test_2_rerun_changes_nothing(host: Container, tmp_path: Path) -> None:
    paths = ["/dev/shm", "/etc/systemd/system", "/usr/local/lib/sglang-deploy"]
    before = host.snapshot(paths)
    text = ok(deploy(host, tmp_path))
    assert "unchanged: staged copy matches the source" in text, text
    assert "stage: copying" not in text
    assert host.snapshot(paths) == before


def test_3_one_changed_shard_is_restaged(host: Container, tmp_path: Path) -> None:
    run(host, f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-00002-of-00003.safetensors")
    # Rate-limited so the copy lasts a few seconds: its progress reaches this terminal live.
    text = ok(deploy(host, tmp_path, model_stage_bwlimit_mbps=20))
    assert "stage: copying 1 file(s)" in text, text
    assert "MiB/s" in text and "s left" in text, text
    assert tree_sums(host, SERVED) == tree_sums(host, SOURCE)
    assert len([e for e in served_entries(host) if e.startswith(".e2e--tiny@")]) == 1


def test_4_interrupted_copy_is_never_served_and_recovers(host: Container, tmp_path: Path) -> None:
    served_before = run(host, f"readlink {SERVED}")
    run(host, f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-00003-of-00003.safetensors")
    inventory = inventory_file(tmp_path, {host: {**BASE_DATA, "model_stage_bwlimit_mbps": 10}})
    proc = subprocess.Popen(
        [str(PYINFRA), "-y", str(inventory), str(DEPLOY)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        # Poll until the copy is under way (a temp dir with bytes in it), within a deadline.
        deadline = time.monotonic() + DEADLINE_S
        pid = ""
        while time.monotonic() < deadline:
            out = run(host, "du -sb /dev/shm/models/.e2e--tiny.tmp-* 2>/dev/null | cut -f1; true")
            if out.strip() and int(out.split()[0]) > 1_000_000:
                pid = run(host, "cat /dev/shm/models/.e2e--tiny.lock").strip()
                break
            assert proc.poll() is None, "the deploy ended before the copy could be interrupted"
            time.sleep(0.2)
        assert pid.isdigit(), "no copy under way before the deadline"
    finally:
        proc.kill()  # the deploy we started, by its PID
        proc.wait(timeout=30)
    # And the copy on the host, as a power cut or the OOM killer would: no chance to clean up.
    killed = host.ssh_run(f"kill -9 {pid}")[0] == 0

    assert run(host, f"readlink {SERVED}") == served_before  # the old, complete copy
    if killed:  # else the script saw its SSH session go and removed its copy itself
        assert any(e.startswith(".e2e--tiny.tmp-") for e in served_entries(host))

    text = ok(deploy(host, tmp_path))
    assert "stage: copying 1 file(s)" in text, text
    assert tree_sums(host, SERVED) == tree_sums(host, SOURCE)
    assert not [e for e in served_entries(host) if ".tmp-" in e]


def test_5_model_larger_than_the_tmpfs_is_refused_before_copying(
    host: Container, tmp_path: Path
) -> None:
    total = int(run(host, "df -B1 --output=size /dev/shm | tail -n1"))
    big = "/srv/models/big"
    run(host, f"mkdir -p {big} && echo {shlex.quote(CONFIG)} > {big}/config.json")
    # Sparse: a shard bigger than the whole tmpfs costs no disk.
    run(host, f"truncate -s {total + 2**30} {big}/model-00001-of-00001.safetensors")
    before = served_entries(host)

    proc = deploy(host, tmp_path, model_source=big, model_name="e2e/big")

    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "/dev/shm size" in text and "bytes" in text, text
    assert served_entries(host) == before
    run(host, f"rm -rf {big}")


def test_6_reboot_stages_again_from_the_boot_unit(host: Container) -> None:
    sums = tree_sums(host, SOURCE)
    host.reboot()
    # wait_ready waited for `systemctl is-system-running --wait`: the oneshot has finished.
    assert run(host, "systemctl is-active sglang-stage-model.service").strip() == "active"
    assert tree_sums(host, SERVED) == sums
    journal = run(host, "journalctl -b -u sglang-stage-model.service --no-pager")
    assert "stage: copying 4 file(s)" in journal, journal


def test_7_hub_source_downloads_once_and_keeps_the_token_out(
    host: Container, tmp_path: Path
) -> None:
    source = "hf://e2e-org/tiny@0123abcd"
    env = {"HF_TOKEN": TOKEN}
    first = deploy(host, tmp_path, env=env, model_source=source, model_name="e2e/hub")
    text = ok(first)
    cache = "/var/cache/sglang-models/hf/e2e-org--tiny@0123abcd"
    assert tree_sums(host, "/dev/shm/models/e2e--hub") == tree_sums(host, cache)
    second = ok(deploy(host, tmp_path, env=env, model_source=source, model_name="e2e/hub"))
    assert "unchanged: staged copy matches the source" in second, second

    calls = [json.loads(line) for line in run(host, "cat /var/log/hf-double.log").splitlines()]
    assert len(calls) == 1 and calls[0]["token"] is True  # once, and the token arrived
    assert "e2e-org/tiny" in calls[0]["argv"]
    assert host.ssh_run("test -e /etc/sglang/hub/token")[0] == 1  # removed after the download
    leaks = host.ssh_run(
        f"grep -rl {TOKEN} /etc /var/log /var/cache/sglang-models /dev/shm /run/log 2>/dev/null"
    )[1]
    assert leaks == "" and TOKEN not in text + second


@pytest.mark.skipif(shutil.which("rsync") is None, reason="the controller has no rsync")
def test_8_controller_source_is_sent_with_rsync(host: Container, tmp_path: Path) -> None:
    local = tmp_path / "controller-model"
    local.mkdir()
    (local / "config.json").write_text(CONFIG)
    (local / "model-00001-of-00001.safetensors").write_bytes(os.urandom(3_000_000))
    data: dict[str, Any] = {"model_source": f"controller:{local}", "model_name": "e2e/ctl"}
    ok(deploy(host, tmp_path, **data))
    cache = make_settings(model_source=f"controller:{local}").source.target_dir
    assert tree_sums(host, "/dev/shm/models/e2e--ctl") == tree_sums(host, cache)
    again = ok(deploy(host, tmp_path, **data))
    assert "matches" in again and "unchanged: staged copy matches the source" in again, again
