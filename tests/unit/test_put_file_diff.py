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

from operations.steps.host_files import put_file

DEST = "/etc/systemd/system/sglang@0.service"
OLD = "[Service]\nUser=sglang\nExecStart=/opt/sglang/envs/a/bin/python -m x --port 30000\n"
NEW = "[Service]\nUser=sglang\nExecStart=/opt/sglang/envs/b/bin/python -m x --port 30000\n"
HERE = {"type": "file", "mode": "644", "owner": "root", "group": "root", "sha256": "0" * 64}
DIR = {"type": "directory", "mode": "755", "owner": "root", "group": "root"}


def written(caplog: pytest.LogCaptureFixture, diff: bool, **kwargs: Any) -> str:
    state = FakeState()
    state.config.DIFF = diff
    facts = {
        "files.FileAt": {f"path={kwargs['dest']}": {"dir": DIR, "file": HERE}},
        "files.FileContents": {f"path={kwargs['dest']}": OLD.splitlines()},
    }
    host = create_host(state, facts=facts)
    with (
        caplog.at_level(logging.INFO, logger="pyinfra"),
        ctx_state.use(state),
        ctx_host.use(host),
    ):
        commands = list(put_file._inner(**kwargs))
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
    shown = written(caplog, True, src=NEW, dest=DEST, sha256_now=None)
    assert f"Will create {DEST}" in shown and "+ User=sglang" in shown
