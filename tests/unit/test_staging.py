"""The one staging decision (operations/plan/staging.py), from facts alone: the ModelStaging fact,
the copies the rank units name and the host's room in, every outcome the plan shows out.

decide_stage takes the fact as the script answered it, asked with the copy's key and the kept
copies' keys (its leftovers and up_to_date are the stage run's: that rule is the script's,
tests/unit/test_staging_rule.py), and adds whether the source changes in this run and decide
(the capacity rule)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from operations.facts.host import Resources
from operations.facts.model import Copy, Staging
from operations.plan.staging import decide_stage
from tests.unit.builders import make_settings

GIB = 2**30
MODELS = "/dev/shm/models"
SRC = Copy(digest="d-new", bytes=50 * GIB, files=19)
OLD = Copy(digest="d-old", bytes=50 * GIB, files=19)
ROOMY = Resources(
    stage_total_bytes=200 * GIB, stage_free_bytes=150 * GIB, mem_total_bytes=500 * GIB
)
TIGHT = Resources(stage_total_bytes=110 * GIB, stage_free_bytes=30 * GIB, mem_total_bytes=500 * GIB)
FULL = Resources(stage_total_bytes=40 * GIB, stage_free_bytes=20 * GIB, mem_total_bytes=500 * GIB)
HUB = "hf://Qwen/Qwen3.6-27B@6a9e0b1"
CONTROLLER = "controller:/srv/models/Q/"


def copy_of(key: str) -> str:
    return f"{MODELS}/.Qwen--Qwen3.6-27B@{key}"


def fact(**values: Any) -> Staging:
    """The fact on a host whose copy .SLUG@k1 (the link's) is the source's, unless told, as
    the script answers it asked with the case's key and kept keys."""
    base: dict[str, Any] = {"source": SRC, "staged": SRC, "copy_bytes": 0, "current": copy_of("k1")}
    up_to_date = values.pop("up_to_date", True)
    return Staging(**{**base, "up_to_date": up_to_date, **values})


def changed(**values: Any) -> Staging:
    """A new revision of the source beside the staged old one: every file to copy."""
    base = {"staged": OLD, "copy_bytes": 50 * GIB, "changed_files": ["a", "b"], "up_to_date": False}
    return fact(**{**base, **values})


@dataclass(frozen=True)
class Case:
    name: str
    fact: Staging | None
    # What the plan shows: the mode, its why, the line "what", the source changes in this run.
    mode: str
    why: str
    what: str
    pending: bool = False
    key: str | None = "k1"
    kept: set[str] = field(default_factory=set)
    resources: Resources = ROOMY
    source: str = "/mnt/models/Qwen3.6-27B"
    # The keys the fact was asked with as --keep, and the stage run is given.
    keep_keys: list[str] = field(default_factory=list)


FRESH = "staged copy matches the source (manifest d-new, 19 files, 50.0 GiB)"
CASES = [
    Case("the copy the units name is the source's", fact(), "unchanged", FRESH, "unchanged"),
    Case("a copy a rank unit names is kept, no leftover", fact(), "unchanged", FRESH,
         "unchanged", kept={copy_of("k0")}, keep_keys=["k0"]),
    Case("a copy no unit names is removed beside",
         fact(leftovers=[copy_of("k0")], up_to_date=False), "beside",
         "1 leftover(s) of an interrupted run to clean up",
         "beside the current copy: ranks serve it until they roll onto the new one"),
    Case("the source's copy under another key is not the units' copy",
         fact(up_to_date=False), "beside", "0 leftover(s) of an interrupted run to clean up",
         "beside the current copy: ranks serve it until they roll onto the new one", key="k2",
         kept={copy_of("k1")}, keep_keys=["k1"]),
    Case("the first copy", fact(staged=None, current=None, copy_bytes=50 * GIB, up_to_date=False,
         changed_files=["a"]), "beside", "1 file(s) new or changed; 50.0 GiB to copy, "
         "150.0 GiB free", "a first copy"),
    Case("a new revision beside the old one", changed(), "beside",
         "2 file(s) new or changed; 50.0 GiB to copy, 150.0 GiB free",
         "beside the current copy: ranks serve it until they roll onto the new one"),
    Case("a new revision in place: an outage", changed(), "inplace",
         "2 file(s) new or changed; 51.0 GiB needed beside the current copy (50.0 GiB), "
         "30.0 GiB free in /dev/shm, memory limit 500.0 GiB: replacing it with the servers "
         "stopped", "in place: every rank stops while the copy is replaced (an outage)",
         resources=TIGHT),
    Case("a killed copy's leftovers are room: beside, not in place",
         changed(leftovers=[f"{MODELS}/.Qwen--Qwen3.6-27B.tmp-41"], leftover_bytes=25 * GIB),
         "beside", "2 file(s) new or changed; 50.0 GiB to copy, 55.0 GiB free",
         "beside the current copy: ranks serve it until they roll onto the new one",
         resources=TIGHT),
    Case("a damaged copy is replaced whole, in place",
         fact(mismatched=["model-1.safetensors"], up_to_date=False),
         "inplace", "1 staged file(s) differ from their checksums; 51.0 GiB needed beside the "
         "current copy (50.0 GiB), 30.0 GiB free in /dev/shm, memory limit 500.0 GiB: "
         "replacing it with the servers stopped",
         "in place: every rank stops while the copy is replaced (an outage)", resources=TIGHT),
    Case("a first copy with no room", Staging(source=SRC, copy_bytes=50 * GIB), "refuse",
         "the model needs 51.0 GiB = 54760833024 bytes in /dev/shm; 20.0 GiB = 21474836480 "
         "bytes free (current copy 0.0 GiB); nothing was copied", "refuse", resources=FULL),
    Case("a new revision with no room even in place", changed(), "refuse",
         "the model needs 51.0 GiB = 54760833024 bytes in /dev/shm; 0.0 GiB = 0 bytes free "
         "(current copy 50.0 GiB); nothing was copied", "refuse",
         resources=Resources(stage_total_bytes=50 * GIB, stage_free_bytes=0)),
    Case("python3 missing on the target", None, "refuse",
         "python3 is missing on the target (the staging script needs it)", "refuse"),
    Case("an unreadable source", Staging(error="model source /mnt/models/Qwen3.6-27B: not "
         "readable"), "refuse", "model source /mnt/models/Qwen3.6-27B: not readable; nothing "
         "was copied", "refuse"),
    Case("a hub source already downloaded at the pinned revision", fact(hub_revision="6a9e0b1"),
         "unchanged", FRESH, "unchanged", source=HUB),
    Case("a hub source at another revision is fetched in this run", fact(hub_revision="5f00d"),
         "beside", "the source is fetched in this run; staged beside after it",
         "beside the current copy: ranks serve it until they roll onto the new one",
         pending=True, source=HUB),
    Case("a controller source the host already holds", fact(current=copy_of("d-new")),
         "unchanged", FRESH, "unchanged", key="d-new", source=CONTROLLER),
    Case("a controller source that changed is synced in this run", fact(up_to_date=False),
         "beside", "the source is fetched in this run; staged beside after it",
         "beside the current copy: ranks serve it until they roll onto the new one",
         pending=True, key="d-newer", source=CONTROLLER),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_outcome_of_the_staging_decision(case: Case) -> None:
    settings = make_settings(model_source=case.source)

    decision = decide_stage(settings, case.resources, case.key, case.fact, case.kept)

    assert (decision.plan.mode, decision.plan.why) == (case.mode, case.why)
    assert decision.what == case.what
    assert decision.source_pending is case.pending
    assert decision.refused is (case.mode == "refuse")
    assert decision.kept == frozenset(case.kept)
    assert decision.keep_keys == case.keep_keys
    # The fact is the decision's as it was read: nothing re-derives its leftovers.
    assert decision.staging is case.fact
