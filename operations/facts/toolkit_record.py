"""The toolkit's record on a host (layout.TOOLKIT_RECORD): which version of this toolkit last
deployed it, and the date that version was first recorded there. The ServingState fact prints
the file on its "toolkit" line (facts/serve.py, one round trip with what serves), `parse_record`
reads it; the plan decides what this run does to it (operations/plan/toolkit_version.py) and
`status` shows it.

The file, as the deploy's last step writes it (`record_text`), is one JSON line:

    {"recorded": "2026-12-06", "version": "0.12.0"}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# A release's version as this toolkit numbers them (semantic versioning's MAJOR.MINOR.PATCH).
VERSION_PATTERN = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
DATE_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
# The most of the file the fact prints (a record is under 60 bytes).
MAX_BYTES = 1024


@dataclass(frozen=True)
class ToolkitRecord:
    """The record as found: `version` and `recorded` (YYYY-MM-DD; None: no date was known when
    it was written). `problem`: why the file's content is not a record (then both are None)."""

    version: str | None = None
    recorded: str | None = None
    problem: str | None = None

    def release(self) -> tuple[int, int, int] | None:
        """The version as numbers, to compare (None: no readable version)."""
        return release(self.version) if self.version is not None else None


def release(version: str) -> tuple[int, int, int] | None:
    if not VERSION_PATTERN.fullmatch(version):
        return None
    major, minor, patch = (int(part) for part in version.split("."))
    return major, minor, patch


def parse_record(text: str) -> ToolkitRecord | None:
    """The record from the file's text (the fact's line); None: no file (empty text)."""
    text = text.strip()
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return ToolkitRecord(problem=f"not JSON: {text[:60]!r}")
    if not isinstance(found, dict):
        return ToolkitRecord(problem=f"not a JSON object: {text[:60]!r}")
    version, recorded = found.get("version"), found.get("recorded")
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        return ToolkitRecord(problem=f"version {version!r} is not MAJOR.MINOR.PATCH")
    if recorded is not None and (
        not isinstance(recorded, str) or not DATE_PATTERN.fullmatch(recorded)
    ):
        return ToolkitRecord(problem=f"date {recorded!r} is not YYYY-MM-DD")
    return ToolkitRecord(version=version, recorded=recorded)


def record_text(version: str, recorded: str | None) -> str:
    """The file's content: one JSON line, its keys sorted, so the same record is the same bytes
    (a converged run finds the digest it would write)."""
    return json.dumps({"recorded": recorded, "version": version}, sort_keys=True) + "\n"
