"""Which toolkit version last deployed the host, and what this run says and records of it.

The host's record (layout.TOOLKIT_RECORD, read by the ServingState fact: facts/toolkit_record.py)
names the version and the date it was first recorded. This run's version is operations/
version.py's. The plan says, in its "toolkit" decision, an upgrade from an older version or a
downgrade from a newer one with this version's CHANGELOG.md entry (its anchor), or that no
version was recorded; the deploy's last step (operations/steps/record.py) writes the record
once every step before it succeeded.

The date is the controller's, gathered with the facts (runtime/gather.py: `Gathered.today`), and
it is kept while the version is unchanged: the content is then the bytes the host holds, so a
converged re-run writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from operations import layout
from operations.facts.toolkit_record import ToolkitRecord, record_text, release
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.vocabulary import Decision, VersionJson
from operations.settings import Settings
from operations.version import CHANGELOG, RELEASED, VERSION

Change = Literal["none recorded", "unreadable", "same", "upgrade", "downgrade"]
NAME = "Record | toolkit version"
NONE_RECORDED = "no toolkit version recorded (deployed before 0.12.0, or never)"


def changelog_anchor(version: str = VERSION, released: str = RELEASED) -> str:
    """CHANGELOG.md's link to `version`'s entry: its heading "## [0.12.0] - 2026-12-06" as
    GitHub makes an anchor of a heading (lower case, punctuation but '-' dropped, each space a
    '-'): CHANGELOG.md#0120---2026-12-06."""
    heading = f"[{version}] - {released}".lower()
    kept = "".join(c for c in heading if c.isalnum() or c in " -")
    return f"{CHANGELOG}#{kept.replace(' ', '-')}"


@dataclass(frozen=True)
class VersionPlan:
    """What the host's record says (`found`, None: no record), what this run is to it, the
    sentence the plan shows, and the record's file (written by the deploy's last step)."""

    found: ToolkitRecord | None
    change: Change
    said: str
    file: PlannedFile
    version: str = VERSION

    def decision(self) -> Decision:
        why = (
            f"the deploy's last step writes {self.version} to {self.file.path} once every step "
            "before it succeeded (with the date it was first recorded, kept while the version "
            "is unchanged); `status` shows it"
        )
        return Decision("toolkit", self.said, why)

    def to_json(self) -> VersionJson:
        return {
            "version": self.version,
            "recorded_version": self.found.version if self.found is not None else None,
            "recorded_date": self.found.recorded if self.found is not None else None,
            "change": self.change,
            "changelog": changelog_anchor(self.version),
            "said": self.said,
            "changes": self.file.changes,
        }


def said(found: ToolkitRecord | None, version: str = VERSION) -> tuple[Change, str]:
    """What this run is to the host's record, and the plan's sentence for it."""
    entry = changelog_anchor(version)
    if found is None:
        # A host an earlier version serves reads as a new one: the changelog says what this
        # version does to it.
        return "none recorded", f"{NONE_RECORDED}: see {entry}"
    was = found.release()
    if found.version is None or was is None:
        return "unreadable", (
            f"the toolkit record {layout.TOOLKIT_RECORD} is unreadable ({found.problem}): this "
            f"run records {version}"
        )
    dated = f"{found.version} (recorded {found.recorded or 'with no date'})"
    now = release(version)
    if now is None or was == now:
        return "same", f"{version} (recorded {found.recorded or 'with no date'}), unchanged"
    if was < now:
        return "upgrade", f"upgrade from {dated} to {version}: see {entry}"
    return "downgrade", (
        f"downgrade from {dated} to {version}: {found.version}'s CHANGELOG.md entry says what "
        f"this undoes; see {entry}"
    )


def decide(
    settings: Settings,
    found: ToolkitRecord | None,
    digests: dict[str, str],
    today: str | None,
    version: str = VERSION,
) -> VersionPlan:
    """The record this run writes: `version` and the date it was first recorded (the host's,
    while its record names this version; else `today`, the controller's date gathered with the
    facts). `digests`: the ServingState fact's sha256s by path (the record's among them)."""
    change, sentence = said(found, version)
    date = found.recorded if change == "same" and found is not None else (today or None)
    entry = layout.managed_file(settings, layout.TOOLKIT_RECORD)
    file = planned(NAME, entry, record_text(version, date), digests)
    return VersionPlan(found, change, sentence, file, version)
