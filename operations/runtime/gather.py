"""One host's facts, gathered for its plan, and the plan decided from them (`plan_for_host`): the
plan command and deploy.py both call it, so the plan shown is the deploy run.

`gather` asks the host (PreflightFacts, ServingState, ModelStaging and CanaryState, at the
same time) and reads what the plan needs of the controller (the engine locks, the wheelhouse,
a controller source's scan, the hub token); operations/plan/host_plan.decide, a pure function
of settings and these facts, decides. Nothing here decides, and nothing in the plan reads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from datetime import UTC, datetime
from typing import cast

from pyinfra.api.host import Host
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.facts.files import File

from operations import kb as kbmod
from operations import layout
from operations.facts.canary import Canary, CanaryState
from operations.facts.engine import WheelhouseFiles
from operations.facts.host import Model
from operations.facts.model import ModelStaging, Staging, local_model, script_module
from operations.facts.once import gathered, together
from operations.facts.preflight import HostFacts, PreflightFacts
from operations.facts.serve import Serving, serving_state
from operations.plan import drain as drainmod
from operations.plan import host_plan
from operations.plan.engine_plan import EngineFacts, no_engine
from operations.plan.host_plan import Gathered, HostReport
from operations.plan.model_plan import TOKEN_ENV
from operations.plan.preflight import access_probe, root_paths
from operations.plan.preflight_source import Connector, ControllerTools
from operations.plan.rank_state import referenced_env_names, referenced_models
from operations.plan.staging import ControllerScan, keep_keys
from operations.settings import Settings


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
    controller = None if on_target else controller_scan(str(source.controller_dir))
    key = host_plan.model_key(settings, None, controller)
    wheelhouse = layout.engine_tree(settings).wheelhouse if settings.wheelhouse else None

    def preflight_facts() -> HostFacts:
        found: HostFacts = gathered(
            PreflightFacts,
            stage_dir=settings.model_stage_dir,
            engine_root=settings.engine_root,
            roots=[path for _, path in root_paths(settings)],
            model_path=source.target_dir if on_target else None,
            access=access_probe(settings),
        )
        return found

    calls = [
        preflight_facts,
        lambda: serving_state(settings, router_list),
        lambda: model_staging(settings, key, []),
        # The last canary verdict and the unit backups (plan/canary_plan.py).
        lambda: gathered(CanaryState),
    ]
    if wheelhouse is not None:
        # The host's copy of the wheelhouse, for the engine plan's sync: with the others.
        calls.append(lambda: gathered(WheelhouseFiles, path=wheelhouse) or {})
    answers = together(*calls)
    found, serving, staging, canary = cast(
        tuple[HostFacts, Serving, "Staging | None", Canary], answers[:4]
    )
    remote = cast(dict[str, int], answers[4]) if wheelhouse is not None else {}
    keep = keep_keys(settings, referenced_models(serving), key)
    if staging is not None and any(layout.copy_key(settings, p) in keep for p in staging.leftovers):
        staging = model_staging(settings, key, keep)
    if key is None:
        key = host_plan.model_key(settings, staging, controller)
    if on_target:
        model = found.model if found.model is not None else Model(exists=False)
    else:
        assert source.controller_dir is not None
        model = local_model(source.controller_dir)
    cli = None
    if source.kind == "hf" and (staging.hub_revision if staging else None) != source.revision:
        # Only while the download is to do: a converged host never asks.
        cli = bool(gathered(File, path=settings.model_hub_cli))
    return Gathered(
        host=found,
        serving=serving,
        staging=staging,
        model=model,
        model_key=key,
        engine=engine_facts(host, settings, serving, remote),
        controller=controller,
        hub_cli_installed=cli,
        hub_token=hub_token(),
        canary=canary,
        tools=controller_tools(host),
        today=today(),
    )


def engine_facts(
    host: Host, settings: Settings, serving: Serving, wheels_now: dict[str, int]
) -> EngineFacts:
    """The engine plan's facts: the host's from the ServingState fact (and WheelhouseFiles),
    the controller's read here (its locks, relative to the deploy's directory as pyinfra
    resolves local paths, and its wheelhouse)."""
    run = getattr(host, "state", None)
    cwd = run.cwd if run is not None and run.cwd else os.getcwd()
    locks: dict[str, str] = {}
    lock_dir = os.path.join(cwd, settings.engine_lock_dir)
    for entry in (
        sorted(os.scandir(lock_dir), key=lambda e: e.name) if os.path.isdir(lock_dir) else ()
    ):
        if entry.name.endswith(".lock") and entry.is_file():
            with open(entry.path, "rb") as lock:
                locks[entry.name] = hashlib.sha256(lock.read()).hexdigest()
    wheels = None
    if settings.wheelhouse and os.path.isdir(settings.wheelhouse):
        # os.walk and os.path: pyinfra-testing fakes local files through those.
        _, _, names = next(os.walk(settings.wheelhouse), ("", [], []))
        wheels = {
            n: os.path.getsize(os.path.join(settings.wheelhouse, n))
            for n in sorted(names)
            if n.endswith(".whl")
        }
    return EngineFacts(
        state=serving.engine if serving.engine is not None else no_engine(),
        cwd=cwd,
        locks=locks,
        wheels=wheels,
        wheels_now=wheels_now,
        referenced=frozenset(referenced_env_names(serving, settings.engine_root)),
        user_exists=serving.user_exists,
    )


def plan_for_host(
    host: Host, settings: Settings, inventory_settings: list[tuple[str, Settings]] | None = None
) -> HostReport:
    """`inventory_settings`: every host's settings, by name, for the router's worker list."""
    knowledge = kbmod.load()
    everyone = inventory_settings or [(host.name, settings)]
    listing = drainmod.router_list_url(host.name, settings, everyone, knowledge)
    return host_plan.decide(
        host.name, settings, gather(host, settings, listing), knowledge, inventory_settings
    )


def model_staging(settings: Settings, key: str | None, keep: list[str]) -> Staging | None:
    """The ModelStaging fact of this host's source (gathered once): `key`, the copy's key when
    known before the fact (a hub revision's, the controller's digest; None: the target
    directory's digest, the script's default), and `keep`, the kept copies' keys."""
    staging: Staging | None = gathered(
        ModelStaging,
        source=settings.source.target_dir,
        stage_dir=settings.model_stage_dir,
        slug=layout.model_slug(settings),
        verify=settings.model_verify,
        key=key,
        keep=keep,
    )
    return staging


def controller_scan(path: str) -> ControllerScan:
    """A controller source's directory as the staging script's scan reads it, once per run."""
    module = script_module()
    try:
        found = module.scan(path)
    except (OSError, module.StageError) as exc:
        return ControllerScan(error=str(exc))
    return ControllerScan(str(found["digest"]), int(found["bytes"]))


def controller_tools(host: Host) -> ControllerTools:
    """The commands the deploy runs on the controller, as its PATH finds them, and how the
    host is reached (pyinfra's SSH connector runs rsync over `ssh`; @local runs it here)."""
    reach = getattr(host, "connector", None)
    connector: Connector = (
        "ssh"
        if isinstance(reach, SSHConnector)
        else "local"
        if isinstance(reach, LocalConnector)
        else "other"
    )
    return ControllerTools(shutil.which("rsync"), shutil.which("ssh"), connector)


def today() -> str:
    """The controller's date (UTC, YYYY-MM-DD): the toolkit record's date for a version the host
    has not recorded yet (plan/toolkit_version.py); the plan reads no clock."""
    return datetime.now(UTC).date().isoformat()


def hub_token() -> str | None:
    """The controller's hub token (its environment), read once per host by `gather`."""
    return os.environ.get(TOKEN_ENV) or None
