"""The staging decision, made once per host before any change, shown by the plan and carried out
by the model step (operations/steps/model.py), which decides nothing again.

  manifest -> the ModelStaging fact compares the source with the staged copy: unchanged is a
              no-op that never reads the weights
  units    -> copies a rank unit names are kept (a rank not rolled yet still reads its own):
              the fact is asked with the copy's key and those copies' keys (--key, --keep),
              so its leftovers and up_to_date are already the stage run's
  pending  -> a source that changes in this run (rsync from the controller, a hub download)
              makes what the fact saw stale: stage beside after it
  capacity -> capacity.stage_room: beside the current copy, in place with the servers
              stopped (the plan says so: that is an outage), or refused with the numbers
              before a byte is copied
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from operations import layout
from operations.facts.host import Resources
from operations.facts.model import Staging
from operations.plan.capacity import gib, stage_room
from operations.plan.vocabulary import StageMode
from operations.settings import Settings


@dataclass(frozen=True)
class StagePlan:
    """What the stage operation does: "unchanged", "beside", "inplace" or "refuse"."""

    mode: StageMode
    why: str


def decide(
    settings: Settings, resources: Resources | None, staging: Staging | None, source_pending: bool
) -> StagePlan:
    """From the manifest comparison and the capacity rule to one line the plan prints.

    source_pending: the source changes during this run (rsync or a hub download), so what the
    fact saw is stale: stage beside (the script refuses with numbers if that does not fit).
    """
    if source_pending:
        return StagePlan("beside", "the source is fetched in this run; staged beside after it")
    if staging is None:
        return StagePlan("refuse", "python3 is missing on the target (the staging script needs it)")
    if staging.error or staging.source is None:
        return StagePlan("refuse", f"{staging.error or 'source unreadable'}; nothing was copied")
    source, staged = staging.source, staging.staged
    if staging.up_to_date and staged is not None:
        return StagePlan(
            "unchanged",
            f"staged copy matches the source (manifest {source.digest}, {source.files} files, "
            f"{gib(source.bytes)})",
        )
    if staged is not None and staged.digest == source.digest:
        if not staging.mismatched:
            n = len(staging.leftovers)
            return StagePlan("beside", f"{n} leftover(s) of an interrupted run to clean up")
        copy = source.bytes  # a damaged copy is replaced whole
        what = f"{len(staging.mismatched)} staged file(s) differ from their checksums"
    else:
        copy = staging.copy_bytes if staging.copy_bytes is not None else source.bytes
        what = f"{len(staging.changed_files)} file(s) new or changed"
    resources = resources or Resources()
    if staging.leftover_bytes and resources.stage_free_bytes is not None:
        # The stage run removes leftovers of a killed copy before it copies: their space is
        # free for it. Counting it as used would pick in place and stop every rank for nothing.
        free = resources.stage_free_bytes + staging.leftover_bytes
        resources = replace(resources, stage_free_bytes=free)
    room = stage_room(settings, resources, source.bytes, copy, staged.bytes if staged else 0)
    if room.mode is None:
        return StagePlan("refuse", room.why)
    return StagePlan(room.mode, f"{what}; {room.why}")


@dataclass(frozen=True)
class StageDecision:
    """Everything the model step needs, decided from the facts before any change."""

    plan: StagePlan
    # The ModelStaging fact, asked with `key` and the kept keys (None: python3 is missing).
    staging: Staging | None
    # Staged copies (paths) a rank unit names now: never removed by this run.
    kept: frozenset[str]
    # The source changes in this run (a sync from the controller, a hub download).
    source_pending: bool
    # The copy's key, as the rank units name it (None: its digest), and the keys of the other
    # copies a unit names: the stage run keeps them (--key, --keep).
    key: str | None = None
    keep_keys: list[str] = dataclasses.field(default_factory=list)

    @property
    def refused(self) -> bool:
        return self.plan.mode == "refuse"

    @property
    def what(self) -> str:
        """The plan's line: "beside" and "inplace" say what the servers see."""
        if self.plan.mode == "inplace":
            return "in place: every rank stops while the copy is replaced (an outage)"
        if self.plan.mode == "beside":
            if self.staging is None or self.staging.staged is None:
                return "a first copy"
            return "beside the current copy: ranks serve it until they roll onto the new one"
        return self.plan.mode


def keep_keys(settings: Settings, kept: set[str], key: str | None) -> list[str]:
    """The keys of the staged copies a rank unit names (`kept`, paths) but `key`'s: what the
    ModelStaging fact and the stage run are given as --keep."""
    keys = {k for p in kept if (k := layout.copy_key(settings, p)) is not None and k != key}
    return sorted(keys)


@dataclass(frozen=True)
class ControllerScan:
    """A controller source's directory as the staging script's scan reads it on the controller,
    once per run (runtime/gather.py): its manifest digest and bytes, or why the scan refuses it
    (a link the rule refuses, an unreadable file)."""

    digest: str | None = None
    bytes: int | None = None
    error: str | None = None


def decide_stage(
    settings: Settings,
    resources: Resources | None,
    key: str | None,
    staging: Staging | None,
    kept: set[str],
    controller: ControllerScan | None = None,
) -> StageDecision:
    """The one staging decision of a run, from facts already read: the ModelStaging fact
    (asked with `key` and keep_keys(kept)), the staged copies the host's rank units name
    (`kept`, paths) and, for a controller source, its scan there (`controller`). `key`: the
    copy's key the resolver gave the rank units."""
    source = settings.source
    cached = staging.source.digest if staging is not None and staging.source else None
    if source.kind == "controller":
        pending = key is None or cached != key
    elif source.kind == "hf":
        pending = (staging.hub_revision if staging is not None else None) != source.revision
    else:
        pending = False
    plan = decide(settings, resources, staging, pending)
    if source.kind == "controller" and source.controller_dir is not None and key is None:
        # The controller's scan (the link rule) refused its directory: nothing is sent.
        why = controller.error if controller is not None else None
        if why is not None:
            plan = StagePlan("refuse", f"{why} (on the controller); nothing was copied")
    return StageDecision(
        plan, staging, frozenset(kept), pending, key, keep_keys(settings, kept, key)
    )
