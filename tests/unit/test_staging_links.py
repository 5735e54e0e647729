"""A model source is often a shared mount another user (or host) writes: the staging copy runs
as root. A link in the source is followed only by the link rule (test_staging_hub.py: inside the
source's root, to a regular file); one that leaves the source (a file, a directory, the hub
marker, the hub's metadata) is refused with its path, or ignored where it is only a hint; it is
never followed. The attack: tokenizer.json in the source links to a root-only file, and a copy
staged root:GROUP 0640 would hand that file's content to every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from operations.facts.model import script_module
from tests.unit.shipped import script_path

pytestmark = pytest.mark.integration  # runs the staging script

sm = script_module()
SECRET = "root-only-secret-4f1c"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may read (like /etc/shadow), outside the source."""
    path = tmp_path / "root-only" / "shadow"
    path.parent.mkdir(mode=0o700)
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    (root / "model-00000.safetensors").write_bytes(os.urandom(4096))
    return root


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    path = tmp_path / "shm"
    path.mkdir()
    path.chmod(0o1777)
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The script as the deploy and the boot unit run it."""
    return subprocess.run(
        [sys.executable, str(script_path("stage_model.py")), *argv],
        capture_output=True,
        text=True,
        check=False,
    )


def staged_text(shm: Path) -> str:
    models = shm / "models"
    found = [p.read_text(errors="replace") for p in models.rglob("*") if p.is_file()]
    return "".join(found)


def test_a_tokenizer_linked_to_a_root_only_file_is_refused_never_staged(
    src: Path, shm: Path, secret: Path
) -> None:
    (src / "tokenizer.json").symlink_to(secret)
    proc = run("stage", str(src), str(shm), "m", "--progress-interval", "0")
    assert proc.returncode == sm.EXIT_REFUSED, proc
    assert f"{src / 'tokenizer.json'} is a symbolic link (to {secret})" in proc.stderr, proc
    assert SECRET not in proc.stdout + proc.stderr + staged_text(shm)
    assert not (shm / "models" / "m").exists()
    # The plan (the ModelStaging fact) says the same, before any change.
    plan = json.loads(run("plan", str(src), str(shm), "m").stdout.splitlines()[-1])
    assert "tokenizer.json is a symbolic link" in plan["error"] and plan["source"] is None


def test_a_linked_directory_in_the_source_is_refused(src: Path, shm: Path, secret: Path) -> None:
    (src / "tokenizer").symlink_to(secret.parent, target_is_directory=True)
    proc = run("stage", str(src), str(shm), "m", "--progress-interval", "0")
    assert proc.returncode == sm.EXIT_REFUSED and f"{src / 'tokenizer'} is a symbolic link" in (
        proc.stderr
    ), proc
    assert SECRET not in staged_text(shm)


def test_a_file_swapped_for_a_link_after_the_scan_is_refused(
    src: Path, shm: Path, secret: Path
) -> None:
    """The copy opens every component with O_NOFOLLOW: the scan's lstat is not trusted."""
    files = sm.scan(str(src))["files"]
    (src / "config.json").unlink()
    (src / "config.json").symlink_to(secret)
    with pytest.raises(sm.StageError, match=r"config\.json is a symbolic link"):
        sm.open_source(str(src), "config.json")
    assert [e["path"] for e in files] == ["config.json", "model-00000.safetensors"]


def test_a_hub_marker_or_metadata_linked_to_a_root_only_file_is_not_read(
    src: Path, shm: Path, secret: Path
) -> None:
    (src / ".cache").mkdir()
    (src / ".cache" / "sglang-hub-complete").symlink_to(secret)
    plan = json.loads(run("plan", str(src), str(shm), "m").stdout.splitlines()[-1])
    assert plan["hub_revision"] is None and SECRET not in json.dumps(plan)
    # .cache itself a link: nothing under it is read either.
    (src / ".cache" / "sglang-hub-complete").unlink()
    (src / ".cache").rmdir()
    (src / ".cache").symlink_to(secret.parent, target_is_directory=True)
    (secret.parent / "sglang-hub-complete").write_text(SECRET)
    plan = json.loads(run("plan", str(src), str(shm), "m").stdout.splitlines()[-1])
    assert plan["hub_revision"] is None and SECRET not in json.dumps(plan)


def test_regular_files_stage_as_before(src: Path, shm: Path) -> None:
    proc = run("stage", str(src), str(shm), "m", "--progress-interval", "0", "--verify", "full")
    assert proc.returncode == 0, proc.stderr
    copy = shm / "models" / "m"
    assert (copy / "config.json").read_text() == (src / "config.json").read_text()


def test_the_model_source_fact_never_reads_config_json_through_a_link(
    src: Path, secret: Path
) -> None:
    """The ModelSource fact's own command, run here: a linked config.json is 'no config'."""
    from operations.facts.host import ModelSource, parse_model

    secret.write_text(json.dumps({"architectures": [SECRET]}))
    (src / "config.json").unlink()
    (src / "config.json").symlink_to(secret)
    command = ModelSource().command(str(src)).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert SECRET not in out.stdout
    assert parse_model(out.stdout.splitlines()).config_error == "no readable config.json"
