"""Model staging end to end: the real `pyinfra -y INVENTORY deploy.py` (gate, engine from the
loopback indexes, model, serve) against one GPU-shaped testbed container.

One container for the whole module (boots are the slow part, and other engineers share this
machine). Each test stages a model of its own (its own source directory and model name, so its
own staged copies) and deploys it first, so it starts from the state it needs whatever ran
before; the engine, installed by whichever test deploys first, is converged for the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.deploying import REPO, Indexes, Run, run_deploy, start_deploy
from tests.e2e.index import wait_for
from tests.e2e.serving import base_data, health
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, ContainerSpec, Testbed
from tests.unit.builders import make_settings

pytestmark = pytest.mark.e2e

MODELS = "/dev/shm/models"
SHARD_MB = 20
CONFIG = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
DEADLINE_S = 60.0
HF_DOUBLE = REPO / "tests" / "doubles" / "hf"
HF_LOG = "/var/log/hf-double.log"
TOKEN = "hf_e2e_secret_token_value"
RANK_PORT = 30000


@pytest.fixture(scope="module")
def host(testbed: Testbed) -> Iterator[Container]:
    # The hub CLI double where model_hub_cli points: present, so nothing is pip-installed.
    spec = ContainerSpec(extra_files={"/opt/sglang-hub/bin/hf": (HF_DOUBLE.read_text(), 0o755)})
    (c,) = testbed.boot(spec)
    try:
        yield c
    finally:
        testbed.destroy(c)


class Model:
    """One test's model: a source directory of `shards` random shards on the target."""

    def __init__(self, c: Container, name: str, shards: int = 3) -> None:
        self.c, self.name, self.slug = c, f"e2e/{name}", f"e2e--{name}"
        self.source = f"/srv/models/{name}"
        self.served = f"{MODELS}/{self.slug}"
        self.shards = shards
        sh(c, f"rm -rf {self.source} && mkdir -p {self.source}")
        sh(c, f"echo {shlex.quote(CONFIG)} > {self.source}/config.json")
        for i in range(1, shards + 1):
            self.rewrite(i)

    def shard(self, i: int) -> str:
        return f"{self.source}/model-{i:05d}-of-{self.shards:05d}.safetensors"

    def rewrite(self, i: int) -> None:
        sh(self.c, f"head -c {SHARD_MB}M /dev/urandom > {self.shard(i)}")

    def data(self, **extra: Any) -> dict[str, Any]:
        return {"model_name": self.name, "model_source": self.source, **extra}

    def copies(self) -> list[str]:
        """The complete staged copies of this model (.SLUG@KEY)."""
        return [e for e in served_entries(self.c) if e.startswith(f".{self.slug}@")]

    def temporaries(self) -> list[str]:
        return [e for e in served_entries(self.c) if e.startswith(f".{self.slug}.tmp-")]


HUB_REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_snapshot_commands(cache: str, files: dict[str, str]) -> str:
    """Shell that lays out a Hugging Face cache snapshot as huggingface_hub does (0.34.4
    file_download.py: blobs/ETAG, snapshots/REV/FILE a relative link into ../../blobs/): each
    entry of files is FILE -> a shell command printing its content. Returns the snapshot's
    path on the last line it echoes."""
    repo = f"{cache}/models--e2e-org--snap"
    snap = f"{repo}/snapshots/{HUB_REVISION}"
    steps = [f"rm -rf {repo}", f"mkdir -p {repo}/blobs {snap} {repo}/refs"]
    for name, make in files.items():
        steps += [
            f"{make} > {repo}/blobs/tmp",
            f"h=$(sha256sum {repo}/blobs/tmp | cut -d' ' -f1)",
            f"mv {repo}/blobs/tmp {repo}/blobs/$h",
            f"ln -s ../../blobs/$h {snap}/{name}",
        ]
    steps.append(f"echo {HUB_REVISION} > {repo}/refs/main")
    return " && ".join(steps)


