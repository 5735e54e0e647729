"""What the target holds of the model: the source's manifest against the staged copy's.

Both are read by the staging script itself (operations/programs/stage_model.py `plan`), sent inline
so the fact works before the deploy has installed anything. It is asked with the copy's key and
the kept keys the stage run gets, and the same code decides "unchanged" and the leftovers here
and in the copy, so the plan and the run never disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations.facts.host import Model, parse_model
from operations.render import host_scripts

SCRIPT = "stage_model.py"


def script_text() -> str:
    """The staging script as the host gets it (operations/render/host_scripts.py): inline here, and
    the file the model step installs."""
    return host_scripts.script_text(SCRIPT)


@cache
def script_module() -> ModuleType:
    """The staging script, imported on the controller (controller sources are scanned here)."""
    return host_scripts.load(SCRIPT, "stage_model")


@dataclass(frozen=True)
class Copy:
    digest: str
    bytes: int
    files: int


@dataclass(frozen=True)
class Staging:
    """The source (a directory on the target) against the copy under STAGE_DIR/models/SLUG."""

    source: Copy | None = None
    staged: Copy | None = None
    # Why the source cannot be read (missing, unreadable); None when it was scanned.
    error: str | None = None
    # Interrupted copies and superseded versions the next stage run removes.
    leftovers: list[str] = field(default_factory=list)
    # What removing the leftovers frees in the tmpfs (their blocks no current copy shares).
    leftover_bytes: int = 0
    # The revision our hub download marker records (hf:// sources), else None.
    hub_revision: str | None = None
    # The commit the hub resolved that revision to (its download metadata), else None.
    hub_commit: str | None = None
    # Bytes a stage run would copy: files the current copy does not already hold.
    copy_bytes: int | None = None
    changed_files: list[str] = field(default_factory=list)
    # model_verify full: staged files whose sha256 differs from the source's.
    mismatched: list[str] = field(default_factory=list)
    up_to_date: bool = False
    # The copy the model link points at (STAGE_DIR/models/.SLUG@KEY), None when none.
    current: str | None = None


def _copy(data: Any) -> Copy | None:
    if not isinstance(data, dict):
        return None
    return Copy(digest=str(data["digest"]), bytes=int(data["bytes"]), files=int(data["files"]))


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return [str(v) for v in value]


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a number of bytes, got {value!r}")
    return value


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def parse_staging(lines: list[str]) -> Staging:
    """The script's JSON answer; anything else (a crash, a shape we do not know) becomes an
    `error` the plan prints and refuses on, never a traceback."""
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = lines[-1] if lines else "no output"
        return Staging(error=f"the staging script did not answer: {tail}")
    try:
        return Staging(
            source=_copy(data.get("source")),
            staged=_copy(data.get("staged")),
            error=_optional_str(data.get("error")),
            leftovers=_strings(data.get("leftovers")),
            leftover_bytes=_optional_int(data.get("leftover_bytes")) or 0,
            hub_revision=_optional_str(data.get("hub_revision")),
            hub_commit=_optional_str(data.get("hub_commit")),
            copy_bytes=_optional_int(data.get("copy_bytes")),
            changed_files=_strings(data.get("changed_files")),
            mismatched=_strings(data.get("mismatched")),
            up_to_date=bool(data.get("up_to_date")),
            current=data["current"] if isinstance(data.get("current"), str) else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        return Staging(error=f"the staging script's answer is malformed ({what}): {lines[-1]}")


class ModelStaging(FactBase[Staging]):
    """
    Returns the source's manifest summary against the staged copy's, in one round trip.

    .. code:: python

        Staging(
            source=Copy(digest="52cd26977905ef55", bytes=53800000000, files=19),
            staged=Copy(digest="52cd26977905ef55", bytes=53800000000, files=19),
            error=None, leftovers=[], hub_revision=None, copy_bytes=0,
            changed_files=[], mismatched=[], up_to_date=True,
        )

    + source: the model directory on the target
    + stage_dir: the tmpfs (models go under STAGE_DIR/models)
    + slug: the staged directory's name
    + verify: "manifest" (stat only) or "full" (re-hash the staged copy)
    + key: the copy's key the rank units will name (None: the source's digest, the script's
      default)
    + keep: keys of the copies a rank unit names now

    The stage run gets the same key and keep: the script's leftovers and up_to_date are what
    that run removes and whether it changes nothing (one rule in the script, `survey`).
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(
        self,
        source: str,
        stage_dir: str,
        slug: str,
        verify: str = "manifest",
        key: str | None = None,
        keep: list[str] | None = None,
    ) -> StringCommand:
        words: list[str | QuoteString] = ["python3", "-c", QuoteString(script_text()), "plan"]
        words += [QuoteString(source), QuoteString(stage_dir), QuoteString(slug)]
        words += ["--verify", QuoteString(verify)]
        if key is not None:
            words += ["--key", QuoteString(key)]
        for kept in keep or ():
            words += ["--keep", QuoteString(kept)]
        return StringCommand(*words)

    def process(self, output: list[str]) -> Staging:
        return parse_staging(output)


def local_model(path: str) -> Model:
    """ModelSource's answer for a directory on the controller: the same code (the staging
    script's describe: its scan and its link rule) and the same parser, run here."""
    return parse_model(script_module().describe(path))
