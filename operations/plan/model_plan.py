"""The model step's plan: everything operations/steps/model.py carries out, decided once from the
settings, the staging decision (operations/plan/staging.py) and the facts the plan gathered
(runtime/gather.py): the ServingState fact's digests and unit state, the ModelStaging fact,
the controller's scan of a controller source (once per run), whether the hub CLI is installed
(asked only while a hub download is to do) and the controller's HF_TOKEN.

`decide` is pure; the step's operations each get their part of the plan and decide nothing
again. The stage unit's text is rendered here (stage_unit_text; operations/steps/model.py re-exports
it) so the plan shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from operations import layout
from operations.facts.model import Staging, script_text
from operations.kb.pins import hub_requirements
from operations.layout import HUB_TOKEN_FILE, STAGE_UNIT
from operations.plan.capacity import STAGE_HEADROOM
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.staging import ControllerScan, StageDecision
from operations.plan.vocabulary import Decision, ModelStepJson, StageScriptMode
from operations.render import units
from operations.settings import Settings

# The controller's environment variable holding a hub token (never a setting: settings are
# shown; the token is written root-only for the one download, then removed).
TOKEN_ENV = "HF_TOKEN"


def is_commit(revision: str) -> bool:
    """A hub revision that names one commit: 40 lowercase hex digits."""
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def hub_revision(settings: Settings, staging: Staging | None) -> tuple[Decision, str | None]:
    """The plan's line for a hub source's revision, and its warning when the revision is a
    branch or tag: the commit it was resolved to by the download (the hub's metadata), once
    downloaded; resolved once and never followed."""
    s, source = settings, settings.source
    assert source.repo and source.revision
    if is_commit(source.revision):
        return Decision("hub revision", source.revision, "a commit: every host stages it"), None
    downloaded = staging is not None and staging.hub_revision == source.revision
    commit = staging.hub_commit if staging is not None and downloaded else None
    if commit is not None:
        value, when = f"{source.revision} -> commit {commit}", "at this host's download"
    else:
        value, when = f"{source.revision} -> the commit it names at the download", "at download"
    warning = (
        f"model_source {s.model_source} (set in {s.origin('model_source')}): "
        f"{source.revision!r} is a branch or tag, not a 40-hex commit: it is resolved once "
        f"{when} and never followed, and each host may get another commit; pin "
        f"hf://{source.repo}@{commit or 'COMMIT'}"
    )
    why = "a branch or tag is resolved once, at the download, and never followed"
    return Decision("hub revision", value, why), warning


def stage_command(
    source_dir: str,
    stage_dir: str,
    slug: str,
    mode: StageScriptMode,
    verify: str,
    bwlimit_mbps: float | None,
    python: str = "python3",
    script: str = layout.STAGE_SCRIPT,
    key: str | None = None,
    keep: tuple[str, ...] = (),
    group: str | None = None,
    headroom: float = STAGE_HEADROOM,
) -> list[str]:
    """The one command line of a staging run: the deploy and the boot unit both use it.
    key: the copy's name the rank units use; keep: copies units still name (not removed);
    headroom: the capacity rule's (capacity.STAGE_HEADROOM), which the script applies."""
    argv = [python, script, "stage", source_dir, stage_dir, slug, "--mode", mode]
    argv += ["--verify", verify]
    if key is not None:
        argv += ["--key", key]
    for kept in keep:
        argv += ["--keep", kept]
    if group is not None:
        argv += ["--group", group]  # root:GROUP 0750/0640: the servers read it, nobody else
    if bwlimit_mbps:
        argv += ["--bwlimit-mbps", f"{bwlimit_mbps:g}"]
    argv += ["--headroom", f"{headroom:g}"]
    return argv


def stage_unit_text(settings: Settings, key: str | None) -> str:
    argv = stage_command(
        settings.source.target_dir,
        settings.model_stage_dir,
        layout.model_slug(settings),
        "auto",  # at boot no rank runs yet: in place is safe when beside does not fit
        "manifest",
        settings.model_stage_bwlimit_mbps,
        python=layout.SYSTEM_PYTHON,
        key=key,
        group=settings.service_user,
    )
    return units.stage_unit(settings, argv)


@dataclass(frozen=True)
class SyncPlan:
    """rsync of a controller source into the target's persistent cache."""

    local_dir: str
    target_dir: str
    local_digest: str
    local_bytes: int
    target_digest: str | None

    @property
    def needed(self) -> bool:
        return self.target_digest != self.local_digest


@dataclass(frozen=True)
class HubPlan:
    """A hub source's one download, with the CLI that makes it."""

    cli: str
    # Whether the CLI is there (asked only while the download is to do; None: not asked).
    cli_installed: bool | None
    requirements: str
    repo: str
    revision: str
    dest: str
    downloaded_revision: str | None
    # The root-only token file (the controller's HF_TOKEN), None for a public repository.
    token: PlannedFile | None

    @property
    def download(self) -> bool:
        return self.downloaded_revision != self.revision

    @property
    def install_cli(self) -> bool:
        return self.download and not self.cli_installed


@dataclass(frozen=True)
class ModelPlan:
    script: PlannedFile
    unit: PlannedFile
    enabled_now: str | None
    sync: SyncPlan | None
    hub: HubPlan | None
    # The model step makes the service user (the engine step does when it builds the engine).
    make_user: bool
    user: str
    user_exists: bool
    stage: StageDecision
    key: str | None
    files: tuple[PlannedFile, ...] = field(default=())

    def to_json(self) -> ModelStepJson:
        hub = self.hub
        return {
            "source": "hf" if hub else "controller" if self.sync else "target",
            "sync": self.sync.needed if self.sync else False,
            "hub_cli": hub.install_cli if hub else False,
            "download": hub.download if hub else False,
            "make_user": self.make_user and not self.user_exists,
            "enable_stage_unit": self.enabled_now != "enabled",
            "stage": self.stage.plan.mode,
            "units": [{"path": self.unit.path, "text": self.unit.text}],
            "files": [f.to_json() for f in self.files],
        }


def decide(
    settings: Settings,
    stage: StageDecision,
    key: str | None,
    digests: dict[str, str],
    enabled: dict[str, str],
    user_exists: bool,
    engine_installs: bool,
    python: str,
    controller: ControllerScan | None,
    hub_cli_installed: bool | None,
    hub_token: str | None,
) -> ModelPlan:
    s, source = settings, settings.source
    registry = {f.path: f for f in layout.managed_files(s)}
    script = planned("staging script", registry[layout.STAGE_SCRIPT], script_text(), digests)
    unit_text = stage_unit_text(s, key)
    unit_entry = registry[layout.unit_path(STAGE_UNIT)]
    unit = planned("stage-at-boot unit", unit_entry, unit_text, digests, shown=True)
    files = [script, unit]
    staging = stage.staging
    sync = None
    if source.kind == "controller" and source.controller_dir is not None:
        # A refused scan never gets here: the staging decision refused the host.
        assert controller is not None and controller.digest is not None
        sync = SyncPlan(
            source.controller_dir,
            source.target_dir,
            controller.digest,
            controller.bytes or 0,
            staging.source.digest if staging is not None and staging.source else None,
        )
    hub = None
    if source.kind == "hf" and source.repo and source.revision:
        done = staging.hub_revision if staging is not None else None
        token = None
        if hub_token and done != source.revision:
            entry = registry[HUB_TOKEN_FILE]
            token = PlannedFile(
                entry.path, hub_token, entry.mode, secret=True, dir_mode=entry.dir_mode
            )
        hub = HubPlan(
            s.model_hub_cli,
            hub_cli_installed,
            hub_requirements(python),
            source.repo,
            source.revision,
            source.target_dir,
            done,
            token,
        )
        if hub.install_cli:
            files.append(PlannedFile(layout.hub_cli_requirements(hub.cli), hub.requirements))
        if token is not None:
            files.append(token)
    return ModelPlan(
        script=script,
        unit=unit,
        enabled_now=enabled.get(STAGE_UNIT),
        sync=sync,
        hub=hub,
        make_user=not engine_installs,
        user=s.service_user,
        user_exists=user_exists,
        stage=stage,
        key=key,
        files=tuple(files),
    )
