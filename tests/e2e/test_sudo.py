"""A whole deploy over `_sudo` (issue 20, point 3): the real `pyinfra -y INVENTORY deploy.py`
connecting as `deployer`, a non-root user with passwordless sudo (ContainerSpec.sudo_user),
builds the engine from the loopback indexes, stages the model and serves it behind an API key.
Everything it wrote is root's, with the modes the code intends, and nothing is the SSH user's:
the staging run and the engine check, which run inside Python callbacks, went through sudo
too. A second run changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from operations.facts.engine import MARKER
from tests import testbed as tb
from tests.e2e.deploying import MODEL_CONFIG, Indexes, Run
from tests.e2e.serving import MODEL_DIR, base_data, deploy, ok
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

USER = "deployer"
API_KEY = "sk-sudo-3c5e7a9b1d2f4068"
ENGINE_ROOT = "/opt/sglang"
MODELS = "/dev/shm/models"
SERVICE = "sglang"
# Every tree the deploy writes (the engine, the staged model, config and secrets, its scripts,
# the units) and where a stray file of the SSH user's would land.
WRITTEN = (ENGINE_ROOT, MODELS, "/etc/sglang", "/usr/local/lib/sglang-deploy")


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    spec = ContainerSpec(
        extra_files={
            f"{MODEL_DIR}/config.json": MODEL_CONFIG,
            f"{MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
        },
        sudo_user=USER,
    )
    (c,) = testbed.boot(spec)
    try:
        yield c
    finally:
        testbed.destroy(c)


def sh(c: Container, cmd: str) -> str:
    rc, out, err = c.ssh_run(cmd)
    assert rc == 0, f"{cmd}: rc {rc}\n{out}\n{err}"
    return out


def entries(c: Container, *paths: str) -> list[tuple[str, str, str, str, str]]:
    """(type, mode, owner, group, path) of every entry under paths (lstat: links as links)."""
    out = sh(c, f"find {' '.join(paths)} -printf '%y %m %u %g %p\\n'")
    return [tuple(line.split(" ", 4)) for line in out.splitlines()]  # type: ignore[misc]


def test_a_deploy_over_sudo_writes_everything_as_root(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    assert host.host_data()["ssh_user"] == USER and host.host_data()["_sudo"] is True
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    data = base_data(host, indexes, dp_size=1, api_key_file=str(key_file))

    def apply() -> Run:
        run = deploy(tmp_path, {host: data})
        ok(run)
        assert API_KEY not in run.output
        return run

    apply()

    # The engine: root's, writable by nobody else (links' own modes mean nothing).
    engine = entries(host, ENGINE_ROOT)
    assert len(engine) > 100, engine[:5]
    # The compile caches are the service user's by design (the ranks write their JIT modules and
    # tuning there: docs/how-it-works/rank-start.md), 0750, under ENGINE_ROOT/caches/ only.
    caches = f"{ENGINE_ROOT}/caches/"
    bad = [
        e
        for e in engine
        if e[2:4] != ("root", "root")
        and e[0] != "l"
        and not (e[4].startswith(caches) and e[2:4] == (SERVICE, SERVICE))
    ]
    # uv makes its lock files (cache and venv) 0666 on purpose, for flock only (which a reader
    # can take as well): empty files, nothing runs or reads them. Nothing else is writable by
    # others.
    bad += [
        e
        for e in engine
        if e[0] != "l"
        and int(e[1], 8) & 0o002
        and not (e[0] == "f" and e[4].endswith(".lock") and e[1] == "666")
    ]
    assert bad == [], bad[:20]
    assert sh(host, f"find {ENGINE_ROOT} -name '*.lock' -perm -o+w -size +0c") == ""
    # The engine check ran (it writes the marker only after passing) and `current` moved.
    assert host.ssh_run(f"test -f {ENGINE_ROOT}/current/{MARKER}")[0] == 0

    # The staged copy: `models` root's 0755; each copy root:SERVICE 0750, its files 0640.
    assert sh(host, f"stat -c '%a %U %G %F' {MODELS}").strip() == "755 root root directory"
    staged = [e for e in entries(host, MODELS) if e[4] != MODELS]
    copies = [e for e in staged if e[0] == "d" and "/.rsync" not in e[4]]
    files = [e for e in staged if e[0] == "f" and not e[4].endswith(".lock")]
    manifests = [e for e in files if e[4].endswith("/.staged-manifest.json")]
    files = [e for e in files if e not in manifests]
    assert copies and files and manifests, staged
    assert {e[1:4] for e in copies} == {("750", "root", SERVICE)}, copies
    assert {e[1:4] for e in files} == {("640", "root", SERVICE)}, files
    # The script's own record of the copy: root's (the servers never read it).
    assert {e[1:4] for e in manifests} == {("640", "root", "root")}, manifests
    assert {e[2] for e in staged} == {"root"}, staged
    assert host.ssh_run(f"runuser -u {USER} -- cat {files[0][4]}")[0] != 0  # not world-readable

    # Secrets and config: the API key 0640 root:SERVICE in a directory others cannot enter.
    modes = sh(host, "stat -c '%a %U %G' /etc/sglang /etc/sglang/secrets.yaml").split("\n")
    assert modes[1] == f"640 root {SERVICE}", modes
    assert int(modes[0].split()[0], 8) & 0o007 == 0 and modes[0].split()[1] == "root", modes
    assert host.ssh_run("test -e /etc/sglang/hub/token")[0] != 0  # no hub token left behind

    # Units and shipped scripts: root's 0644, not writable by others.
    units = entries(host, "/etc/systemd/system")
    ours = [e for e in units if "sglang" in e[4].rsplit("/", 1)[-1] and e[0] == "f"]
    assert ours and {e[1:4] for e in ours} == {("644", "root", "root")}, ours
    scripts = [e for e in entries(host, "/usr/local/lib/sglang-deploy") if e[0] == "f"]
    assert scripts and all(e[2] == "root" and not int(e[1], 8) & 0o022 for e in scripts)

    # Nothing anywhere belongs to the SSH user but its home (pyinfra's temp files are gone).
    mine = sh(
        host,
        f"find / -xdev \\( -path /proc -o -path /sys -o -path /home/{USER} \\) -prune "
        f"-o -user {USER} -print; find /dev/shm /run /tmp -user {USER} -print",
    ).split()
    assert [p for p in mine if not p.startswith(f"/run/user/{uid(host)}")] == []
    assert "pyinfra-" not in sh(host, "ls -a /tmp /var/tmp")

    # A second run changes nothing.
    before = host.snapshot([ENGINE_ROOT + "/envs", MODELS, "/etc/sglang", "/etc/systemd/system"])
    again = apply()
    changed = {k: v for k, v in again.statuses.items() if v != "No changes"}
    assert changed == {}, changed
    assert host.snapshot([ENGINE_ROOT + "/envs", MODELS, "/etc/sglang", "/etc/systemd/system"]) == (
        before
    )


def uid(c: Container) -> str:
    return sh(c, f"id -u {USER}").strip()
