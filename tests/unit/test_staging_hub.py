"""The link rule (operations/programs/stage_manifest.py, docs/how-it-works/model.md, "Hugging Face
cache snapshots and links in the source"): a
link in the source that resolves inside the source's root to a regular file is staged as a
regular file with that content; the root is the source, or for a Hugging Face cache snapshot
(models--ORG--NAME/snapshots/REV, every file a relative link into ../../blobs/) the repository's
folder. A link that leaves the root, resolves to a directory, a FIFO or a device, dangles or
loops is refused naming the link, and nothing outside the root is ever opened.

Before the rule, every link was refused: a hub snapshot, how `huggingface-cli download` leaves
the weights, could not be deployed at all (the first test)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations.facts.host import ModelSource, parse_model
from operations.facts.model import local_model, script_module
from tests.unit.shipped import script_path

pytestmark = pytest.mark.integration  # runs the staging script and the hub CLI double

sm = script_module()
SECRET = "root-only-secret-9b2e"
REVISION = "0123456789abcdef0123456789abcdef01234567"
CONFIG = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def hub_snapshot(cache: Path, files: dict[str, bytes]) -> Path:
    """What huggingface_hub leaves (0.34.4 file_download.py: blob_path, _get_pointer_path,
    _create_symlink's relative link): models--ORG--NAME/blobs/ETAG and
    snapshots/REV/FILE -> ../../blobs/ETAG (one more ../ per subdirectory of FILE)."""
    repo = cache / "models--e2e-org--tiny"
    snapshot = repo / "snapshots" / REVISION
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def files() -> dict[str, bytes]:
    return {
        "config.json": CONFIG.encode(),
        "model-00001-of-00002.safetensors": os.urandom(70_000),
        "model-00002-of-00002.safetensors": os.urandom(50_000),
        "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    }


@pytest.fixture
def snapshot(tmp_path: Path, files: dict[str, bytes]) -> Path:
    return hub_snapshot(tmp_path / "hub", files)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may read (like /etc/shadow), outside every source."""
    path = tmp_path / "root-only" / "shadow"
    path.parent.mkdir(mode=0o700)
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "config.json").write_text(CONFIG)
    (root / "model-00001-of-00001.safetensors").write_bytes(os.urandom(4096))
    return root


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    path = tmp_path / "shm"
    path.mkdir()
    path.chmod(0o1777)
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The staging script as the deploy and the boot unit run it."""
    return subprocess.run(
        [sys.executable, str(script_path("stage_model.py")), *argv],
        capture_output=True,
        text=True,
        check=False,
    )


def stage(source: Path, shm: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run("stage", str(source), str(shm), "m", "--progress-interval", "0", *extra)


def staged_tree(shm: Path) -> dict[str, bytes]:
    """The served copy's files (not the manifest), each checked to be a regular file."""
    copy = (shm / "models" / "m").resolve()
    found = {}
    for path in copy.rglob("*"):
        mode = path.lstat().st_mode
        assert not stat.S_ISLNK(mode), f"{path} is a link in the staged copy"
        if stat.S_ISREG(mode) and path.name != sm.MANIFEST:
            found[str(path.relative_to(copy))] = path.read_bytes()
    return found


def everything_staged(shm: Path) -> str:
    models = shm / "models"
    if not models.exists():
        return ""
    return "".join(p.read_text(errors="replace") for p in models.rglob("*") if p.is_file())


def refused(proc: subprocess.CompletedProcess[str], link: Path, why: str) -> None:
    assert proc.returncode == sm.EXIT_REFUSED, proc
    assert f"{link} is a symbolic link" in proc.stderr and why in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path the staging code opens or stats in this process, as the kernel names it
    (a dir_fd's own path joined with the name): to prove what is never touched."""
    seen: list[str] = []
    real_open, real_stat = os.open, os.stat

    def where(path: Any, dir_fd: int | None) -> str:
        if dir_fd is None:
            return os.path.abspath(os.fsdecode(path))
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))

    def spy_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        seen.append(where(path, dir_fd))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def spy_stat(path: Any, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
        if not isinstance(path, int):
            seen.append(where(path, dir_fd))
        return real_stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "stat", spy_stat)
    yield seen


# -- a hub snapshot ---------------------------------------------------------------------------


def test_a_hub_snapshot_is_staged_as_regular_files_with_the_blobs_content(
    snapshot: Path, shm: Path, files: dict[str, bytes]
) -> None:
    proc = stage(snapshot, shm, "--verify", "full")
    assert proc.returncode == 0, proc.stderr
    assert staged_tree(shm) == files
    # The plan (the ModelStaging fact) agrees: a second run changes nothing.
    plan = json.loads(run("plan", str(snapshot), str(shm), "m").stdout.splitlines()[-1])
    assert plan["error"] is None and plan["up_to_date"], plan
    assert plan["source"]["bytes"] == sum(map(len, files.values()))
    again = json.loads(stage(snapshot, shm).stdout.splitlines()[-1])
    assert again["changed"] is False


