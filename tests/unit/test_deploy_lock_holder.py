"""The deploy lock's holder (operations/programs/deploy_lock_holder.py), its parts in this
process; tests/unit/test_deploy_lock_dead_run.py runs it whole, bundled, as the host does."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from operations.programs import deploy_lock_holder as holder
from operations.render.host_scripts import script_text
from operations.runtime.deploy_lock import HOLDER


@pytest.fixture
def lock(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "deploy.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    yield path, fd
    os.close(fd)


def _held_by_another(path: Path) -> bool:
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(other)
    return False


def test_a_free_lock_is_taken_at_once_and_says_nothing(
    lock: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, fd = lock
    holder.take(fd, wait_s=1)
    assert _held_by_another(path)
    assert capsys.readouterr().out == ""


def test_who_holds_is_what_the_holder_wrote(lock: tuple[Path, int]) -> None:
    path, fd = lock
    assert holder.holder(fd) == "unknown"
    path.write_text("deploy by ann@laptop (pyinfra pid 7), host pid 9, since now\n")
    assert holder.holder(fd) == "deploy by ann@laptop (pyinfra pid 7), host pid 9, since now"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_lock_file_of_another_user_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deploy.lock"
    path.write_text("planted\n")
    os.chown(path, 1, 1)
    code = holder.main([str(path), "deploy by ann", "5", "15"])
    assert code == holder.FOREIGN_EXIT
    assert capsys.readouterr().out == f"foreign {path} is not owned by root\n"
    assert path.read_text() == "planted\n"
    assert not _held_by_another(path)


def test_a_link_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / "deploy.lock").symlink_to(target)
    with pytest.raises(OSError):
        holder.main([str(tmp_path / "deploy.lock"), "deploy by ann", "5", "15"])
    assert target.read_text() == "keep\n"


def test_the_host_gets_the_program_whole_and_imports_nothing_of_ours() -> None:
    text = script_text(HOLDER)
    assert "operations" not in "".join(
        line for line in text.splitlines() if line.startswith(("import", "from"))
    )
    compile(text, HOLDER, "exec")
    assert "def take(" in text and "def hold(" in text