def sh(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{cmd}: rc {rc}\n{out}\n{err}"
    return out


def deploy(
    c: Container,
    indexes: Indexes,
    tmp_path: Path,
    data: dict[str, Any],
    env: dict[str, str] | None = None,
) -> Run:
    return run_deploy(tmp_path, {c: base_data(c, indexes, dp_size=1, **data)}, env=env)


def ok(run: Run) -> str:
    assert run.rc == 0, str(run)
    return run.output


def tree_sums(c: Container, path: str) -> str:
    return sh(c, f"cd {path}/ && sha256sum config.json model-*.safetensors")


def served_entries(c: Container) -> list[str]:
    return sh(c, f"ls -a {MODELS} 2>/dev/null || true").split()


def rank_model_path(c: Container) -> str:
    """The staged copy rank 0's unit names (--model-path in its ExecStart)."""
    unit = sh(c, "grep ^ExecStart= /etc/systemd/system/sglang@0.service")
    match = re.search(r"--model-path (\S+)", unit)
    assert match, unit
    return match.group(1)


def serving(c: Container) -> bool:
    return health(c, RANK_PORT) == 200


# -- tests -----------------------------------------------------------------------------------


def test_staged_into_the_tmpfs_served_from_there_and_a_rerun_changes_nothing(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    m = Model(host, "stage")
    text = ok(deploy(host, indexes, tmp_path, m.data()))
    assert "stage: copying 4 file(s)" in text, text
    assert tree_sums(host, m.served) == tree_sums(host, m.source)
    assert m.copies() and sh(host, f"readlink {m.served}").startswith(f".{m.slug}@")
    assert rank_model_path(host) == f"{MODELS}/{m.copies()[0]}"
    assert serving(host)
    assert sh(host, "systemctl is-enabled sglang-stage-model.service").strip() == "enabled"

    paths = ["/dev/shm", "/etc/systemd/system", "/usr/local/lib/sglang-deploy"]
    before = host.snapshot(paths)
    again = ok(deploy(host, indexes, tmp_path, m.data()))
    assert "unchanged: staged copy matches the source" in again, again
    assert "stage: copying" not in again
    assert host.snapshot(paths) == before


def test_one_changed_shard_is_restaged_and_the_rank_moves_to_the_new_copy(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    m = Model(host, "changed")
    ok(deploy(host, indexes, tmp_path, m.data()))
    old = rank_model_path(host)

    m.rewrite(2)
    # Rate-limited so the copy lasts a few seconds: its progress reaches this terminal live.
    text = ok(deploy(host, indexes, tmp_path, m.data(model_stage_bwlimit_mbps=5)))
    assert "stage: copying 1 file(s)" in text, text
    assert "MiB/s" in text and "s left" in text, text
    assert tree_sums(host, m.served) == tree_sums(host, m.source)
    new = rank_model_path(host)
    assert new != old and new == f"{MODELS}/{sh(host, f'readlink {m.served}').strip()}"
    assert serving(host)
    assert not m.temporaries()


def test_an_interrupted_copy_is_never_served_and_the_next_run_recovers(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    m = Model(host, "interrupted")
    ok(deploy(host, indexes, tmp_path, m.data()))
    served_before, unit_before = sh(host, f"readlink {m.served}"), rank_model_path(host)

    m.rewrite(3)
    slow = base_data(host, indexes, dp_size=1, **m.data(model_stage_bwlimit_mbps=4))
    started = start_deploy(tmp_path, {host: slow}, inventory="interrupted.py")
    pid = ""
    try:

        def copying() -> bool:
            out = sh(host, f"du -sb {MODELS}/.{m.slug}.tmp-* 2>/dev/null | cut -f1; true")
            assert started.proc.poll() is None, "the deploy ended before it could be interrupted"
            return bool(out.strip()) and int(out.split()[0]) > 1_000_000

        wait_for(copying, DEADLINE_S, "a copy under way")
        pid = sh(host, f"cat {MODELS}/.{m.slug}.lock").strip()
    finally:
        started.kill()
    assert pid.isdigit(), pid
    # And the copy on the host, as a power cut or the OOM killer would: no chance to clean up.
    killed = host.ssh_run(f"kill -9 {pid}")[0] == 0

    # The old, complete copy is still what the link and the rank's unit name, and it serves.
    assert sh(host, f"readlink {m.served}") == served_before
    assert rank_model_path(host) == unit_before
    assert serving(host)
    if killed:  # else the script saw its SSH session go and removed its copy itself
        assert m.temporaries()

    text = ok(deploy(host, indexes, tmp_path, m.data()))
    assert "stage: copying 1 file(s)" in text, text
    assert tree_sums(host, m.served) == tree_sums(host, m.source)
    assert not m.temporaries()
    assert rank_model_path(host) != unit_before and serving(host)


def test_a_copy_that_fits_only_in_place_replaces_the_old_one_with_the_ranks_stopped(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    m = Model(host, "inplace", shards=2)
    ok(deploy(host, indexes, tmp_path, m.data()))
    old = m.copies()
    # The tmpfs shrunk to what it holds now plus half a copy: a new copy of the whole model
    # no longer fits beside the current one, it fits in its place.
    used = int(sh(host, "df -B1 --output=used /dev/shm | tail -n1"))
    size = int(sh(host, "df -B1 --output=size /dev/shm | tail -n1"))
    room = SHARD_MB * 2**20
    sh(host, f"mount -o remount,size={used + room} /dev/shm")
    try:
        m.rewrite(1)
        m.rewrite(2)
        run = deploy(host, indexes, tmp_path, m.data())
        text = ok(run)
        assert run.status("stage the copy (inplace)").startswith("Success"), text
        assert "replacing it with the servers stopped" in text, text
        assert tree_sums(host, m.served) == tree_sums(host, m.source)
        assert len(m.copies()) == 1 and m.copies() != old, served_entries(host)
        assert rank_model_path(host) == f"{MODELS}/{m.copies()[0]}"
        assert serving(host)
    finally:
        sh(host, f"mount -o remount,size={size} /dev/shm")


def test_a_model_larger_than_the_tmpfs_is_refused_before_copying(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    total = int(sh(host, "df -B1 --output=size /dev/shm | tail -n1"))
    big = "/srv/models/big"
    sh(host, f"mkdir -p {big} && echo {shlex.quote(CONFIG)} > {big}/config.json")
    # Sparse: a shard bigger than the whole tmpfs costs no disk.
    sh(host, f"truncate -s {total + 2**30} {big}/model-00001-of-00001.safetensors")
    before = host.snapshot([MODELS])

    run = deploy(host, indexes, tmp_path, {"model_source": big, "model_name": "e2e/big"})

    assert run.rc != 0, str(run)
    assert "/dev/shm size" in run.output and "nothing was copied" in run.output, str(run)
    assert host.snapshot([MODELS]) == before
    sh(host, f"rm -rf {big}")


def test_after_a_reboot_the_boot_unit_stages_again_and_the_rank_serves(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    m = Model(host, "reboot")
    ok(deploy(host, indexes, tmp_path, m.data()))
    sums = tree_sums(host, m.source)

    host.reboot()
    # wait_ready waited for `systemctl is-system-running --wait`: the oneshot has finished.
    assert sh(host, "systemctl is-active sglang-stage-model.service").strip() == "active"
    assert tree_sums(host, m.served) == sums
    journal = sh(host, "journalctl -b -u sglang-stage-model.service --no-pager")
    assert "stage: copying 4 file(s)" in journal, journal
    assert f"{MODELS}/{sh(host, f'readlink {m.served}').strip()}" == rank_model_path(host)
    wait_for(lambda: serving(host), DEADLINE_S, "rank 0 healthy after the reboot")


def test_a_hub_source_is_downloaded_once_and_the_token_kept_out(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    source = "hf://e2e-org/tiny@0123abcd"
    cache = "/var/cache/sglang-models/hf/e2e-org--tiny@0123abcd"
    sh(host, f"rm -rf {cache} {HF_LOG}")  # never downloaded, whatever ran before
    env = {"HF_TOKEN": TOKEN}
    data = {"model_source": source, "model_name": "e2e/hub"}

    first = ok(deploy(host, indexes, tmp_path, data, env=env))
    assert tree_sums(host, f"{MODELS}/e2e--hub") == tree_sums(host, cache)
    second = ok(deploy(host, indexes, tmp_path, data, env=env))
    assert "unchanged: staged copy matches the source" in second, second

    calls = [json.loads(line) for line in sh(host, f"cat {HF_LOG}").splitlines()]
    assert len(calls) == 1 and calls[0]["token"] is True  # once, and the token arrived
    assert "e2e-org/tiny" in calls[0]["argv"]
    assert host.ssh_run("test -e /etc/sglang/hub/token")[0] == 1  # removed after the download
    leaks = host.ssh_run(
        f"grep -rl {TOKEN} /etc /var/log /var/cache/sglang-models /dev/shm /run/log 2>/dev/null"
    )[1]
    assert leaks == "" and TOKEN not in first + second


def test_a_controller_source_is_sent_with_rsync(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    """The controller's directory is a Hugging Face cache snapshot (every file a link into
    ../../blobs/): scanned there by the link rule, rsynced with --copy-links, so the target's
    cache holds regular files with the same digest and a re-run sends nothing."""
    repo = tmp_path / "hub" / "models--e2e-org--ctl"
    local = repo / "snapshots" / HUB_REVISION
    local.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, content in {
        "config.json": CONFIG.encode(),
        "model-00001-of-00001.safetensors": os.urandom(3_000_000),
    }.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (local / name).symlink_to(f"../../blobs/{blob.name}")
    data: dict[str, Any] = {"model_source": f"controller:{local}", "model_name": "e2e/ctl"}

    first = ok(deploy(host, indexes, tmp_path, data))
    assert "stage: copying 2 file(s)" in first, first
    cache = make_settings(model_source=f"controller:{local}").source.target_dir
    assert tree_sums(host, f"{MODELS}/e2e--ctl") == tree_sums(host, cache)
    assert sh(host, f"find {cache}/ -type l") == ""  # the links' content, as regular files
    again = deploy(host, indexes, tmp_path, data)
    assert "unchanged: staged copy matches the source" in ok(again), again
    assert again.status("sync from the controller").startswith("No changes"), again
    # Issue 29: a converged run with a controller source changes nothing at all.
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again


def test_a_hub_cache_snapshot_is_staged_as_regular_files_and_served_a_link_out_refused(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    """model_source a Hugging Face cache snapshot (every file a link into ../../blobs/): once,
    every link was refused and such a source could not be deployed. A link that leaves the
    repository's folder (to a root-only file) is refused by name before anything changes,
    its target never read; without it the snapshot is staged as regular files and served."""
    cache = "/srv/hf-cache/hub"
    shard = f"head -c {SHARD_MB}M /dev/urandom"
    files = {
        "config.json": f"echo {shlex.quote(CONFIG)}",
        "model-00001-of-00002.safetensors": shard,
        "model-00002-of-00002.safetensors": shard,
    }
    sh(host, hub_snapshot_commands(cache, files))
    snap = f"{cache}/models--e2e-org--snap/snapshots/{HUB_REVISION}"
    secret = "root-only-e2e-4d7a"
    sh(host, f"umask 077 && echo {secret} > /root/hub-secret")
    sh(host, f"ln -s ../../../../../../root/hub-secret {snap}/tokenizer.json")
    data = {"model_source": snap, "model_name": "e2e/snap"}
    before = host.snapshot([MODELS])

    refused = deploy(host, indexes, tmp_path, data)
    assert refused.rc != 0, str(refused)
    assert f"{snap}/tokenizer.json is a symbolic link" in refused.output, str(refused)
    assert "that leaves" in refused.output and secret not in refused.output
    assert host.snapshot([MODELS]) == before

    sh(host, f"rm {snap}/tokenizer.json")
    text = ok(deploy(host, indexes, tmp_path, data))
    assert "stage: copying 3 file(s)" in text, text
    served = f"{MODELS}/e2e--snap"
    assert sh(host, f"find {served}/ -type l") == ""  # regular files, not links
    assert tree_sums(host, served) == tree_sums(host, snap)  # sha256sum follows the links
    assert rank_model_path(host) == f"{MODELS}/{sh(host, f'readlink {served}').strip()}"
    assert serving(host)
    assert host.ssh_run(f"grep -rl {secret} /dev/shm /var/log 2>/dev/null")[1] == ""
