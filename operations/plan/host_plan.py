"""One host, from settings and facts to plan: run preflight, resolve, and decide everything the
deploy's steps act on (the staging, the roll, the smoke requests).

`decide` is a pure function of the settings (with the controller files their loader read), the
gathered facts (`Gathered`, from operations/runtime/gather.py) and the knowledge base: it reads
no file, draws no random number and asks nothing (tests/unit/test_plan_is_pure.py). The plan
command and deploy.py both call runtime/gather.plan_for_host, so the plan shown is the deploy
run; the steps read the HostReport and decide nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from operations import kb as kbmod
from operations import layout
from operations.facts.canary import Canary
from operations.facts.engine import EngineHost, Proven
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model, Resources
from operations.facts.model import Staging
from operations.facts.preflight import HostFacts
from operations.facts.serve import Serving
from operations.plan import drain as drainmod
from operations.plan import (
    engine_plan,
    model_plan,
    monitoring,
    preflight,
    rank_state,
    resolver,
    router_step,
    serve_plan,
    throughput_plan,
    toolkit_version,
)
from operations.plan.engine_probe import Driver
from operations.plan.resolver.router import open_binds
from operations.plan.staging import (
    ControllerScan,
    StageDecision,
    decide_stage,
)
from operations.plan.vocabulary import Decision, PlanJson
from operations.settings import Settings


@dataclass
class HostReport:
    settings: Settings
    plan: resolver.ResolvedHost
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
    # What the serve and smoke steps do (operations/plan/serve_plan.py); None while preflight
    # refuses.
    serve: serve_plan.ServePlan | None = None
    # What the engine and model steps do, every file they write (engine_plan.py,
    # model_plan.py); None while the host is refused.
    engine_step: engine_plan.EnginePlan | None = None
    model_step: model_plan.ModelPlan | None = None
    # What the throughput step does (operations/plan/throughput_plan.py).
    throughput: throughput_plan.ThroughputPlan | None = None
    # The toolkit version the host's record names and the record this run writes
    # (plan/toolkit_version.py); None while preflight refuses the host.
    toolkit: toolkit_version.VersionPlan | None = None
    # The facts the resolver read, for a plan that resolves the ranks again with other
    # settings (the tune's candidates, operations/plan/tune_plan.py).
    resolver_facts: resolver.Facts | None = None

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
            + (self.throughput.errors if self.throughput is not None else [])
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
        data["engine_step"] = self.engine_step.to_json() if self.engine_step else None
        data["model_step"] = self.model_step.to_json() if self.model_step else None
        if self.throughput is not None:
            data["throughput"] = self.throughput.to_json()
        if self.toolkit is not None:
            data["toolkit"] = self.toolkit.to_json()
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
    # The engine step's facts: EngineState (in ServingState), the controller's locks and
    # wheelhouse, the host's wheelhouse (WheelhouseFiles, asked with the others).
    engine: engine_plan.EngineFacts = field(default_factory=engine_plan.EngineFacts)
    # A controller source's scan on the controller (once per run); None for other sources.
    controller: ControllerScan | None = None
    # Whether the hub CLI is installed: asked only while a hub download is to do (None: not).
    hub_cli_installed: bool | None = None
    # The controller's hub token (HF_TOKEN); never shown.
    hub_token: str | None = field(default=None, repr=False)
    # The commands the deploy runs on the controller (rsync, ssh); None: not asked.
    tools: preflight.ControllerTools | None = None
    # The CanaryState fact (the last canary verdict, the unit backups); None: not asked, and
    # no canary rollout is decided.
    canary: Canary | None = None
    # The controller's date (YYYY-MM-DD, UTC) when it gathered: the toolkit record's date for a
    # version the host has not recorded yet (plan/toolkit_version.py); None: not known.
    today: str | None = None


def model_key(
    settings: Settings, staging: Staging | None, controller: ControllerScan | None = None
) -> str | None:
    """The key the staged copy of this model's source gets (STAGE_DIR/models/.SLUG@KEY), known
    before it is staged so a rank unit can name it: a hub source's pinned revision, else the
    source's manifest digest (the controller's copy as its scan read it, or the target's
    directory as the ModelStaging fact read it: with `staging` None, the key known before that
    fact). None while the source cannot be read."""
    source = settings.source
    if source.kind == "hf" and source.revision:
        return layout.hub_key(source.revision)
    if source.kind == "controller" and source.controller_dir is not None:
        return controller.digest if controller is not None else None
    return staging.source.digest if staging is not None and staging.source else None


def proven_envs(state: EngineHost) -> dict[str, Proven]:
    """The records of the engine check passing on this host's GPUs, of complete environments
    only (a partial one is rebuilt and checked again)."""
    envs = state["envs"]
    return {
        name: record
        for name, record in state.get("proven", {}).items()
        if (env := envs.get(name)) is not None and env["complete"]
    }


def decide(
    host_name: str,
    settings: Settings,
    facts: Gathered,
    knowledge: kbmod.Knowledge,
    inventory_settings: list[tuple[str, Settings]] | None = None,
) -> HostReport:
    """The host's report from its settings and facts: pure (tests/unit/test_host_report.py,
    tests/unit/test_plan_is_pure.py). One way down, each part decided once, from the settings
    and the facts' values and what the parts before it decided: preflight, the resolution, the
    router, the drain, the warnings, the monitoring; then, for a host preflight passes, the
    staging, the serve plan and the engine and model steps' plans."""
    gpu, resources, model = facts.host.gpu, facts.host.resources, facts.model
    failures = preflight.check(
        settings, knowledge, gpu, resources, model, facts.host.access, facts.tools
    )
    resolver_facts = resolver.Facts(
        gpu=gpu,
        model=model,
        model_key=facts.model_key,
        device_nodes=tuple(resources.device_nodes) if resources is not None else None,
        python=resources.python if resources is not None else None,
        proven=proven_envs(facts.engine.state),
    )
    plan = resolver.resolve(settings, resolver_facts, knowledge)
    everyone = inventory_settings or [(host_name, settings)]
    router = None
    if settings.router is not None and settings.router.host == host_name:
        router = resolver.resolve_router(settings, host_name, everyone, knowledge)
        plan.decisions.extend(router.decisions)
    drain, drained, drain_warnings = drainmod.decide(host_name, settings, everyone, knowledge)
    plan.decisions.append(drained)
    plan.warnings.extend(drain_warnings)
    if (low_ram := preflight.ram_per_rank_warning(settings)) is not None:
        plan.warnings.append(low_ram)
    plan.warnings.extend(open_binds(settings, host_name))
    plan.warnings.extend(preflight.access_warnings(settings, facts.host.access))
    if settings.source.kind == "hf" and settings.source.revision:
        revision, revision_warning = model_plan.hub_revision(settings, facts.staging)
        plan.decisions.append(revision)
        plan.warnings.extend([revision_warning] if revision_warning else [])
    watched, watched_decision = monitoring.decide(host_name, settings)
    plan.decisions.append(watched_decision)
    decision = None
    serve = None
    engine_step, model_step = None, None
    throughput = None
    toolkit = None
    if not failures:
        toolkit = toolkit_version.decide(
            settings, facts.serving.toolkit, facts.serving.files, facts.today
        )
        plan.decisions.append(toolkit.decision())
        kept = rank_state.referenced_models(facts.serving)
        decision = decide_stage(
            settings, resources, facts.model_key, facts.staging, kept, facts.controller
        )
        plan.decisions.append(Decision("model staging", decision.what, decision.plan.why))
        python = plan.engine.python if plan.engine is not None else None
        serve = serve_plan.serve_plan(
            settings,
            plan.ranks,
            facts.serving,
            router,
            drain,
            watched,
            python,
            canary_state=facts.canary,
            target=throughput_plan.flags_digest(plan.ranks),
        )
        if serve.canary is not None and serve.canary.decision is not None:
            plan.decisions.append(serve.canary.decision)
        if serve.router is not None and serve.router.restart:
            plan.decisions.append(router_step.router_change(serve.router))
        engine_step, model_step = _step_plans(settings, plan, facts, decision)
        changed = bool(serve.roll.start or serve.roll.rolled) or serve.router_restart
        throughput = throughput_plan.throughput_plan(
            settings,
            plan.ranks,
            changed,
            router is not None,
            facts.model_key,
            serve_plan.file_digests(facts.serving),
            throughput_plan.card_ceilings(
                gpu.gpus[0].name if gpu is not None and gpu.gpus else None,
                model.size_bytes if model is not None else None,
                model.quantization if model is not None else None,
            ),
            pending=facts.serving.throughput_pending,
            hardware=(
                gpu.gpus[0].name if gpu is not None and gpu.gpus else None,
                gpu.driver_version if gpu is not None else None,
            ),
        )
        if throughput.decision is not None:
            plan.decisions.append(throughput.decision)
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
        engine_step=engine_step,
        model_step=model_step,
        throughput=throughput,
        toolkit=toolkit,
        resolver_facts=resolver_facts,
    )


def _step_plans(
    settings: Settings, plan: resolver.ResolvedHost, facts: Gathered, decision: StageDecision
) -> tuple[engine_plan.EnginePlan | None, model_plan.ModelPlan | None]:
    """The engine and model steps' plans; none while the resolver or the staging refuses."""
    spec = plan.engine
    if spec is None or plan.errors or decision.refused:
        return None, None
    gpu, resources = facts.host.gpu, facts.host.resources
    driver = Driver(gpu.driver_version if gpu else None, gpu.cuda_version if gpu else None)
    nodes = resources.device_nodes if resources is not None else None
    engine = engine_plan.decide(settings, spec, facts.engine, driver, nodes)
    model = model_plan.decide(
        settings,
        decision,
        facts.model_key,
        facts.serving.files,
        facts.serving.enabled,
        facts.serving.user_exists,
        engine.install,
        spec.python,
        facts.controller,
        facts.hub_cli_installed,
        facts.hub_token,
    )
    return engine, model
