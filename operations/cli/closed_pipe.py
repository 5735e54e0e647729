"""Every command that prints JSON or tables stays quiet when its reader goes away.

One rule for every command of the toolkit (plan, status, releases, lock, kb, the scripts): a
reader that goes away early (`... | head`) is not the command's failure. The command prints
nothing more, nothing on stderr either, finishes its work and exits with the status it would have
had with every line read: 0 when all was well, 1 when a host was refused or not asked, 2 for a
usage error. Whether the output fitted the pipe's buffer before the reader left no longer
decides the status (before, `plan | head` exited 0 and `plan --json | head` 141).

`quiet(main)` puts a guard in front of stdout: the first write or flush that meets the closed
pipe points the descriptor at /dev/null (the Python documentation's recipe, "Note on SIGPIPE":
https://docs.python.org/3/library/signal.html#note-on-sigpipe), and every later write goes there.
rich's Console writes through the same guard, so its own handler (exit 1) never runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO


class _Guard:
    """stdout, with a closed pipe turned into a quiet /dev/null."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_pipe = False

    def _gone(self) -> None:
        self.closed_pipe = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            self._stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def quiet(main: Callable[[], int | None]) -> int:
    """`main()`'s exit status, whether or not stdout's reader stayed to the end."""
    guard = _Guard(sys.stdout)
    sys.stdout = guard
    try:
        status = main()
        guard.flush()
    finally:
        sys.stdout = guard._stream
    return status or 0
