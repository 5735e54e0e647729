"""Our lines about a host in the deploy's log, at the terminal's width.

pyinfra prints a host's line as `    [host] text`: its log formatter indents the first line of each
message by 4 spaces (pyinfra_cli/log.py, LogFormatter.format) and `host.print_prefix` names the
host. A line of ours is wrapped at spaces only (operations/cli/wrapping.unbroken: a URL or a path is
never broken), its later lines indented under the text, so nothing we print is wider than the
terminal (80 columns included).
"""

from __future__ import annotations

import re
import shutil

from pyinfra.api.host import Host

from operations.cli.wrapping import unbroken

# pyinfra_cli/log.py, LogFormatter.format: `message = f"    {message}"` (the first line only).
LOG_INDENT = "    "
# The prefix's styles (pyinfra's format_text, click.style): terminal escapes, no width.
_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def host_text(host: Host, text: str, width: int | None = None) -> str:
    """`text` as one log message for `host`, wrapped at `width` (the terminal's when None). Each
    line of `text` is a paragraph; its leading spaces are kept as its own indent."""
    width = width or shutil.get_terminal_size((80, 24)).columns
    prefix = host.print_prefix
    under = LOG_INDENT + " " * len(_STYLE.sub("", prefix))
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        body = paragraph.lstrip(" ")
        indent = under + paragraph[: len(paragraph) - len(body)]
        lines += unbroken(body, width, indent) or [indent]
    # The formatter adds LOG_INDENT before the first line, which starts with the host's prefix.
    lines[0] = prefix + lines[0][len(under) :]
    return "\n".join(lines)


def host_block(host: Host, title: str, block: list[str]) -> str:
    """A title line for `host` and, under it, `block` as it is (a table): each line after the
    log's indent only, not after the host's prefix and not wrapped, so a table laid out for
    80 - len(LOG_INDENT) columns reads as a table at 80 columns and wider. One message: hosts
    deployed at once never interleave its lines."""
    return "\n".join([host.print_prefix + title, *(LOG_INDENT + line for line in block)])
