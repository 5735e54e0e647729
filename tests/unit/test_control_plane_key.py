"""The router's control-plane key with router.control_plane_key_file unset: the first run makes
it beside the engine locks on the controller (mode 600 from its creation), every later run and
every other host reads it, the plan shows its path and never its text, and a key file another
user could have written is refused in one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from operations import kb
from operations.facts.serve import Serving
from operations.plan import resolver
from operations.plan.host_plan import decide
from operations.settings import Layer, Settings, controller_problems, load
from operations.settings.controller_files import (
    CONTROL_PLANE_KEY_NAME,
    make_key,
    writable_by_others,
)
from tests.unit.builders import BASE
from tests.unit.test_host_report import gathered, staging


def run_settings(host: str, locks: Path, **extra: Any) -> Settings:
    """A host's settings as a run of the toolkit loads them (runtime/inventory: make_key)."""
    data = {**BASE, "router": {"host": "ct200"}, "engine_lock_dir": str(locks), **extra}
    return load(host, [Layer("the inventory's 'all' data", data)], make_key=True)


def test_the_first_run_makes_the_key_and_every_other_host_and_run_reads_it(
    tmp_path: Path,
) -> None:
    locks = tmp_path / "locks"  # not there yet: made with the key
    a = run_settings("ct200", locks)
    key_file = locks / CONTROL_PLANE_KEY_NAME
    assert a.control_plane_key_file == str(key_file)
    found = key_file.stat()
    assert stat.S_IMODE(found.st_mode) == 0o600 and found.st_uid == os.getuid()
    key = key_file.read_text().strip()
    assert len(key) >= 32 and controller_problems("ct200", a) == []
    made = a.controller_files.control_plane_key
    assert made is not None and made.made and made.key == key
    b = run_settings("ct201", locks, server_host="10.0.0.2")
    again = run_settings("ct200", locks)
    for later in (b, again):
        read = later.controller_files.control_plane_key
        assert read is not None and read.key == key and not read.made
    assert key_file.read_text().strip() == key  # never made twice

    # The router over both hosts needs no hand-made key file.
    router = resolver.resolve_router(a, "ct200", [("ct200", a), ("ct201", b)])
    assert router.errors == [], router.errors
    # Both hosts write that one key; the plan shows its path, never its text.
    for name, s in (("ct200", a), ("ct201", b)):
        report = decide(name, s, gathered(Serving(), staging(None)), kb.load(), None)
        assert report.serve is not None and report.serve.control_plane_key is not None
        assert report.serve.control_plane_key.text == key + "\n"
        shown = report.to_json()["serve"]
        assert shown["control_plane_key_source"] == {"path": str(key_file), "made": s is a}
        assert key not in repr(shown)


def test_two_hosts_reading_different_key_files_are_refused(tmp_path: Path) -> None:
    a = run_settings("ct200", tmp_path / "a")
    b = run_settings("ct201", tmp_path / "b", server_host="10.0.0.2")
    router = resolver.resolve_router(a, "ct200", [("ct200", a), ("ct201", b)])
    assert len(router.errors) == 1, router.errors
    assert "ct201 reads" in router.errors[0] and "engine_lock_dir" in router.errors[0]


def test_the_key_is_made_with_mode_600_whatever_the_umask(tmp_path: Path) -> None:
    for umask in (0o000, 0o077, 0o277):
        path = tmp_path / f"key-{umask:o}"
        old = os.umask(umask)
        try:
            assert make_key(str(path)) is not None
        finally:
            os.umask(old)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(path.read_text().strip()) >= 32
    path.write_text("kept-key-of-an-earlier-run\n")
    assert make_key(str(path)) is None  # there already: kept as it is
    assert path.read_text() == "kept-key-of-an-earlier-run\n"


def test_a_key_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    s = run_settings("ct200", blocked / "locks")  # engine_lock_dir under a file
    found = controller_problems("ct200", s)
    assert len(found) == 1 and "it could not be made" in found[0], found
    assert "engine_lock_dir" in found[0] and "\n" not in found[0]


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_key_file_another_user_could_have_written_is_refused(tmp_path: Path, mode: int) -> None:
    locks = tmp_path / "locks"
    run_settings("ct200", locks)
    key_file = locks / CONTROL_PLANE_KEY_NAME
    os.chmod(key_file, mode)
    why = f"its mode {mode:03o} lets its group or anyone write it"
    for s in (
        run_settings("ct200", locks),
        run_settings(
            "ct200", tmp_path, router={"host": "ct200", "control_plane_key_file": str(key_file)}
        ),
    ):
        found = controller_problems("ct200", s)
        assert len(found) == 1 and why in found[0] and "\n" not in found[0], found
        assert "another user could have written it" in found[0]
        assert "chmod 600" in found[0]


def test_a_file_of_another_owner_is_foreign_and_ours_or_roots_is_not() -> None:
    """The owner's half of the rule, on the stat the read takes of the file it opened."""

    def found(uid: int, mode: int = 0o100600) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 44, 0, 0, 0))

    assert writable_by_others(found(os.getuid())) is None
    assert writable_by_others(found(0)) is None
    other = os.getuid() + 4242
    why = writable_by_others(found(other))
    assert why is not None and f"owned by uid {other}" in why
    assert writable_by_others(found(os.getuid(), 0o100640)) is None  # its group may read it
