"""The deploy lock of a run that is gone never blocks the next run (issue 31, point 2): the
holder (operations/programs/deploy_lock_holder.py, bundled as the host gets it and run here by
a real python3 on a lock file of the test's own) lets go when its SSH session goes, in either
way sshd ends one:

- its stdin closes: the controller was killed (its connection closed) or the host's sshd
  session was killed;
- its stdout breaks while its stdin stays open: the controller vanished without closing the
  connection (a power cut, a lost network), so nothing ever arrives on stdin; the host's TCP
  gives up on the bytes the holder writes (tcp_retries2) and sshd, ending the session,
  closes the holder's stdout. Before the holder wrote anything, such a lock was held until
  sshd's TCPKeepAlive found the connection dead (over two hours): this case then fails.

The waiting run is told who let go (`Request.answer`'s message), and a controller that is
alive but quiet (pyinfra's confirmation prompt) keeps its lock. The sshd side of it (a session
killed on the host) is played on real sshd by tests/e2e/test_crash.py.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from operations.render.host_scripts import script_text
from operations.runtime import deploy_lock
from operations.runtime.deploy_lock import HOLDER, Request

# These tests run real processes (the lock holder, the write script): the integration layer.
pytestmark = pytest.mark.integration

BEAT_S = 0.05  # the holder's heartbeat here (BEAT_S on a host): the test need not wait 15 s


class Holder:
    """One holder process, as a deploy starts it on the host, its stdin and stdout the SSH
    channel's (here: pipes the test holds)."""

    def __init__(self, lock: Path, who: str, wait_s: int) -> None:
        self.who = who
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script_text(HOLDER), str(lock), who, str(wait_s), str(BEAT_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def line(self, timeout: float = 30) -> str:
        """Its next line (before it holds the lock, it writes only lines)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        got = b""
        while not got.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"{self.who}: no line in {timeout}s (so far {got!r})"
            byte = os.read(fd, 1)
            assert byte, f"{self.who} ended (so far {got!r})"
            got += byte
        return got.decode().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.stop()


def first_and_waiting(tmp_path: Path, made: list[Holder], wait_s: int) -> tuple[Holder, Holder]:
    lock = tmp_path / "deploy.lock"
    first = Holder(lock, "deploy by first@laptop (pyinfra pid 1)", 60)
    made.append(first)
    assert first.line() == "locked"
    second = Holder(lock, "deploy by second@desk (pyinfra pid 2)", wait_s)
    made.append(second)
    busy = second.line()
    assert busy.startswith("busy deploy by first@laptop (pyinfra pid 1), host pid "), busy
    return first, second


def test_a_holder_whose_session_closed_lets_the_waiting_run_in(
    tmp_path: Path, holders: list[Holder]
) -> None:
    first, second = first_and_waiting(tmp_path, holders, 60)
    assert first.proc.stdin is not None
    first.proc.stdin.close()  # sshd closes it: the controller killed, or the session
    assert first.proc.wait(timeout=30) == 0
    released = second.line()
    assert released.startswith("released deploy by first@laptop"), released
    assert second.line() == "locked"


def test_a_holder_whose_controller_vanished_without_closing_lets_the_waiting_run_in(
    tmp_path: Path, holders: list[Holder]
) -> None:
    # Bounded: before the heartbeat this waited for ever, and the waiting run timed out.
    first, second = first_and_waiting(tmp_path, holders, 20)
    assert first.proc.stdout is not None
    first.proc.stdout.close()  # sshd, its connection timed out, is gone; stdin stays open
    assert first.proc.wait(timeout=30) == 0
    released = second.line()
    assert released.startswith("released deploy by first@laptop"), released
    assert second.line() == "locked"


def test_a_controller_alive_but_quiet_keeps_its_lock(tmp_path: Path, holders: list[Holder]) -> None:
    # The first run's controller sends nothing and reads nothing (its prompt waits for a
    # user): its holder keeps writing, the pipe takes it, the lock stays held.
    first, second = first_and_waiting(tmp_path, holders, 1)
    timeout = second.line()
    assert timeout.startswith("timeout deploy by first@laptop"), timeout
    assert second.proc.wait(timeout=30) == 3
    assert first.proc.poll() is None


def test_the_waiting_run_names_the_run_that_let_go(
    tmp_path: Path, holders: list[Holder], caplog: pytest.LogCaptureFixture
) -> None:
    first, waiting = first_and_waiting(tmp_path, holders, 60)
    busy = f"busy {first.who}, host pid {first.proc.pid}"
    # The deploy's side of it: Request.answer reads the holder's lines, as over SSH (the
    # first, read above to know it waits, handed back).
    handlers: list[object] = []
    state = SimpleNamespace(callback_handlers=handlers, add_callback_handler=handlers.append)
    host = SimpleNamespace(name="ct200", print_prefix="[ct200] ")
    request = Request.__new__(Request)
    request.state, request.host, request.wait_s = state, host, 60  # type: ignore[assignment]
    request.began = time.monotonic()
    assert waiting.proc.stdout is not None
    rest = io.TextIOWrapper(waiting.proc.stdout)
    request.started = (waiting.proc, itertools.chain([busy + "\n"], rest))
    assert first.proc.stdin is not None
    first.proc.stdin.close()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert request.answer() is None
    said = " ".join(caplog.text.split())  # wrapped at the terminal's width
    assert "another deploy holds this host (deploy by first@laptop" in said, said
    assert "released by deploy by first@laptop (pyinfra pid 1), host pid" in said, said
    assert "(that run ended, or its connection to the host did)" in said, said
    assert deploy_lock._held.pop((id(state), host.name)) is waiting.proc
