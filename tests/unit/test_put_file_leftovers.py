"""put_file's write script, run by a real sh on real files (issue 31): a write killed before
its trap ran leaves its mktemp file, and the next write of that file removes it (ours only: a
root-owned plain file with the temp name, in the destination's directory); a stdin cut short
(the controller killed mid-send) still decodes, and is never renamed into place.

The script is the one put_file yields (`_write_script`), run as root like every deploy's write.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from operations.steps.host_files import _write_script, temp_pattern

# These tests run real processes (the lock holder, the write script): the integration layer.
pytestmark = pytest.mark.integration

OTHER_UID = 4242
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned leftovers need root")


def write(dest: Path, data: bytes, sent: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """The write of `data` to dest, as put_file yields it, fed `sent` (default: all of it)."""
    script = _write_script(str(dest), "root", "root", "640", len(data))
    stdin = base64.b64encode(data) if sent is None else sent
    return subprocess.run(
        ["sh", "-c", script], input=stdin.decode(), capture_output=True, text=True, check=False
    )


@as_root
def test_the_next_write_removes_a_killed_writes_temp_file_and_only_ours(tmp_path: Path) -> None:
    dest = tmp_path / "secrets.yaml"
    dest.write_text("old\n")
    # What a write killed between mktemp and mv leaves: its final mode, part of the content.
    killed = tmp_path / ".secrets.yaml.Ab3dEf9hIj"
    killed.write_text("api-key: sk-ha")
    killed.chmod(0o640)
    # Not ours: another user's file with our temp name, a link, another file's temp, a name
    # that is not mktemp's (9 characters), a copy in a subdirectory.
    foreign = tmp_path / ".secrets.yaml.ZZZZZZZZZZ"
    foreign.write_text("theirs")
    os.chown(foreign, OTHER_UID, OTHER_UID)
    link = tmp_path / ".secrets.yaml.LLLLLLLLLL"
    link.symlink_to(dest)
    other = tmp_path / ".units.yaml.Ab3dEf9hIj"
    other.write_text("x")
    short = tmp_path / ".secrets.yaml.Ab3dEf9hI"
    short.write_text("x")
    (tmp_path / "sub").mkdir()
    nested = tmp_path / "sub" / ".secrets.yaml.Ab3dEf9hIj"
    nested.write_text("x")

    done = write(dest, b"api-key: sk-new\n")
    assert done.returncode == 0, done.stderr
    assert dest.read_text() == "api-key: sk-new\n"
    assert dest.stat().st_mode & 0o777 == 0o640
    assert not killed.exists()
    for kept in (foreign, link, other, short, nested):
        assert kept.is_symlink() or kept.exists(), kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["secrets.yaml", "sub", foreign.name, link.name, other.name, short.name]
    )


@as_root
def test_a_stdin_cut_short_is_never_renamed_into_place(tmp_path: Path) -> None:
    dest = tmp_path / "sglang@0.service"
    dest.write_text("[Service]\nExecStart=/old\n")
    data = b"[Service]\nExecStart=/opt/sglang/envs/0.5.19/bin/python -m sglang\n"
    # Cut at a 4-character boundary: base64 -d decodes the part and exits 0.
    part = base64.b64encode(data)[:32]
    assert base64.b64decode(part)  # it decodes
    cut = write(dest, data, sent=part)
    assert cut.returncode != 0
    assert dest.read_text() == "[Service]\nExecStart=/old\n"
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]  # the trap removed its temp


def test_the_temp_pattern_is_mktemps_template_literal_elsewhere() -> None:
    assert temp_pattern("/etc/systemd/system/sglang@0.service") == ".sglang@0.service.??????????"
    assert temp_pattern("/x/a[1]*.conf") == ".a\\[1\\]\\*.conf.??????????"
