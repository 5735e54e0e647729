"""What a resolution reads and writes: the host's facts (Facts), what it decided (ResolvedHost: its
Decisions, Ranks and engine) and the shapes `python -m operations.plan --json` prints them in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from operations.facts.engine import Proven
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model
from operations.plan.engine_spec import EngineSpec
from operations.plan.vocabulary import Decision, EngineJson, PlanJson


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
    # The complete environments the engine check passed in on this host's GPUs (EngineState's
    # `proven`): environment name -> its record.
    proven: Mapping[str, Proven] = field(default_factory=dict)


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
class ResolvedHost:
    """What the resolver decided for one host (one part of host_plan's HostReport): its
    decisions with their reasons, each rank's command line and unit, the engine it installs,
    and why it cannot (errors) or should not (warnings)."""

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
