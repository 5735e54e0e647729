"""Issue 11 findings at the staging script's own layer: a models tree someone else made is
refused and never followed, leftovers are space that will be freed, and a repaired copy
replaces a damaged one without the served name ever missing a complete copy.

Foreign owners are made with chown, so the tests that need them run as root (as CI does); the
same attack by a real unprivileged user on a testbed container is tests/e2e/test_hardening.py.
"""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from operations.facts.host import Resources
from operations.facts.model import Copy, Staging, script_module
from operations.plan.staging import decide
from tests.unit.builders import make_settings
from tests.unit.shipped import script_path

sm = script_module()
GIB = 1024**3
OTHER_UID = 4242
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def make_model(root: Path, shards: int = 2, shard_bytes: int = 100_000) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    for i in range(shards):
        (root / f"model-{i:05d}.safetensors").write_bytes(os.urandom(shard_bytes))
    return root


def stage(src: Path, shm: Path, **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = sm.stage(str(src), str(shm), "m", progress_interval=0, **kwargs)
    return result


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_model(tmp_path / "src")


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    """Like /dev/shm: world-writable and sticky."""
    path = tmp_path / "shm"
    path.mkdir()
    path.chmod(0o1777)
    return path


@as_root
def test_a_models_tree_made_by_another_user_is_refused_and_never_followed(
    src: Path, shm: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    models = shm / "models"
    models.mkdir(mode=0o777)
    (models / ".m.lock").symlink_to(victim)
    (models / "m").symlink_to(tmp_path / "evil-weights")
    os.lchown(models / ".m.lock", OTHER_UID, OTHER_UID)
    os.lchown(models / "m", OTHER_UID, OTHER_UID)
    os.chown(models, OTHER_UID, OTHER_UID)

    with pytest.raises(sm.StageError, match=f"owned by uid {OTHER_UID}.*refusing to use it"):
        stage(src, shm)
    planned = sm.plan(str(src), str(shm), "m")
    assert f"owned by uid {OTHER_UID}" in planned["error"] and planned["staged"] is None

    assert victim.read_text() == "root's file\n"  # the lock link was never opened
    assert os.readlink(models / "m") == str(tmp_path / "evil-weights")  # nothing switched


@as_root
def test_a_models_symlink_is_refused(src: Path, shm: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shm / "models").symlink_to(elsewhere)
    with pytest.raises(sm.StageError, match="is a symlink"):
        stage(src, shm)
    assert list(elsewhere.iterdir()) == []


@as_root
def test_a_stage_dir_others_can_rewrite_is_refused(src: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # world-writable without the sticky bit: models could be swapped
    with pytest.raises(sm.StageError, match="another user could replace"):
        stage(src, loose)


def test_models_is_made_root_only_writable_and_its_mode_is_enforced(src: Path, shm: Path) -> None:
    stage(src, shm)
    models = shm / "models"
    assert (models.stat().st_mode & 0o7777, models.stat().st_uid) == (0o755, os.geteuid())
    assert (models / ".m.lock").stat().st_mode & 0o777 == 0o600
    models.chmod(0o777)
    stage(src, shm)
    assert models.stat().st_mode & 0o7777 == 0o755


def test_leftovers_are_reported_as_space_that_will_be_freed(src: Path, shm: Path) -> None:
    stage(src, shm)
    served = shm / "models" / os.readlink(shm / "models" / "m")
    killed = shm / "models" / ".m.tmp-99999"
    killed.mkdir()
    (killed / "model-00000.safetensors").write_bytes(os.urandom(300_000))
    os.link(served / "config.json", killed / "config.json")  # shared with the served copy

    planned = sm.plan(str(src), str(shm), "m")
    assert planned["leftovers"] == [str(killed)]
    # The private shard counts, the hard link to the served copy frees nothing.
    assert 300_000 <= planned["leftover_bytes"] < 300_000 + 64 * 1024


def test_the_plan_counts_leftovers_as_free_and_stages_beside() -> None:
    # 30 GiB free, 25 GiB of a killed copy's leftovers, 50 GiB to copy beside the 50 GiB one:
    # beside fits once the leftovers go; counting them as used would stop every rank.
    source, served = Copy("new", 50 * GIB, 19), Copy("old", 50 * GIB, 19)
    staging = Staging(
        source=source,
        staged=served,
        copy_bytes=50 * GIB,
        changed_files=["a"],
        leftovers=["/dev/shm/models/.x.tmp-1"],
        leftover_bytes=25 * GIB,
    )
    room = Resources(stage_total_bytes=200 * GIB, stage_free_bytes=30 * GIB)
    assert decide(make_settings(), room, staging, False).mode == "beside"
    without = Staging(**{**staging.__dict__, "leftover_bytes": 0})
    assert decide(make_settings(), room, without, False).mode == "inplace"


def test_full_verify_repairs_without_the_served_name_ever_missing_a_copy(
    src: Path, shm: Path
) -> None:
    stage(src, shm)
    link = shm / "models" / "m"
    served = link.parent / os.readlink(link)
    (served / "model-00001.safetensors").write_bytes(os.urandom(100_000))  # bit rot
    want = {p.name: p.read_bytes() for p in src.iterdir()}

    removed: list[str] = []

    def checked_remove(path: str) -> None:
        # Whenever anything is removed, the served name holds a complete, correct copy.
        assert {p.name: p.read_bytes() for p in link.resolve().iterdir() if p.name in want} == (
            want
        )
        removed.append(path)
        sm.remove(path)

    result = stage(src, shm, verify="full", remove_path=checked_remove)
    assert result["changed"] and removed
    assert {p.name: p.read_bytes() for p in link.resolve().iterdir() if p.name in want} == want
    assert not [p for p in link.parent.iterdir() if ".tmp-" in p.name or p.name.endswith(".old")]


@pytest.mark.integration
@as_root
def test_with_the_servers_group_the_weights_are_not_world_readable(
    src: Path, shm: Path, tmp_path: Path
) -> None:
    argv = [sys.executable, str(script_path("stage_model.py")), "stage", str(src), str(shm), "m"]
    proc = subprocess.run(
        [*argv, "--group", "daemon", "--progress-interval", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    daemon = grp.getgrnam("daemon").gr_gid
    models = shm / "models"
    copy = models / os.readlink(models / "m")
    assert models.stat().st_mode & 0o7777 == 0o755
    assert (copy.stat().st_mode & 0o7777, copy.stat().st_gid) == (0o750, daemon)
    for shard in copy.glob("model-*"):
        assert (shard.stat().st_mode & 0o7777, shard.stat().st_uid) == (0o640, 0)
        assert shard.stat().st_gid == daemon

    missing = subprocess.run(
        [*argv, "--group", "no-such-group-e2e"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == sm.EXIT_REFUSED and "does not exist" in missing.stderr
