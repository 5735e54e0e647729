"""Wrapping at the terminal's width, at spaces only: the plan's report, `releases` and the
deploy's own lines (runtime/host_lines.py) wrap with it. The standard library only: the deploy
lock's module imports it before anything heavy (tests/unit/test_lock_first.py)."""

from __future__ import annotations

import textwrap


def unbroken(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    """One paragraph at the terminal's width, wrapped at spaces only: a URL or a path is never
    broken (a longer one runs on, and the terminal wraps it). `first`: the first line's lead."""
    return textwrap.wrap(
        text,
        width=max(width, 40),
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