def test_a_snapshot_and_the_same_files_copied_plainly_have_one_digest(
    snapshot: Path, tmp_path: Path
) -> None:
    """The manifest describes the content (path, size, mtime of what each link resolves to),
    so the key of a staged snapshot is the key of its files copied plainly (cp -L, mtimes
    kept) and rsync --copy-links of a controller snapshot converges on the target."""
    plain = tmp_path / "plain"
    shutil.copytree(snapshot, plain, symlinks=False)  # copy2: contents and mtimes
    assert sm.scan(str(snapshot)) == sm.scan(str(plain))


def test_the_model_source_fact_measures_and_reads_a_snapshot(
    snapshot: Path, files: dict[str, bytes]
) -> None:
    """Before the rule: du counted the links' bytes and the linked config.json was 'no
    readable config.json', so preflight refused every snapshot."""
    command = ModelSource().command(str(snapshot)).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    model = parse_model(out.stdout.splitlines())
    assert model.size_bytes == sum(map(len, files.values()))
    assert model.architecture == "Qwen3_5ForConditionalGeneration", out
    # On the controller: the same code, the same answer.
    assert local_model(str(snapshot)) == model


def test_a_snapshot_is_detected_by_its_layout_only(tmp_path: Path, shm: Path) -> None:
    """snapshots/REV under a folder that is not models--ORG--NAME is a plain source: a link
    to ../../blobs leaves it."""
    snapshot = hub_snapshot(tmp_path / "hub", {"config.json": CONFIG.encode()})
    plain = tmp_path / "elsewhere"
    shutil.copytree(snapshot.parent.parent, plain, symlinks=True)
    source = plain / "snapshots" / REVISION
    refused(stage(source, shm), source / "config.json", f"that leaves {source}")


def test_a_snapshot_reached_through_a_link_is_still_a_snapshot(
    snapshot: Path, tmp_path: Path, shm: Path, files: dict[str, bytes]
) -> None:
    """model_source may name the snapshot through a link of the operator's (its own path is
    followed, as ever): the layout is that of the directory it names."""
    named = tmp_path / "qwen"
    named.symlink_to(snapshot, target_is_directory=True)
    assert stage(named, shm).returncode == 0
    assert staged_tree(shm) == files


def test_a_link_out_of_the_repository_folder_is_refused_and_never_opened(
    snapshot: Path, shm: Path, secret: Path, opened: list[str]
) -> None:
    link = snapshot / "tokenizer_config.json"
    link.symlink_to(os.path.relpath(secret, link.parent))  # ../../../root-only/shadow
    with pytest.raises(sm.StageError, match="that leaves") as exc:
        sm.stage(str(snapshot), str(shm), "m", progress_interval=0)
    assert f"{link} is a symbolic link" in str(exc.value)
    assert not [p for p in opened if p.startswith(str(secret.parent))], opened
    assert SECRET not in everything_staged(shm)


# -- in-tree links and what the rule refuses ---------------------------------------------------


def test_an_in_tree_link_to_a_file_is_staged_as_a_regular_file(src: Path, shm: Path) -> None:
    (src / "tokenizer").mkdir()
    (src / "tokenizer" / "tokenizer.json").write_text('{"t": 1}')
    (src / "tokenizer.json").symlink_to("tokenizer/tokenizer.json")
    (src / "tokenizer" / "vocab.json").symlink_to("../tokenizer.json")  # a chain, inside
    assert stage(src, shm, "--verify", "full").returncode == 0
    tree = staged_tree(shm)
    assert tree["tokenizer.json"] == tree["tokenizer/vocab.json"] == b'{"t": 1}'


def test_an_absolute_link_spelled_inside_the_source_is_staged(src: Path, shm: Path) -> None:
    (src / "generation_config.json").write_text("{}")
    (src / "extra.json").symlink_to(src / "generation_config.json")
    assert stage(src, shm).returncode == 0
    assert staged_tree(shm)["extra.json"] == b"{}"


def test_an_absolute_link_spelled_through_the_sources_own_link_is_staged(
    src: Path, tmp_path: Path, shm: Path
) -> None:
    """model_source named through a link (/mnt/m -> /data/m): an absolute link spelled with
    either path is inside; the rest of it is still walked from the root's descriptor."""
    named = tmp_path / "named"
    named.symlink_to(src, target_is_directory=True)
    (src / "a.json").symlink_to(named / "config.json")
    (src / "b.json").symlink_to(named / ".." / "root-only" / "shadow")
    refused(stage(named, shm), named / "b.json", "that leaves")
    (src / "b.json").unlink()
    assert stage(named, shm).returncode == 0
    assert staged_tree(shm)["a.json"] == CONFIG.encode()


def test_the_preflight_round_trip_with_the_source_script_fits_in_one_argument() -> None:
    """The ModelSource fact sends stage_source.py inline inside the preflight fact's one
    command: under Linux's MAX_ARG_STRLEN with sudo's wrapping, and with room to grow."""
    from pyinfra.connectors.util import make_unix_command

    from operations.facts.preflight import PreflightFacts
    from operations.render import host_scripts

    command = PreflightFacts().command(
        "/dev/shm", "/opt/sglang", ["/opt/sglang"] * 8, model_path="/mnt/" + "m" * 200
    )
    for sudo in (False, True):
        raw = make_unix_command(command, _sudo=sudo).get_raw_value()
        assert len(raw.encode()) + 1 < host_scripts.ARG_STRLEN_MAX // 2, sudo


