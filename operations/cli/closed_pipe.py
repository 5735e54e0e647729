"""Every command that prints JSON or tables stays quiet when its reader goes away.

`python -m operations.plan INVENTORY --json | head` closes the pipe after ten lines: the next
write raises BrokenPipeError, and Python's own flush at exit would print a second traceback.
`quiet(main)` runs a command's main, flushes its output while it can still be caught, and on a
closed pipe points stdout at /dev/null (the Python documentation's recipe, "Note on SIGPIPE":
https://docs.python.org/3/library/signal.html#note-on-sigpipe) and exits 141, as a command
killed by SIGPIPE does (128 + 13), with nothing printed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

CLOSED_PIPE_STATUS = 128 + 13


def quiet(main: Callable[[], int | None]) -> int:
    """`main()`'s exit status; CLOSED_PIPE_STATUS, silently, when stdout's reader is gone."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return CLOSED_PIPE_STATUS
    return status or 0
