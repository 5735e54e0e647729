"""One host, from settings to plan: gather the facts, run preflight, resolve, decide the staging.

The plan command and deploy.py both call `plan_for_host`, so the plan shown is the deploy run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra.api.host import Host

from operations import drain as drainmod
from operations import kb as kbmod
from operations import layout, monitoring, preflight, resolver
from operations.facts.gpu import NvidiaGpus, NvidiaSmi
from operations.facts.host import HostResources, Model, Resources
from operations.facts.model import script_module, source_model
from operations.settings import Settings
from operations.staging import StageDecision, model_staging, stage_decision


@dataclass
class HostReport:
    settings: Settings
    plan: resolver.HostPlan
    failures: list[preflight.Failure] = field(default_factory=list)
    gpu: NvidiaSmi | None = None
    resources: Resources | None = None
    model: Model | None = None
    # Set on the host that runs the router.
    router: resolver.RouterPlan | None = None
    # How the model is staged (None while preflight refuses the host).
    staging: StageDecision | None = None
    # How a restarted rank leaves and rejoins the router (None: no drain, see drain.py).
    drain: drainmod.DrainPlan | None = None
    # The Prometheus targets file and the Grafana dashboard the serve step writes.
    monitoring: monitoring.MonitoringPlan | None = None

    @property
    def errors(self) -> list[str]:
        """Every reason this host is refused, preflight first."""
        return (
            [
                f"preflight: {f.check}: expected {f.expected}; found {f.found}; fix: {f.fix}"
                for f in self.failures
            ]
            + self.plan.errors
            + (self.router.errors if self.router else [])
            + (
                [f"model staging: {self.staging.plan.why} (nothing was copied)"]
                if self.staging is not None and self.staging.refused
                else []
            )
        )

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> resolver.PlanJson:
        data = self.plan.to_json()
        data["errors"] = self.errors
        if self.router is not None:
            data["warnings"] = data["warnings"] + self.router.warnings
            data["router"] = {"argv": self.router.argv, "unit": self.router.unit}
        if self.monitoring is not None:
            data["monitoring"] = self.monitoring.to_json()
        return data


def gather(host: Host, settings: Settings) -> tuple[NvidiaSmi, Resources, Model]:
    gpu = host.get_fact(NvidiaGpus)
    resources = host.get_fact(
        HostResources,
        stage_dir=settings.model_stage_dir,
        engine_root=settings.engine_root,
        roots=[path for _, path in preflight.root_paths(settings)],
    )
    model = source_model(host, settings)
    return gpu, resources, model


def model_key(settings: Settings) -> str | None:
    """The key the staged copy of this model's source gets (STAGE_DIR/models/.SLUG@KEY), known
    before it is staged so a rank unit can name it: a hub source's pinned revision, else the
    source's manifest digest (the controller's copy, or the target's directory as the model step
    reads it). None while the source cannot be read."""
    source = settings.source
    if source.kind == "hf" and source.revision:
        return layout.hub_key(source.revision)
    if source.kind == "controller" and source.controller_dir is not None:
        try:
            return str(script_module().scan(source.controller_dir)["digest"])
        except (OSError, script_module().StageError):
            return None
    staging = model_staging(settings)
    return staging.source.digest if staging is not None and staging.source else None


def plan_for_host(
    host: Host, settings: Settings, inventory_settings: list[tuple[str, Settings]] | None = None
) -> HostReport:
    """`inventory_settings`: every host's settings, by name, for the router's worker list."""
    knowledge = kbmod.load()
    gpu, resources, model = gather(host, settings)
    failures = preflight.check(settings, knowledge, gpu, resources, model)
    facts = resolver.Facts(
        gpu=gpu,
        model=model,
        model_key=model_key(settings),
        device_nodes=tuple(resources.device_nodes) if resources is not None else None,
        python=resources.python if resources is not None else None,
    )
    plan = resolver.resolve(settings, facts, knowledge)
    router = None
    if settings.router is not None and settings.router.host == host.name:
        everyone = inventory_settings or [(host.name, settings)]
        router = resolver.resolve_router(settings, host.name, everyone)
    everyone = inventory_settings or [(host.name, settings)]
    drain, drained, drain_warnings = drainmod.decide(host.name, settings, everyone, knowledge)
    plan.decisions.append(drained)
    plan.warnings.extend(drain_warnings)
    watched, watched_decision = monitoring.decide(host.name, settings)
    plan.decisions.append(watched_decision)
    decision = None
    if not failures:
        decision = stage_decision(settings, resources, facts.model_key)
        plan.decisions.append(resolver.Decision("model staging", decision.what, decision.plan.why))
    return HostReport(
        settings, plan, failures, gpu, resources, model, router, decision, drain, watched
    )