def test_a_relative_link_that_leaves_the_source_is_refused_never_read(
    src: Path, shm: Path, secret: Path, opened: list[str]
) -> None:
    link = src / "tokenizer.json"
    link.symlink_to("../root-only/shadow")
    with pytest.raises(sm.StageError, match=r"\(to \.\./root-only/shadow\) that leaves"):
        sm.scan(str(src))
    assert not [p for p in opened if p.startswith(str(secret.parent))], opened
    proc = stage(src, shm)
    refused(proc, link, "that leaves")
    assert SECRET not in proc.stdout + proc.stderr + everything_staged(shm)


def test_a_chain_that_leaves_is_refused_naming_the_link_in_the_source(
    src: Path, shm: Path, secret: Path
) -> None:
    (src / "inner").mkdir()
    (src / "inner" / "hop").symlink_to("../../root-only/shadow")
    (src / "tokenizer.json").symlink_to("inner/hop")
    refused(stage(src, shm), src / "tokenizer.json", "that leaves")
    # Out and back in again is out: `..` is never taken above the root.
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(f"../{src.name}/config.json")
    refused(stage(src, shm), src / "tokenizer.json", "that leaves")
    assert SECRET not in everything_staged(shm)


def test_a_link_through_a_linked_directory_that_leaves_is_refused(
    src: Path, shm: Path, secret: Path
) -> None:
    """A directory component of the resolved path is a link out: refused, not followed."""
    (src / "sub").symlink_to(secret.parent, target_is_directory=True)
    refused(stage(src, shm), src / "sub", "that leaves")
    (src / "sub").unlink()
    (src / "tokenizer.json").symlink_to("sub/shadow")
    (src / "sub").symlink_to(secret.parent, target_is_directory=True)
    refused(stage(src, shm), src / "sub", "that leaves")  # os.walk names the directory first


def test_a_link_to_a_directory_in_the_source_is_refused(src: Path, shm: Path) -> None:
    (src / "tokenizer").mkdir()
    (src / "tok").symlink_to("tokenizer", target_is_directory=True)
    refused(stage(src, shm), src / "tok", "a directory")


def test_a_link_to_a_fifo_is_refused_without_opening_it(src: Path, shm: Path) -> None:
    """Opened, a FIFO with no writer would hang the copy: it is never opened."""
    os.mkfifo(src / "pipe")
    (src / "tokenizer.json").symlink_to("pipe")
    refused(stage(src, shm), src / "tokenizer.json", "a FIFO")


@as_root
def test_a_link_to_a_device_node_is_refused(src: Path, shm: Path) -> None:
    os.mknod(src / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    (src / "tokenizer.json").symlink_to("zero")
    refused(stage(src, shm), src / "tokenizer.json", "a device node")


def test_a_dangling_link_is_refused(src: Path, shm: Path) -> None:
    (src / "tokenizer.json").symlink_to("missing.json")
    refused(stage(src, shm), src / "tokenizer.json", "that dangles")


def test_a_loop_is_refused(src: Path, shm: Path) -> None:
    (src / "a.json").symlink_to("b.json")
    (src / "b.json").symlink_to("a.json")
    refused(stage(src, shm), src / "a.json", "in a loop")
    for name in ("a.json", "b.json"):
        (src / name).unlink()
    (src / "self.json").symlink_to("self.json")
    refused(stage(src, shm), src / "self.json", "in a loop")


def test_a_blob_directory_swapped_for_a_link_after_the_scan_is_refused(
    snapshot: Path, secret: Path
) -> None:
    """The copy resolves and opens each component again, from its parent's descriptor: what
    the scan saw is not trusted."""
    files = sm.scan(str(snapshot))["files"]
    blobs = snapshot.parent.parent / "blobs"
    shutil.rmtree(blobs)
    blobs.symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(sm.StageError, match="that leaves"):
        sm.open_source(str(snapshot), files[0]["path"])


def test_the_controller_directory_refused_by_the_rule_is_refused_in_the_plan(
    src: Path, secret: Path
) -> None:
    """A controller source is scanned there by the same rule: a link it refuses is the
    plan's refusal, before anything is sent (rsync --copy-links would follow it)."""
    from operations.plan.staging import decide_stage
    from operations.runtime.gather import controller_scan
    from tests.unit.builders import make_settings

    (src / "tokenizer.json").symlink_to(secret)
    settings = make_settings(model_source=f"controller:{src}")
    decision = decide_stage(settings, None, None, None, set(), controller_scan(str(src)))
    assert decision.refused and "tokenizer.json is a symbolic link" in decision.plan.why
    assert "on the controller" in decision.plan.why
    assert local_model(str(src)).architecture == "Qwen3_5ForConditionalGeneration"
