"""What every program here that talks to the ranks with the key shares: `Refused` (bad input
found before anything ran: one line, with its fix) and `guarded`, the main that masks every line
it prints and never prints a traceback.

Not run on its own: inlined into each program by operations/render/host_scripts.py.
"""

from __future__ import annotations

from collections.abc import Callable

from operations.programs.hostsafe import mask_journal


class Refused(Exception):
    """Bad input found before anything ran: one line, with its fix."""


Work = Callable[[list[str]], tuple[int, list[str]]]


def guarded(name: str, work: Work) -> int:
    """A program's main: work(secrets) gives (exit status, its lines), and puts the key in
    `secrets` once it is read; every line printed is masked with it. Refused: exit 2 and one
    line; anything else: exit 1 and one line, never a traceback."""
    secrets: list[str] = []

    def say(text: str) -> None:
        print(mask_journal(text, tuple(secrets)), flush=True)

    try:
        code, lines = work(secrets)
    except Refused as why:
        say(f"{name}: refused: {why}")
        return 2
    except Exception as error:  # what no line above names: one line, not a traceback
        say(f"{name}: failed: {type(error).__name__}: {error}")
        return 1
    for line in lines:
        say(line)
    return code
