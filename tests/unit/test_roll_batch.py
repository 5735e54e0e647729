"""A roll batch as one host command (operations/programs/roll_batch.py, run as the host gets it):
its steps in order, a write step fed its own line of stdin through host_files' writer, the
first failing step stopping the rest, and each step's seconds on the last line; the polls'
backoff (programs/polling.py)."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from operations.programs.polling import backoff
from operations.render import host_scripts
from operations.steps.host_files import line_writer
from operations.steps.serve import restart_command

pytestmark = pytest.mark.integration  # runs the script and /bin/sh


def sh(text: str) -> list[str]:
    return ["/bin/sh", "-c", text]


def run_batch(
    tmp_path: Path, steps: list[list[object]], stdin: str = "", extra: tuple[str, ...] = ()
) -> tuple[int, str]:
    script = tmp_path / "roll_batch.py"
    script.write_text(host_scripts.script_text("roll_batch.py"))  # what the host runs
    proc = subprocess.run(
        [sys.executable, str(script), "--batch", "sglang@0.service", json.dumps(steps), *extra],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_steps_run_in_order_and_each_write_gets_its_own_content(tmp_path: Path) -> None:
    log = tmp_path / "log"
    first, second = tmp_path / "a.service", tmp_path / "b.service"
    owner = f"{os.getuid()}"
    write_a, content_a = line_writer("[Unit]\nA\n", str(first), owner=owner, group=owner)
    write_b, content_b = line_writer("[Unit]\nB\n", str(second), owner=owner, group=owner)
    steps: list[list[object]] = [
        ["drain", sh(f"echo drain >> {shlex.quote(str(log))}")],
        ["write", sh(write_a)],
        ["write", sh(write_b)],
        # Every step but a write reads nothing: the batch's stdin is the writes' alone.
        ["restart", sh(f"cat >> {shlex.quote(str(log))}; echo restart >> {shlex.quote(str(log))}")],
    ]
    rc, out = run_batch(tmp_path, steps, content_a + content_b)
    assert rc == 0, out
    assert log.read_text() == "drain\nrestart\n"
    assert first.read_text() == "[Unit]\nA\n" and second.read_text() == "[Unit]\nB\n"
    assert stat.S_IMODE(first.stat().st_mode) == 0o644
    assert list(tmp_path.glob(".*.service.*")) == []  # no temp file left
    last = out.strip().splitlines()[-1]
    assert last.startswith("roll batch sglang@0.service: drain ") and "restart " in last, out


def test_a_failed_step_stops_the_batch_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "log"
    steps: list[list[object]] = [
        ["drain", sh(f"echo drain >> {log}")],
        ["health", sh("echo 'sglang@0.service: no 200'; exit 3")],
        ["readmit", sh(f"echo readmit >> {log}")],
    ]
    rc, out = run_batch(tmp_path, steps)
    assert rc == 3, out
    assert log.read_text() == "drain\n"  # never put back: the batch stays out of the router
    assert "health failed (exit 3): the steps after it did not run" in out, out
    assert "sglang@0.service: no 200" in out
    assert "readmit" not in out.strip().splitlines()[-1], out


def test_a_write_without_its_content_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a.service"
    write, _ = line_writer("x\n", str(target))
    steps: list[list[object]] = [["write", sh(write)], ["restart", sh(f"touch {tmp_path}/r")]]
    rc, out = run_batch(tmp_path, steps)
    assert rc != 0, out
    assert not target.exists() and not (tmp_path / "r").exists(), out


SCRIPT = """\
import os, sys
print("argv", sys.argv[1:], "pid", os.getpid(), "loaded", "wave" in sys.modules, flush=True)
sys.exit(int(sys.argv[1]))
"""


def test_a_python3_script_runs_in_the_batchs_process_another_interpreter_waits(
    tmp_path: Path,
) -> None:
    """`python3 SCRIPT` runs in roll_batch's own process (no interpreter start); another
    interpreter starts with the batch, imports its preload, and runs when its step comes."""
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    log = tmp_path / "log"
    steps: list[list[object]] = [
        ["drain", ["python3", str(script), "0"]],
        ["restart", sh(f"echo restarted >> {log}")],
        ["smoke", [sys.executable, str(script), "0"], ["wave"]],
        ["readmit", ["python3", str(script), "4"]],
    ]
    rc, out = run_batch(tmp_path, steps)
    assert rc == 4, out
    lines = [line.split() for line in out.splitlines() if line.startswith("argv")]
    drain, smoke, readmit = lines
    assert drain[-3] == readmit[-3] != smoke[-3], out  # same pid, the batch's; smoke its own
    assert smoke[-1] == "True" and drain[-1] == "False", out  # its preload, imported first
    assert "readmit failed (exit 4)" in out and log.read_text() == "restarted\n", out


def test_an_interpreter_whose_step_never_comes_is_ended(tmp_path: Path) -> None:
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    steps: list[list[object]] = [
        ["health", sh("exit 1")],
        ["smoke", [sys.executable, str(script), "0"], []],
    ]
    rc, out = run_batch(tmp_path, steps)
    assert rc == 1 and "argv" not in out, out  # it never ran, and the batch did not wait on it


def test_polls_start_short_and_grow_to_their_bound() -> None:
    sleeps = backoff(0.02, 1.25, 0.5)
    first = [next(sleeps) for _ in range(40)]
    assert first[0] == 0.02 and first[1] == pytest.approx(0.025)
    assert all(a <= b for a, b in itertools.pairwise(first))
    assert max(first) == 0.5 and first[-1] == 0.5


def fake_systemctl(tmp_path: Path, fails: str = "") -> tuple[dict[str, str], Path]:
    """PATH with a systemctl that logs each call and fails (exit 1) the calls `fails` names
    (a shell pattern matched against "$*")."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    tool = bin_dir / "systemctl"
    tool.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in {fails or "-"}) exit 1 ;; esac\nexit 0\n'
    )
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


