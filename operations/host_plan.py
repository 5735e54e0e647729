"""One host, from settings to plan: gather the facts, run preflight, resolve, and decide
everything the deploy's steps act on (the staging, the roll, the smoke requests).

`plan_for_host` gathers the facts (PreflightFacts, ServingState and ModelStaging, asked at
the same time) and calls `decide`, a pure function of settings and facts. The plan command and
deploy.py both call `plan_for_host`, so the plan shown is the deploy run; the steps read the
HostReport and decide nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from pyinfra.api.host import Host

from operations import drain as drainmod
from operations import kb as kbmod
from operations import layout, monitoring, preflight, resolver, roll
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model, Resources
from operations.facts.model import Staging, local_model, script_module
from operations.facts.once import gathered, together
from operations.facts.preflight import HostFacts, PreflightFacts
from operations.facts.serve import Serving, referenced_models, serving_state
from operations.resolver.router import open_binds
from operations.settings import Settings
from operations.staging import StageDecision, decide_stage, keep_keys, model_staging
from operations.vocabulary import Decision, PlanJson


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
    # The key of the staged copy the rank units name (None: not known; they name the link).
    model_key: str | None = None
    # The ServingState fact as the plan read it (the model step's `sha256_now`s; never shown).
    serving: Serving | None = None
    # What the serve and smoke steps do (operations/roll.py); None while preflight refuses.
    serve: roll.ServePlan | None = None

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
            + (self.serve.errors if self.serve is not None else [])
        )

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> PlanJson:
        data = self.plan.to_json()
        data["errors"] = self.errors
        if self.router is not None:
            data["warnings"] = data["warnings"] + self.router.warnings
            data["router"] = {"argv": self.router.argv, "unit": self.router.unit}
        if self.monitoring is not None:
            data["monitoring"] = self.monitoring.to_json()
        data["model_key"] = self.model_key
        if self.staging is not None:
            data["staging"] = {
                "mode": self.staging.plan.mode,
                "what": self.staging.what,
                "why": self.staging.plan.why,
                "key": self.staging.key,
                "keep": self.staging.keep_keys,
                "source_pending": self.staging.source_pending,
            }
        if self.serve is not None:
            data["serve"] = self.serve.to_json()
        return data


@dataclass(frozen=True)
class Gathered:
    """Every fact the plan reads of one host (`gather`), as `decide` takes them."""

    host: HostFacts
    # The ServingState fact (rank units, managed files, the engine's environments).
    serving: Serving
    # The ModelStaging fact of the source (None: python3 is missing on the host).
    staging: Staging | None
    # The model the deploy stages, read where it is now (controller or target).
    model: Model
    # The staged copy's key (model_key); None while the source cannot be read.
    model_key: str | None


def gather(host: Host, settings: Settings, router_list: str | None = None) -> Gathered:
    """The facts of one host, each asked once per run (once.gathered), all at the same time:
    the preflight facts, what serves and the staging plan.

    The staging plan must be the one the stage run gets with the kept copies (--keep: the
    copies the rank units name, known from ServingState). It is asked without them first:
    keeping a copy only takes it out of the plan's leftovers, so when no leftover is a kept
    copy the two answers are the same (tests/unit/test_staging_rule.py). Otherwise, as while a
    roll onto a new copy is unfinished, it is asked again with them."""
    source = settings.source
    on_target = not (source.kind == "controller" and source.controller_dir is not None)
    key = model_key(settings, None)

    def preflight_facts() -> HostFacts:
        found: HostFacts = gathered(
            PreflightFacts,
            stage_dir=settings.model_stage_dir,
            engine_root=settings.engine_root,
            roots=[path for _, path in preflight.root_paths(settings)],
            model_path=source.target_dir if on_target else None,
            access=preflight.access_probe(settings),
        )
        return found

    found, serving, staging = cast(
        tuple[HostFacts, Serving, "Staging | None"],
        together(
            preflight_facts,
            lambda: serving_state(settings, router_list),
            lambda: model_staging(settings, key, []),
        ),
    )
    keep = keep_keys(settings, referenced_models(serving), key)
    if staging is not None and any(layout.copy_key(settings, p) in keep for p in staging.leftovers):
        staging = model_staging(settings, key, keep)
    if key is None:
        key = model_key(settings, staging)
    if on_target:
        model = found.model if found.model is not None else Model(exists=False)
    else:
        assert source.controller_dir is not None
        model = local_model(source.controller_dir)
    return Gathered(host=found, serving=serving, staging=staging, model=model, model_key=key)


def model_key(settings: Settings, staging: Staging | None) -> str | None:
    """The key the staged copy of this model's source gets (STAGE_DIR/models/.SLUG@KEY), known
    before it is staged so a rank unit can name it: a hub source's pinned revision, else the
    source's manifest digest (the controller's copy, or the target's directory as the
    ModelStaging fact read it: with `staging` None, the key known before that fact). None
    while the source cannot be read."""
    source = settings.source
    if source.kind == "hf" and source.revision:
        return layout.hub_key(source.revision)
    if source.kind == "controller" and source.controller_dir is not None:
        try:
            return str(script_module().scan(source.controller_dir)["digest"])
        except (OSError, script_module().StageError):
            return None
    return staging.source.digest if staging is not None and staging.source else None


def plan_for_host(
    host: Host, settings: Settings, inventory_settings: list[tuple[str, Settings]] | None = None
) -> HostReport:
    """`inventory_settings`: every host's settings, by name, for the router's worker list."""
    knowledge = kbmod.load()
    everyone = inventory_settings or [(host.name, settings)]
    drain, _, _ = drainmod.decide(host.name, settings, everyone, knowledge)
    listing = drain.list_url() if drain is not None else None
    return decide(
        host.name, settings, gather(host, settings, listing), knowledge, inventory_settings
    )


def decide(
    host_name: str,
    settings: Settings,
    facts: Gathered,
    knowledge: kbmod.Knowledge,
    inventory_settings: list[tuple[str, Settings]] | None = None,
) -> HostReport:
    """The host's report from its settings and facts: pure (tests/unit/test_host_report.py)."""
    gpu, resources, model = facts.host.gpu, facts.host.resources, facts.model
    failures = preflight.check(settings, knowledge, gpu, resources, model, facts.host.access)
    resolver_facts = resolver.Facts(
        gpu=gpu,
        model=model,
        model_key=facts.model_key,
        device_nodes=tuple(resources.device_nodes) if resources is not None else None,
        python=resources.python if resources is not None else None,
    )
    plan = resolver.resolve(settings, resolver_facts, knowledge)
    everyone = inventory_settings or [(host_name, settings)]
    router = None
    if settings.router is not None and settings.router.host == host_name:
        router = resolver.resolve_router(settings, host_name, everyone)
    drain, drained, drain_warnings = drainmod.decide(host_name, settings, everyone, knowledge)
    plan.decisions.append(drained)
    plan.warnings.extend(drain_warnings)
    if (low_ram := preflight.ram_per_rank_warning(settings)) is not None:
        plan.warnings.append(low_ram)
    plan.warnings.extend(open_binds(settings, host_name))
    plan.warnings.extend(preflight.access_warnings(settings, facts.host.access))
    watched, watched_decision = monitoring.decide(host_name, settings)
    plan.decisions.append(watched_decision)
    decision = None
    serve = None
    if not failures:
        kept = referenced_models(facts.serving)
        decision = decide_stage(settings, resources, facts.model_key, facts.staging, kept)
        plan.decisions.append(Decision("model staging", decision.what, decision.plan.why))
        python = plan.engine.python if plan.engine is not None else None
        serve = roll.serve_plan(settings, plan.ranks, facts.serving, router, drain, watched, python)
    return HostReport(
        settings,
        plan,
        failures,
        gpu,
        resources,
        model,
        router,
        decision,
        drain,
        watched,
        model_key=facts.model_key,
        serving=facts.serving,
        serve=serve,
    )
