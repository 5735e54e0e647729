"""What a resolution reads and writes: the host's facts (Facts), the plan (HostPlan: its
Decisions, Ranks and engine) and the shapes `python -m operations.plan --json` prints them in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from operations.engine_spec import EngineSpec
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model

if TYPE_CHECKING:
    from operations.roll import ServeJson


@dataclass(frozen=True)
class Facts:
    """What the resolver knows of the host; None means not gathered (plan from settings)."""

    gpu: NvidiaSmi | None = None
    model: Model | None = None
    # The key of the staged copy this model's source makes (host_plan.model_key): the ranks
    # name STAGE_DIR/models/.SLUG@KEY. None: not known yet; the ranks name the model link.
    model_key: str | None = None
    # /dev/nvidia* nodes present (HostResources); None: not gathered.
    device_nodes: tuple[str, ...] | None = None
    # The host's python3 version ("3.11.2", HostResources); None: not gathered.
    python: str | None = None


@dataclass(frozen=True)
class Decision:
    what: str
    value: str
    why: str


@dataclass(frozen=True)
class Rank:
    rank: int
    gpu: int
    port: int
    argv: list[str]
    env: dict[str, str]
    unit_name: str
    unit: str
    # What the unit runs: the engine environment and the staged model copy, by path.
    engine_env: str = ""
    model_path: str = ""


@dataclass
class HostPlan:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    ranks: list[Rank] = field(default_factory=list)
    # The engine environment this host installs (None when the release or lane is refused).
    engine: EngineSpec | None = None

    def to_json(self) -> PlanJson:
        return {
            "errors": self.errors,
            "warnings": self.warnings,
            "decisions": [{"what": d.what, "value": d.value, "why": d.why} for d in self.decisions],
            "engine": _engine_json(self.engine),
            "ranks": [
                {
                    "rank": r.rank,
                    "argv": r.argv,
                    "env": r.env,
                    "unit": r.unit,
                    "engine_env": r.engine_env,
                    "model_path": r.model_path,
                }
                for r in self.ranks
            ],
        }


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
    """One Prometheus file_sd target group (operations/monitoring.py)."""

    targets: list[str]
    labels: dict[str, str]


class MonitoringJson(TypedDict):
    targets_file: str
    dashboard_file: str
    targets: list[TargetGroupJson]


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
    # how it is staged, and what the serve and smoke steps do (operations/roll.py).
    model_key: NotRequired[str | None]
    staging: NotRequired[StagingJson]
    serve: NotRequired[ServeJson]


class StagingJson(TypedDict):
    mode: str
    what: str
    why: str
    key: str | None
    keep: list[str]
    source_pending: bool


def _engine_json(spec: EngineSpec | None) -> EngineJson | None:
    if spec is None:
        return None
    return {
        "name": spec.name,
        "requirements": list(spec.requirements),
        "pins": [
            {"requirement": p.requirement, "index": p.index, "index_lane": p.index_lane}
            for p in spec.pins
        ],
        "overrides": list(spec.overrides),
        "excludes": list(spec.excludes),
        "python": spec.python,
        "unproven": list(spec.unproven),
    }
