"""What every program here that talks to the ranks with the key shares: `Refused` (bad input
found before anything ran: one line, with its fix), the reading of UNIT=URL pairs on a command
line (`unit_urls`), and `guarded`, the main that masks every line it prints and never prints a
traceback.

Not run on its own: inlined into each program by operations/render/host_scripts.py.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from operations.programs.hostsafe import mask_journal


class Refused(Exception):
    """Bad input found before anything ran: one line, with its fix."""


def checked_url(value: str, flag: str) -> str:
    parts = urllib.parse.urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise Refused(f"{flag} {value!r} is not an http(s) URL with a host and a port")
    return value.rstrip("/")


def unit_urls(values: list[str], flag: str, plan: str) -> dict[str, str]:
    """A command line's UNIT=URL pairs, each URL checked; a unit named twice is refused. `plan`:
    who writes the flag (the refusal names it)."""
    found: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise Refused(f"{flag} {value!r} is not UNIT=URL ({plan})")
        if name in found:
            raise Refused(f"{flag} names {name} twice ({plan})")
        found[name] = checked_url(url, flag)
    return found


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
