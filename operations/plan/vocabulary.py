"""The plan's shared words: a `Decision`, and the shapes `python -m operations.plan --json`
prints a host's plan in (`PlanJson` and its parts, `ServeJson` for the serve and smoke steps).

The resolver (operations/plan/resolver/), the serve plan (operations/plan/serve_plan.py), the drain
plan (operations/plan/drain.py) and the host report (operations/plan/host_plan.py) all speak them;
they live here, importing nothing of the package, so none of those modules has to import another to
name them (tests/unit/test_import_graph.py: no circles). Each of them imports them from here: no
module re-exports them (tests/unit/test_vocabulary_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

# The words of the plan's modes, shared by the plan and the steps that carry it out.
# What the stage operation does with the model copy (staging.StagePlan).
StageMode = Literal["unchanged", "beside", "inplace", "refuse"]
# How a copy fits the tmpfs (capacity.StageRoom; None there: it does not).
RoomMode = Literal["beside", "inplace"]
# What the staging script is told: a mode the plan decided, or "auto" (the boot unit's: no rank
# runs yet, so in place is safe where beside does not fit).
StageScriptMode = Literal["unchanged", "beside", "inplace", "refuse", "auto"]
# An engine environment on the host as the plan read it (steps/engine.build_env's `now`).
EnvNow = Literal["complete", "partial", "absent"]
# The drain script's action: take ranks out of the router, or put them back.
DrainAction = Literal["out", "in"]
# A roll batch's steps, in the order programs/roll_batch.py runs them.
RollStep = Literal["drain", "backup", "write", "restore", "restart", "health", "smoke", "readmit"]


@dataclass(frozen=True)
class Decision:
    what: str
    value: str
    why: str


class DecisionJson(TypedDict):
    what: str
    value: str
    why: str


class PinJson(TypedDict):
    requirement: str
    index: str
    index_lane: str


class EngineJson(TypedDict):
    name: str
    requirements: list[str]
    pins: list[PinJson]
    overrides: list[str]
    excludes: list[str]
    python: str
    unproven: list[str]


class RankJson(TypedDict):
    rank: int
    argv: list[str]
    env: dict[str, str]
    unit: str
    engine_env: str
    model_path: str


class RouterJson(TypedDict):
    argv: list[str]
    unit: str


class TargetGroupJson(TypedDict):
    """One Prometheus file_sd target group (operations/plan/monitoring.py)."""

    targets: list[str]
    labels: dict[str, str]


class MonitoringJson(TypedDict):
    targets_file: str
    dashboard_file: str
    targets: list[TargetGroupJson]


class ThroughputRunJson(TypedDict):
    argv: list[str]
    through: str


class ThroughputJson(TypedDict):
    """operations/plan/throughput_plan.py ThroughputPlan.to_json."""

    run: ThroughputRunJson | None
    skip: str
    errors: list[str]


class PlanJson(TypedDict):
    """One host's plan as `python -m operations.plan --json` prints it."""

    errors: list[str]
    warnings: list[str]
    decisions: list[DecisionJson]
    engine: EngineJson | None
    ranks: list[RankJson]
    router: NotRequired[RouterJson]
    monitoring: NotRequired[MonitoringJson]
    # The HostReport's decisions on the host's state (host_plan.py): the staged copy's key,
    # how it is staged, and what the serve and smoke steps do (operations/plan/serve_plan.py).
    model_key: NotRequired[str | None]
    staging: NotRequired[StagingJson]
    serve: NotRequired[ServeJson]
    # What the engine and model steps do and every file they write (engine_plan.py,
    # model_plan.py); None while preflight refuses the host.
    engine_step: NotRequired[EngineStepJson | None]
    model_step: NotRequired[ModelStepJson | None]
    throughput: NotRequired[ThroughputJson]
    # The toolkit version that last deployed the host and what this run records
    # (plan/toolkit_version.py); absent while preflight refuses the host.
    toolkit: NotRequired[VersionJson]


class VersionJson(TypedDict):
    version: str
    recorded_version: str | None
    recorded_date: str | None
    change: str
    changelog: str
    said: str
    changes: bool | None


