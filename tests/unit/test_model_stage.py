"""The staging script on local directories: the same code the deploy and the boot unit run."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from operations.facts.model import script_module, script_text
from tests.unit.shipped import script_path

sm = script_module()
SCRIPT = script_path("stage_model.py")
HF_DOUBLE = Path(__file__).resolve().parent.parent / "doubles" / "hf"
CONFIG = {"architectures": ["Qwen3_5ForConditionalGeneration"]}


def make_model(root: Path, shards: int = 3, shard_bytes: int = 200_000) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    for i in range(shards):
        (root / f"model-{i:05d}.safetensors").write_bytes(os.urandom(shard_bytes))
    return root


def stage(src: Path, shm: Path, **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = sm.stage(str(src), str(shm), "m", progress_interval=0, **kwargs)
    return result


def served(shm: Path) -> Path:
    return shm / "models" / "m"


def same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if not p.name.startswith("."))
    return names == sorted(p.name for p in b.iterdir() if not p.name.startswith(".")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_model(tmp_path / "src")


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    path = tmp_path / "shm"
    path.mkdir()
    return path


def test_stage_then_unchanged(src: Path, shm: Path) -> None:
    first = stage(src, shm)
    assert first["changed"] and first["copied_files"] == 4
    assert same_tree(src, served(shm))
    assert served(shm).is_symlink()

    again = stage(src, shm)
    assert again == {"changed": False, "digest": first["digest"], "bytes": first["bytes"]}
    assert sm.plan(str(src), str(shm), "m")["up_to_date"]


def test_changed_shard_is_the_only_copy_and_the_rest_are_links(src: Path, shm: Path) -> None:
    stage(src, shm)
    old = os.readlink(served(shm))
    inode = (served(shm) / "model-00000.safetensors").stat().st_ino
    (src / "model-00001.safetensors").write_bytes(os.urandom(200_000))

    planned = sm.plan(str(src), str(shm), "m")
    assert planned["changed_files"] == ["model-00001.safetensors"]
    assert planned["copy_bytes"] == 200_000
    result = stage(src, shm)

    assert result["copied_files"] == 1
    assert os.readlink(served(shm)) != old
    assert same_tree(src, served(shm))
    # Superseded version removed; unchanged shards share inodes with what was staged before.
    new = os.readlink(served(shm))
    assert sorted(p.name for p in (shm / "models").iterdir()) == sorted([".m.lock", new, "m"])
    assert (served(shm) / "model-00000.safetensors").stat().st_ino == inode


def test_interrupted_copy_is_never_served_and_is_cleaned(src: Path, shm: Path) -> None:
    stage(src, shm)
    current = os.readlink(served(shm))
    # What a killed run leaves: a partial temp copy beside the served one.
    partial = shm / "models" / ".m.tmp-99999"
    partial.mkdir()
    (partial / "model-00000.safetensors").write_bytes(b"half")
    assert sm.plan(str(src), str(shm), "m")["leftovers"] == [str(partial)]
    assert not sm.plan(str(src), str(shm), "m")["up_to_date"]

    result = stage(src, shm)

    assert result["changed"] and not partial.exists()
    assert os.readlink(served(shm)) == current


def test_dangling_link_after_killed_in_place_swap_is_removed(src: Path, shm: Path) -> None:
    (shm / "models").mkdir()
    os.symlink(".m@gone", served(shm))
    assert sm.Layout(str(shm), "m").current() is None
    stage(src, shm)
    assert same_tree(src, served(shm))


def test_file_changing_during_copy_switches_nothing(
    src: Path, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.sendfile

    def growing(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        sent = real(out_fd, in_fd, offset, count)
        with open(src / "model-00002.safetensors", "ab") as fh:
            fh.write(b"more")
        return sent

    monkeypatch.setattr(os, "sendfile", growing)
    with pytest.raises(sm.StageError, match="changed") as info:
        stage(src, shm)
    assert info.value.code == sm.EXIT_CHANGED
    assert not served(shm).exists()
    assert [p.name for p in (shm / "models").iterdir()] == [".m.lock"]


def test_a_missing_source_is_refused(tmp_path: Path, shm: Path) -> None:
    with pytest.raises(sm.StageError, match="no such directory"):
        stage(tmp_path / "nope", shm)
    assert "no such directory" in sm.plan(str(tmp_path / "nope"), str(shm), "m")["error"]


def unprivileged() -> tuple[str, dict[str, Any]]:
    """A python and subprocess.run arguments for a process that file permissions bind. As root
    (CI runs the tests as root) that is nobody: root passes every local permission check, but
    a model on a root-squashed NFS export is read as nobody. Otherwise this user, as it is."""
    if os.geteuid() != 0:
        return sys.executable, {}
    nobody = pwd.getpwnam("nobody")
    # The boot unit's interpreter: nobody cannot enter a virtualenv under /root.
    return "/usr/bin/python3", {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


@pytest.mark.integration
def test_unreadable_sources_are_refused_by_the_script_as_a_user_bound_by_permissions() -> None:
    # Outside pytest's 0700 tmp tree, so that nobody can reach everything but what is locked.
    with tempfile.TemporaryDirectory(prefix="stage-unreadable-") as name:
        top = Path(name)
        top.chmod(0o755)
        script = top / "stage_model.py"
        script.write_text(script_text())
        shm = top / "shm"
        shm.mkdir(mode=0o1777)
        shm.chmod(0o1777)
        file_locked = make_model(top / "file-locked")
        (file_locked / "config.json").chmod(0)
        dir_locked = make_model(top / "dir-locked")
        dir_locked.chmod(0o700)
        python, who = unprivileged()
        cases = [
            (file_locked, f"model source: {file_locked}/config.json is not readable"),
            (dir_locked, f"model source {dir_locked}: not readable"),
        ]
        for src, said in cases:
            argv = [python, str(script), "stage", str(src), str(shm), "m"]
            run = subprocess.run(
                [*argv, "--progress-interval", "0"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                **who,
            )
            assert (run.returncode, run.stderr.strip()) == (
                sm.EXIT_REFUSED,
                f"stage: error: {said}",
            )
        assert sorted(p.name for p in (shm / "models").iterdir()) == [".m.lock"]


def test_no_room_is_refused_before_copying(src: Path, shm: Path) -> None:
    with pytest.raises(sm.StageError, match=r"needs 600\d+ bytes .* 1000 bytes") as info:
        stage(src, shm, measure_free=lambda directory: 1000)
    assert info.value.code == sm.EXIT_REFUSED
    assert [p.name for p in (shm / "models").iterdir()] == [".m.lock"]


def test_in_place_swap_when_beside_does_not_fit(src: Path, shm: Path) -> None:
    stage(src, shm)
    (src / "model-00000.safetensors").write_bytes(os.urandom(200_000))
    free = iter([10, 10**9])  # beside: no room; after removing the current copy: room
    measured: list[str] = []

    def measure(directory: str) -> int:
        measured.append(directory)
        return next(free)

    result = stage(src, shm, mode="inplace", measure_free=measure)
    assert measured == [str(shm / "models")] * 2
    assert result["copied_files"] == 4
    assert same_tree(src, served(shm))


def test_full_verify_finds_a_damaged_copy_and_restages(src: Path, shm: Path) -> None:
    stage(src, shm)
    victim = served(shm) / "model-00002.safetensors"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    st = victim.stat()
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime

    assert sm.plan(str(src), str(shm), "m")["up_to_date"]  # a manifest cannot see it
    assert sm.plan(str(src), str(shm), "m", "full")["mismatched"] == ["model-00002.safetensors"]
    assert stage(src, shm, verify="full")["changed"]
    assert same_tree(src, served(shm))


@pytest.mark.integration
def test_hub_checksums_enter_the_manifest(tmp_path: Path) -> None:
    dest = tmp_path / "hub"
    log = tmp_path / "hf.log"
    env = {**os.environ, "HF_DOUBLE_LOG": str(log), "HF_TOKEN": "hf_secret_value"}
    subprocess.run(
        [str(HF_DOUBLE), "download", "org/m", "--revision", "r1", "--local-dir", str(dest)],
        env=env,
        check=True,
        capture_output=True,
    )
    files = {e["path"]: e for e in sm.scan(str(dest))["files"]}
    assert set(files) == {
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert len(files["model-00001-of-00002.safetensors"]["sha256"]) == 64
    assert "sha256" not in files["config.json"]  # a git sha1 etag is not a content sha256
    assert "hf_secret_value" not in log.read_text()


@pytest.mark.integration
def test_fetch_hub_downloads_once_with_the_token_only_in_the_environment(tmp_path: Path) -> None:
    log = tmp_path / "hf.log"
    token = tmp_path / "token"
    token.write_text("hf_secret_value\n")
    env = {**os.environ, "HF_DOUBLE_LOG": str(log)}
    argv = [sys.executable, str(SCRIPT), "fetch-hub", "--cli", str(HF_DOUBLE)]
    argv += ["--repo", "org/m", "--revision", "r1", "--dest", str(tmp_path / "d")]
    argv += ["--token-file", str(token)]

    first = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    second = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)

    assert json.loads(first.stdout.splitlines()[-1]) == {"changed": True}
    assert json.loads(second.stdout.splitlines()[-1]) == {"changed": False}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1 and calls[0]["token"] is True
    assert "hf_secret_value" not in first.stdout + first.stderr + log.read_text()


@pytest.mark.integration
def test_failed_download_leaves_no_marker(tmp_path: Path) -> None:
    env = {**os.environ, "HF_DOUBLE_LOG": str(tmp_path / "log"), "HF_DOUBLE_FAIL": "1"}
    argv = [sys.executable, str(SCRIPT), "fetch-hub", "--cli", str(HF_DOUBLE)]
    argv += ["--repo", "org/m", "--revision", "r1", "--dest", str(tmp_path / "d")]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "failed" in proc.stderr
    assert not (tmp_path / "d" / sm.HUB_MARKER).exists()


@pytest.mark.integration
def test_cli_prints_progress_then_json(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", shards=2, shard_bytes=3_000_000)
    shm = tmp_path / "shm"
    shm.mkdir()
    argv = [sys.executable, str(SCRIPT), "stage", str(src), str(shm), "m"]
    proc = subprocess.run(
        [*argv, "--progress-interval", "0.001", "--bwlimit-mbps", "100"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert any("MiB/s" in line and "left" in line for line in lines[:-1]), lines
    assert json.loads(lines[-1])["changed"] is True


@pytest.mark.integration
def test_sigterm_removes_the_copy_in_progress(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", shards=2, shard_bytes=20_000_000)
    shm = tmp_path / "shm"
    shm.mkdir()
    argv = [sys.executable, str(SCRIPT), "stage", str(src), str(shm), "m"]
    proc = subprocess.Popen(
        [*argv, "--bwlimit-mbps", "5", "--progress-interval", "0.05"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first progress line: the copy is under way
            if "MiB/s" in line:
                break
        assert any(p.name.startswith(".m.tmp-") for p in (shm / "models").iterdir())
        proc.terminate()
        assert proc.wait(timeout=30) != 0
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in (shm / "models").iterdir()) == [".m.lock"]


@pytest.mark.integration
def test_a_branch_is_warned_about_and_the_plan_shows_the_commit_it_resolved_to(
    tmp_path: Path,
) -> None:
    """hf://REPO@main: the download resolves the branch (the hub CLI double records the commit
    in its --local-dir metadata as the real one does); the staging plan reads that commit and
    the host's plan shows it beside its warning. A 40-hex commit gets no warning."""
    import hashlib

    from operations.facts.model import parse_staging
    from operations.plan.model_plan import hub_revision
    from tests.unit.builders import make_settings

    dest = tmp_path / "d"
    env = {**os.environ, "HF_DOUBLE_LOG": str(tmp_path / "log")}
    argv = [sys.executable, str(SCRIPT), "fetch-hub", "--cli", str(HF_DOUBLE)]
    argv += ["--repo", "Qwen/Qwen3.6-27B", "--revision", "main", "--dest", str(dest)]
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    commit = hashlib.sha1(b"Qwen/Qwen3.6-27B@main").hexdigest()
    shm = tmp_path / "shm"
    shm.mkdir()
    answer = json.dumps(sm.plan(str(dest), str(shm), "m"))
    staging = parse_staging([answer])
    assert staging.hub_revision == "main" and staging.hub_commit == commit

    settings = make_settings(model_source="hf://Qwen/Qwen3.6-27B@main")
    decision, warning = hub_revision(settings, staging)
    assert decision.value == f"main -> commit {commit}"
    assert warning is not None and "'main' is a branch or tag, not a 40-hex commit" in warning
    assert f"pin hf://Qwen/Qwen3.6-27B@{commit}" in warning
    before, warned = hub_revision(settings, None)  # not downloaded yet: no commit to show
    assert "at the download" in before.value and warned and "@COMMIT" in warned
    pinned = make_settings(model_source=f"hf://Qwen/Qwen3.6-27B@{commit}")
    assert hub_revision(pinned, None)[1] is None
