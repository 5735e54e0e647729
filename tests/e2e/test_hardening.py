"""Issue 11 end to end, on one testbed container: the /dev/shm symlink attack by a real
unprivileged local user, two real `pyinfra` deploys of one host at the same time, a deploy
killed while it holds the host (each the real `pyinfra -y INVENTORY deploy.py`, the engine from
the loopback indexes), and the secret writer connecting as a non-root user with sudo
(tests/e2e/secret_deploy.py: the lock and one secret file).

The cases run in order and share the container, like successive deploys of one host.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.deploying import Deploying, Indexes, Run, run_deploy, start_deploy
from tests.e2e.index import wait_for
from tests.e2e.serving import base_data
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, ContainerSpec, Testbed

pytestmark = pytest.mark.e2e

SECRET_DEPLOY = "tests/e2e/secret_deploy.py"
SOURCE = "/srv/models/tiny"
MODELS = "/dev/shm/models"
SERVED = f"{MODELS}/e2e--tiny"
SHARD_MB = 40
DATA: dict[str, Any] = {"model_name": "e2e/tiny", "model_source": SOURCE, "dp_size": 1}
CONFIG = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
DEADLINE_S = 90.0
VICTIM = "/etc/victim-of-the-lock"
LOCK_FREE = (
    'python3 -c \'import fcntl, os; fd = os.open("/run/sglang-deploy.lock", os.O_RDWR); '
    "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)'"
)


@pytest.fixture(scope="module")
def host(testbed: Testbed) -> Iterator[Container]:
    (c,) = testbed.boot(ContainerSpec(extra_files={f"{SOURCE}/config.json": CONFIG}))
    try:
        for i in range(1, 3):
            run(
                c, f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-0000{i}-of-00002.safetensors"
            )
        yield c
    finally:
        testbed.destroy(c)


def run(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{cmd}: rc {rc}\n{out}\n{err}"
    return out


def start(c: Container, indexes: Indexes, tmp_path: Path, name: str, **data: Any) -> Deploying:
    """The real deploy.py, started; `name` names its inventory (two may run at once)."""
    host_data = base_data(c, indexes, **DATA, **data)
    return start_deploy(tmp_path, {c: host_data}, inventory=f"{name}.py")


def deploy(c: Container, indexes: Indexes, tmp_path: Path, **data: Any) -> Run:
    return start(c, indexes, tmp_path, "inventory", **data).finish()


def poll(what: str, check: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    wait_for(check, deadline_s, what)


def copying(c: Container) -> bool:
    out = c.ssh_run(f"du -sb {MODELS}/.e2e--tiny.tmp-* 2>/dev/null | cut -f1")[1].split()
    return bool(out) and int(out[0]) > 1_000_000


def test_1_a_models_tree_planted_by_a_local_user_is_refused(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    run(host, f"useradd --create-home mallory && echo 'root data' > {VICTIM}")
    plant = (
        f"mkdir {MODELS} && ln -s {VICTIM} {MODELS}/.e2e--tiny.lock && "
        f"mkdir ~/evil && ln -s ~/evil {SERVED}"
    )
    run(host, f"runuser -u mallory -- sh -c {json.dumps(plant)}")

    done = deploy(host, indexes, tmp_path)
    rc, out = done.rc, done.output

    assert rc != 0, out
    assert "owned by uid" in out and "(mallory)" in out and "refusing to use it" in out, out
    assert run(host, f"cat {VICTIM}") == "root data\n"  # never opened, never truncated
    assert run(host, f"readlink {SERVED}").strip() == "/home/mallory/evil"  # never switched

    run(host, f"rm -rf {MODELS}")  # what the message says to do
    done = deploy(host, indexes, tmp_path)
    rc, out = done.rc, done.output
    assert rc == 0, out
    assert run(host, f"stat -c '%a %U %F' {MODELS}").strip() == "755 root directory"
    # The weights: the servers' group reads them, other local users (mallory) do not.
    modes = run(host, f"stat -c '%a %U %G' {SERVED}/ {SERVED}/config.json").split("\n")
    assert modes[:2] == ["750 root sglang", "640 root sglang"], modes
    assert host.ssh_run(f"runuser -u mallory -- cat {SERVED}/config.json")[0] != 0
    assert run(host, f"cd {SERVED}/ && sha256sum config.json") == run(
        host, f"cd {SOURCE}/ && sha256sum config.json"
    )


def test_2_two_deploys_at_once_take_turns(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    run(host, f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-00002-of-00002.safetensors")
    first = start(host, indexes, tmp_path, "first", model_stage_bwlimit_mbps=8)
    try:
        poll("the first deploy copying", lambda: copying(host) or first.proc.poll() is not None)
        assert first.proc.poll() is None, "the first deploy ended before the second could start"
        second = start(host, indexes, tmp_path, "second").finish()
    finally:
        one = first.finish()

    assert one.rc == 0 and "stage: copying 1 file(s)" in one.output, str(one)
    assert second.rc == 0, str(second)
    # The second waited, saying for whom, and planned only after the first had finished:
    # it found the copy done (a run that planned alongside would have staged again).
    out2 = second.output
    assert "another deploy holds this host (deploy by" in out2, out2
    assert "unchanged: staged copy matches the source" in out2, out2
    assert "stage: copying" not in out2, out2


def test_3_a_killed_deploy_releases_the_host(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    run(host, f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-00001-of-00002.safetensors")
    started = start(host, indexes, tmp_path, "killed", model_stage_bwlimit_mbps=4)
    try:
        poll("the deploy copying", lambda: copying(host) or started.proc.poll() is not None)
        assert started.proc.poll() is None, "the deploy ended before it could be killed"
        assert host.ssh_run(LOCK_FREE)[0] != 0  # held while it runs
    finally:
        started.kill()  # the deploy we started, by its PID: no chance to clean up
    poll("the lock released", lambda: host.ssh_run(LOCK_FREE)[0] == 0, 30)
    done = deploy(host, indexes, tmp_path, deploy_lock_wait_s=0)
    assert done.rc == 0 and "another deploy holds" not in done.output, str(done)


def test_4_secrets_through_sudo_are_private_from_the_first_byte(
    host: Container, tmp_path: Path
) -> None:
    run(
        host,
        "useradd --create-home deployer && install -d -m 700 -o deployer ~deployer/.ssh && "
        "install -m 600 -o deployer /root/.ssh/authorized_keys ~deployer/.ssh/ && "
        "echo 'deployer ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deployer",
    )
    secret = "api-key: sk-e2e-very-secret-0123456789\n"
    data = {"ssh_user": "deployer", "_sudo": True, "secret_text": secret}

    def apply() -> tuple[str, str]:
        done = run_deploy(
            tmp_path, {host: data}, "-vv", deploy_file=SECRET_DEPLOY, inventory="sudo.py"
        )
        out = done.output
        assert done.rc == 0, out
        for shown in (secret.strip(), base64.b64encode(secret.encode()).decode()):
            assert shown not in out  # not the content, not its encoding: not even with -vv
        return done.statuses.get("Write the e2e secret", ""), out

    status, out = apply()
    assert status.startswith("Success"), out
    files = "/etc/sglang-e2e /etc/sglang-e2e/secret.yaml"
    assert run(host, f"stat -c '%a %U %G' {files}").split("\n")[:2] == [
        "750 root daemon",
        "640 root daemon",
    ]
    assert run(host, "cat /etc/sglang-e2e/secret.yaml") == secret
    assert run(host, "ls -a /etc/sglang-e2e").split() == [".", "..", "secret.yaml"]
    # The deploy lock was taken through sudo too: root's file, naming the deploy.
    assert run(host, "stat -c '%a %U' /run/sglang-deploy.lock").strip() == "600 root"
    assert "deploy by" in run(host, "cat /run/sglang-deploy.lock")

    assert apply()[0].startswith("No changes")
    run(host, "chmod 755 /etc/sglang-e2e")  # the directory's mode is enforced on every run
    assert apply()[0].startswith("Success")
    assert run(host, "stat -c %a /etc/sglang-e2e").strip() == "750"
