"""One host, from settings to plan: gather the facts, run preflight, resolve.

The plan command and deploy.py both call `plan_for_host`, so the plan shown is the deploy run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from operations import kb as kbmod
from operations import preflight, resolver
from operations.facts.gpu import NvidiaGpus, NvidiaSmi
from operations.facts.host import HostResources, Model, Resources
from operations.facts.model import source_model
from operations.settings import Settings


@dataclass
class HostReport:
    settings: Settings
    plan: resolver.HostPlan
    failures: list[preflight.Failure] = field(default_factory=list)
    gpu: NvidiaSmi | None = None
    resources: Resources | None = None
    model: Model | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.plan.errors

    def to_json(self) -> dict[str, Any]:
        data = self.plan.to_json()
        data["errors"] = [
            f"preflight: {f.check}: expected {f.expected}; found {f.found}; fix: {f.fix}"
            for f in self.failures
        ] + data["errors"]
        return data


def gather(host: Any, settings: Settings) -> tuple[NvidiaSmi, Resources, Model]:
    gpu = host.get_fact(NvidiaGpus)
    resources = host.get_fact(
        HostResources, stage_dir=settings.model_stage_dir, engine_root=settings.engine_root
    )
    model = source_model(host, settings)
    return gpu, resources, model


def plan_for_host(host: Any, settings: Settings) -> HostReport:
    knowledge = kbmod.load()
    gpu, resources, model = gather(host, settings)
    failures = preflight.check(settings, knowledge, gpu, resources, model)
    plan = resolver.resolve(settings, resolver.Facts(gpu=gpu, model=model), knowledge)
    return HostReport(settings, plan, failures, gpu, resources, model)
