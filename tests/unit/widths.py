"""What a deploy's output at a terminal's width may hold: our lines (the plan's panel, the host
lines, the summaries) fit it; pyinfra's own table of changes is pyinfra's to size."""

from __future__ import annotations

import re

# pyinfra's table of changes ("    Operation   Change ...", "    Engine | install   1 ...").
_PYINFRA_TABLE = re.compile(r"^\s+(Operation\s+Change\b|\S[^|]* \| )")


def ours_wider_than(width: int, lines: list[str]) -> list[str]:
    """The lines of a deploy's output that we print and that are wider than `width`."""
    return [ln for ln in lines if len(ln.rstrip()) > width and not _PYINFRA_TABLE.match(ln)]