@pytest.mark.parametrize(
    ("fails", "code", "calls"),
    [
        # The stop is queued, systemd reloads while the old process shuts down, the second
        # stop waits for it, the unit starts.
        (
            "",
            0,
            [
                "stop --no-block sglang@0.service",
                "daemon-reload",
                "stop sglang@0.service",
                "start sglang@0.service",
            ],
        ),
        # A stop systemd refuses: nothing more, the old process serves on; the step fails.
        ('"stop --no-block "*', 1, ["stop --no-block sglang@0.service"]),
        # A failed reload: the unit still starts (on what systemd had loaded); the step fails.
        (
            "daemon-reload",
            1,
            [
                "stop --no-block sglang@0.service",
                "daemon-reload",
                "stop sglang@0.service",
                "start sglang@0.service",
            ],
        ),
        # A start refused at the start limit is tried again after reset-failed.
        (
            '"start "*',
            0,
            [
                "stop --no-block sglang@0.service",
                "daemon-reload",
                "stop sglang@0.service",
                "start sglang@0.service",
                "reset-failed sglang@0.service",
                "start sglang@0.service",
            ],
        ),
    ],
)
def test_a_batchs_restart_reloads_systemd_while_it_stops(
    tmp_path: Path, fails: str, code: int, calls: list[str]
) -> None:
    env, log = fake_systemctl(tmp_path, fails)
    proc = subprocess.run(
        ["/bin/sh", "-c", restart_command("sglang@0.service")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == code, proc
    assert log.read_text().splitlines() == calls
    if fails == "daemon-reload":
        assert "systemctl daemon-reload failed (exit 1)" in proc.stdout, proc


def test_a_waiting_interpreter_runs_its_script_as_python_would(tmp_path: Path) -> None:
    """Its own module's flags do not leak into the script (an annotation is evaluated, as in
    `python SCRIPT`), and the script's directory is first on its path."""
    script = tmp_path / "step.py"
    script.write_text(
        "import sys\nprint('path0', sys.path[0], flush=True)\n"
        "def late(x: NotDefinedAnywhere) -> None:\n    pass\n"
    )
    steps: list[list[object]] = [["smoke", [sys.executable, str(script)], []]]
    rc, out = run_batch(tmp_path, steps)
    assert rc == 1, out
    assert f"path0 {tmp_path}" in out, out
    assert "NameError: name 'NotDefinedAnywhere' is not defined" in out, out


def test_a_canary_batch_that_fails_from_its_write_on_runs_its_undo_and_still_fails(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    at = shlex.quote(str(log))
    undo = json.dumps(
        [["restore", sh(f"echo restore >> {at}")], ["restart", sh(f"echo again >> {at}")]]
    )
    steps: list[list[object]] = [
        ["drain", sh(f"echo drain >> {at}")],
        ["backup", sh(f"echo backup >> {at}")],
        ["restart", sh(f"echo restart >> {at}")],
        ["health", sh("exit 3")],
        ["readmit", sh(f"echo readmit >> {at}")],
    ]
    rc, out = run_batch(tmp_path, steps, extra=("--undo", undo, "--undo-from", "restart"))
    assert rc == 3, out
    assert log.read_text() == "drain\nbackup\nrestart\nrestore\nagain\n"
    assert "the canary failed at health; rolled back onto its saved unit file(s)" in out
    # A failure before the undo's first step (the backup): nothing was changed, nothing undone.
    log.unlink()
    steps[1] = ["backup", sh("exit 4")]
    rc, out = run_batch(tmp_path, steps, extra=("--undo", undo, "--undo-from", "restart"))
    assert rc == 4 and log.read_text() == "drain\n", out
    assert "rolled back" not in out
    # The undo failing too is said, and the batch's own status is kept.
    steps[1] = ["backup", sh(f"echo backup >> {at}")]
    bad = json.dumps([["restore", sh("exit 5")]])
    rc, out = run_batch(tmp_path, steps, extra=("--undo", bad, "--undo-from", "restart"))
    assert rc == 3 and "its rollback FAILED too (exit 5)" in out, out
