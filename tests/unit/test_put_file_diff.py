"""`--diff` shows what put_file changes in a unit or a config, line by line, as pyinfra's
files.put does; a secret is named, never shown. Driven like tests/operations (pyinfra_testing's
fake host with facts), with pyinfra's DIFF config on."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from operations.plan.planned_files import PlannedFile
from operations.steps.host_files import put_file, write_planned

DEST = "/etc/systemd/system/sglang@0.service"
OLD = "[Service]\nUser=sglang\nExecStart=/opt/sglang/envs/a/bin/python -m x --port 30000\n"
NEW = "[Service]\nUser=sglang\nExecStart=/opt/sglang/envs/b/bin/python -m x --port 30000\n"
HERE = {"type": "file", "mode": "644", "owner": "root", "group": "root", "sha256": "0" * 64}
DIR = {"type": "directory", "mode": "755", "owner": "root", "group": "root"}


def written(caplog: pytest.LogCaptureFixture, diff: bool, op: Any = put_file, **kwargs: Any) -> str:
    state = FakeState()
    state.config.DIFF = diff
    dest = kwargs["file"].path if "file" in kwargs else kwargs.get("dest", DEST)
    facts = {
        "files.FileAt": {f"path={dest}": {"dir": DIR, "file": HERE}},
        "files.FileContents": {f"path={dest}": OLD.splitlines()},
    }
    host = create_host(state, facts=facts)
    with (
        caplog.at_level(logging.INFO, logger="pyinfra"),
        ctx_state.use(state),
        ctx_host.use(host),
    ):
        commands = list(op._inner(**kwargs))
    assert commands, "the file differs: it must be written"
    return re.sub(r"\x1b\[[0-9;]*m", "", caplog.text)


def test_a_changed_unit_shows_its_changed_lines(caplog: pytest.LogCaptureFixture) -> None:
    shown = written(caplog, True, src=NEW, dest=DEST)
    assert f"Will modify {DEST}" in shown
    assert "- ExecStart=/opt/sglang/envs/a/bin/python" in shown
    assert "+ ExecStart=/opt/sglang/envs/b/bin/python" in shown
    assert "User=sglang" in shown  # context


def test_without_diff_nothing_is_shown(caplog: pytest.LogCaptureFixture) -> None:
    assert "ExecStart" not in written(caplog, False, src=NEW, dest=DEST)


def test_a_secret_is_named_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    shown = written(
        caplog, True, src='api-key: "sk-secret-1"\n', dest="/etc/sglang/secrets.yaml", secret=True
    )
    assert "Will modify /etc/sglang/secrets.yaml (a secret: its content is not shown)" in shown
    assert "sk-secret" not in shown and "ExecStart" not in shown


def test_a_new_file_from_a_bulk_fact_is_shown_whole(caplog: pytest.LogCaptureFixture) -> None:
    new = PlannedFile(DEST, NEW, read=True, sha256_now=None)
    shown = written(caplog, True, write_planned, file=new)
    assert f"Will create {DEST}" in shown and "+ User=sglang" in shown


def test_a_planned_change_shows_its_changed_lines(caplog: pytest.LogCaptureFixture) -> None:
    changed = PlannedFile(DEST, NEW, read=True, sha256_now="0" * 64)
    shown = written(caplog, True, write_planned, file=changed)
    assert f"Will modify {DEST}" in shown and "+ ExecStart=/opt/sglang/envs/b" in shown


def test_a_roll_batch_shows_the_units_it_writes(caplog: pytest.LogCaptureFixture) -> None:
    """A batch writes its units among its other host steps (line_writer); its operation shows
    each change as put_file does."""
    from operations.steps.serve import roll_batch

    changed = PlannedFile(DEST, NEW, read=True, sha256_now="0" * 64)
    kwargs = {"batch": "sglang@0", "steps": [], "writes": [], "written": [changed]}
    shown = written(caplog, True, roll_batch, **kwargs)
    assert f"Will modify {DEST}" in shown and "- ExecStart=/opt/sglang/envs/a" in shown