class StagingJson(TypedDict):
    mode: StageMode
    what: str
    why: str
    key: str | None
    keep: list[str]
    source_pending: bool


class SmokeJson(TypedDict):
    python: str
    targets: list[str]
    router_workers: list[str]


class FileJson(TypedDict):
    """One file a step writes (operations/plan/planned_files.py): a secret's content and digest are
    never shown; `content` is shown for units only."""

    name: str
    path: str
    mode: str
    owner: str
    group: str
    secret: bool
    sha256: str | None
    # The facts' reading (None: absent, not read, or a secret's).
    sha256_now: str | None
    # Whether the plan's facts read it.
    read: bool
    # Whether the write changes the host (None: not known before the write).
    changes: bool | None
    # What on the host makes it (uv lock, uv export, cp), for a file the controller cannot give.
    made_by: str | None
    content: str | None


class RouterStepJson(TypedDict):
    version: str
    package: str
    env_dir: str
    retired: list[str]
    install: bool
    restart: bool
    files: list[FileJson]


class KeySourceJson(TypedDict):
    path: str
    made: bool


class CanaryJson(TypedDict):
    """A canary rollout (operations/plan/canary_plan.py); stage None: it does not apply."""

    stage: str | None
    skip: str
    canary: list[int]
    canary_batch: list[int]
    baseline: int | None
    baselines: list[int]
    start_after: list[int]
    stopped: list[int]
    judged_again: str
    rest: list[list[int]]
    release: str
    engine: str
    checks: list[str]
    max_slowdown: float
    soak_s: int
    soak: bool
    argv: list[str]
    backup: dict[str, str]
    restore: dict[str, str]
    refusal: str
    errors: list[str]
    summary: str


class ServeJson(TypedDict):
    start: list[int]
    batches: list[list[int]]
    remove: list[int]
    unchanged: list[int]
    # Not serving, held by a canary: started after its verdict passes, or left stopped.
    start_after: list[int]
    stopped: list[int]
    pending: dict[str, str]
    readmit: list[int]
    secret_changed: bool
    remove_secret: bool
    router_restart: bool
    batch_smoke: list[SmokeJson | None]
    smoke: SmokeJson
    prune_keep: list[str]
    prune_doomed: list[str]
    summary: str
    # Every file the serve and smoke steps write this run, in order, and the router's part.
    files: list[FileJson]
    smoke_files: list[FileJson]
    rank_units: list[FileJson]
    control_plane_key: FileJson | None
    # Where the router's control-plane key is kept on the controller (never its content).
    control_plane_key_source: KeySourceJson | None
    router_step: RouterStepJson | None
    # The router's restart and the control-plane key come before the ranks roll.
    router_first: bool
    # The canary rollout (None: not asked, as when the plan has no CanaryState fact).
    canary: NotRequired[CanaryJson | None]


# -- the engine and model steps' plans (operations/plan/engine_plan.py,
# operations/plan/model_plan.py) --


class UvJson(TypedDict):
    version: str
    now: str | None


class LockJson(TypedDict):
    controller: str
    upload: bool
    fetch: bool


# "from" is a keyword: the functional form.
SwitchJson = TypedDict("SwitchJson", {"from": str | None, "to": str})


class ToolkitStepJson(TypedDict):
    name: str
    installed: bool
    sync_archives: bool


class CompileCacheJson(TypedDict):
    path: str
    make: bool
    prune: list[str]


class EngineStepJson(TypedDict):
    name: str
    install: bool
    partial: bool
    uv: UvJson
    missing_wheels: list[str]
    wheels_to_sync: list[str]
    lock: LockJson
    switch: SwitchJson
    prune: list[str]
    compile_cache: CompileCacheJson
    packages_missing: list[str]
    toolkit: ToolkitStepJson | None
    files: list[FileJson]


class UnitTextJson(TypedDict):
    path: str
    text: str


class ModelStepJson(TypedDict):
    source: str
    sync: bool
    hub_cli: bool
    download: bool
    make_user: bool
    enable_stage_unit: bool
    stage: str
    units: list[UnitTextJson]
    files: list[FileJson]
