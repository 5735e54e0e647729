#!/usr/bin/env python3
"""Hold the host's deploy lock for as long as the deploy's SSH channel lives.

Run on the host by operations/runtime/deploy_lock.py (as root, under the host's sudo settings)
as one `python3 -c` argument, its stdin and stdout a channel of the deploy's own SSH
connection:

    deploy_lock_holder.py PATH WHO WAIT_S BEAT_S

Opens PATH (never following a link; it must be owned by this user, root) and takes an exclusive
flock on it. Prints, one line each: `busy HOLDER` when it has to wait, then `timeout HOLDER`
after WAIT_S (exit 3), or `released HOLDER` when the holder let go; `locked` once held (at once
when the lock was free), after writing WHO into the file for the next one to read; `foreign
...` when PATH is not root's (exit 2).

Holds the lock until its stdin closes or its stdout breaks. While it holds, it writes a byte
every BEAT_S: sshd sends it, so a connection whose controller vanished without closing it (power
cut, network lost, a laptop's lid) has data outstanding, and the host's TCP gives up on it
after tcp_retries2 (default 15: at least 924.6 s, Linux
Documentation/networking/ip-sysctl.rst); sshd then ends the session and the holder exits. An
idle connection would only be found by sshd's TCPKeepAlive, after tcp_keepalive_time (7200 s)
and its probes. A controller that is alive but busy (its prompt, a long plan) keeps the lock:
its kernel acknowledges the bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import time
from types import FrameType

# What `timeout` exits with, and `foreign`.
TIMEOUT_EXIT = 3
FOREIGN_EXIT = 2


def holder(fd: int) -> str:
    """Who holds (or last held) the lock, as its holder wrote it."""
    return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"


def take(fd: int, wait_s: float) -> None:
    """The exclusive flock on `fd`, waiting up to `wait_s` (then `timeout HOLDER`, exit 3)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        print("busy " + holder(fd), flush=True)

    def expired(signum: int, frame: FrameType | None) -> None:
        print("timeout " + holder(fd), flush=True)
        os._exit(TIMEOUT_EXIT)

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(max(1, int(wait_s)))
    fcntl.flock(fd, fcntl.LOCK_EX)
    signal.alarm(0)
    print("released " + holder(fd), flush=True)


def hold(beat_s: float) -> None:
    """Until stdin closes or stdout breaks; a byte written every `beat_s` meanwhile."""
    os.set_blocking(1, False)
    try:
        while True:
            if select.select([0], [], [], beat_s)[0]:
                with contextlib.suppress(BlockingIOError):
                    if not os.read(0, 65536):
                        return
            else:
                with contextlib.suppress(BlockingIOError):
                    os.write(1, b".")
    except OSError:
        return


def main(argv: list[str]) -> int:
    path, who, wait_s, beat_s = argv[0], argv[1], float(argv[2]), float(argv[3])
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if os.fstat(fd).st_uid != os.geteuid():
        print("foreign " + path + " is not owned by root", flush=True)
        return FOREIGN_EXIT
    take(fd, wait_s)
    os.ftruncate(fd, 0)
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    os.pwrite(fd, (who + ", host pid " + str(os.getpid()) + ", since " + since + "\n").encode(), 0)
    print("locked", flush=True)
    hold(beat_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
