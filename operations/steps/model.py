"""Step 3: the model's weights staged in /dev/shm, where eight servers load them at memory speed.

The copy itself is one script, operations/programs/stage_model.py, run by the deploy (with live
progress) and by the boot unit sglang-stage-model.service (after every restart /dev/shm is
empty). Whether and how it runs was decided before any change (operations/plan/staging.py and
operations/plan/model_plan.py: the ModelPlan carried in the HostReport, every file and the stage
unit's text included); this module carries it out, asking no fact:

  source   -> a persistent directory on the target (rsync from the controller or the hub's CLI;
              a target directory is used as it is)
  stage    -> unchanged (a no-op that never reads the weights), beside the current copy, in
              place with the servers stopped, or refused with the numbers
Docs: docs/how-it-works/model.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import cast

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host
from pyinfra.operations import files, systemd

from operations import layout
from operations.layout import STAGE_UNIT
from operations.plan.capacity import gib
from operations.plan.host_plan import HostReport

# Where they have always been imported from (the plan renders the unit: model_plan.py).
from operations.plan.model_plan import stage_command
from operations.plan.vocabulary import StageMode
from operations.runtime.host_call import Commands, HostCall, run
from operations.runtime.host_lines import host_text
from operations.settings import Settings
from operations.steps.host_files import new_file, put_planned
from operations.steps.users import service_user

SCRIPT_DEST = layout.STAGE_SCRIPT
UNIT_PATH = layout.unit_path(STAGE_UNIT)
HUB_REQUIREMENT = "huggingface_hub>=0.34,<2"  # 0.34 introduced the `hf` command
# Ranks the in-place swap stops; the serve step starts them again (the model changed).
RANK_UNITS = (layout.TARGET, layout.RANK_UNIT_GLOB)


# ------------------------------------------------------------------------------ operations


def _run_live(
    state: State, host: Host, arguments: ConnectorArguments, command: str, what: str
) -> bool:
    """Run on the target and print its output as it comes (the copy's progress lines), with
    the operation's connector arguments: through sudo when the host says `_sudo`."""
    ok, output = run(host, arguments, command, print_output=True)
    if not ok:
        last = output.stderr_lines[-1] if output.stderr_lines else "no message"
        logger.error(f"{host.print_prefix}{what} failed: {last}")
    return bool(ok)


@operation(is_idempotent=False)
def staged(
    source_dir: str,
    stage_dir: str,
    slug: str,
    mode: StageMode,
    why: str,
    verify: str = "manifest",
    bwlimit_mbps: float | None = None,
    key: str | None = None,
    keep: list[str] | None = None,
    group: str | None = None,
) -> Commands:
    """
    Make STAGE_DIR/models/.SLUG@KEY a complete copy of source_dir (what staging.decide planned).

    + mode: "unchanged" (no-op), "beside" or "inplace" (the ranks are stopped first)
    + why: the plan's sentence, printed for a no-op
    + verify: "manifest" or "full" (re-hash the copy before switching to it)
    + bwlimit_mbps: cap the copy rate (MB/s), None for full speed
    + key: the copy's name, as the rank units name it (None: its digest)
    + keep: keys of copies a rank unit still names: not removed
    + group: the servers' group, the only one that may read the copy (None: world-readable)
    """
    if mode == "unchanged":
        host.noop(why)
        return
    if mode not in ("beside", "inplace"):
        raise OperationError(f"unknown staging mode {mode!r}")
    if mode == "inplace":
        yield StringCommand("systemctl", "stop", *(QuoteString(u) for u in RANK_UNITS))
    argv = stage_command(
        source_dir,
        stage_dir,
        slug,
        mode,
        verify,
        bwlimit_mbps,
        key=key,
        keep=tuple(keep or ()),
        group=group,
    )
    yield HostCall(_run_live, (shlex.join(argv), "staging the model"), {})


# Root-only like the hub cache: only the staging run reads it. --copy-links: every link in
# the controller's directory was checked by the link rule in the scan that gave local_digest
# (stage_manifest.py: refused unless it resolves inside the source, or a hub snapshot's
# repository folder, to a regular file), so rsync sends what each resolves to as a regular
# file, with its size and mtime (what the digest keys on: the target's scan agrees with it).
# Not --copy-unsafe-links (it copies the referent of a link that leaves the tree: a root-only
# file too) nor --safe-links (it drops those: a hub snapshot's every link into ../../blobs/).
SYNC_FLAGS = [
    *("-a", "--copy-links", "--delete", "--chmod=D750,F640", "--partial-dir=.rsync-partial"),
    "--info=progress2",
]


@operation(is_idempotent=False)
def synced_from_controller(
    local_dir: str, target_dir: str, local_digest: str, target_digest: str | None
) -> Commands:
    """
    rsync a model directory from the controller into the target's persistent cache.

    + local_dir: the directory on the controller
    + target_dir: where it is kept on the target (model_cache_dir/controller/NAME)
    + local_digest: the controller copy's manifest digest
    + target_digest: the cache's manifest digest (ModelStaging of target_dir), None if absent
    """
    if target_digest == local_digest:
        host.noop(f"{target_dir} matches {local_dir} (manifest {local_digest})")
        return
    yield StringCommand("mkdir", "-p", QuoteString(target_dir))
    # The host's own SSH settings (user, port, key, known hosts): pyinfra builds the --rsh.
    yield from files.rsync._inner(
        src=local_dir.rstrip("/") + "/",
        dest=target_dir.rstrip("/") + "/",
        flags=SYNC_FLAGS,
    )


@operation(is_idempotent=False)
def hub_cli(cli: str, requirements: str, installed: bool) -> Commands:
    """
    The Hugging Face CLI at `cli`, installed into its own venv when missing: exactly the
    pinned wheels, hashes checked (`--require-hashes --only-binary :all:`), kept beside it as
    VENV/requirements.txt.

    + cli: the path of the `hf` command (model_hub_cli)
    + requirements: the pinned requirements with hashes (operations/kb/pins hub_requirements)
    + installed: whether `cli` is there (the plan's File fact)
    """
    if installed:
        host.noop(f"{cli} is installed")
        return
    pinned = layout.hub_cli_requirements(cli)
    yield StringCommand("python3", "-m", "venv", QuoteString(layout.hub_cli_venv(cli)))
    yield from new_file(requirements, pinned)
    yield StringCommand(
        QuoteString(layout.hub_cli_pip(cli)),
        "install",
        "-q",
        "--disable-pip-version-check",
        "--require-hashes",
        "--only-binary",
        ":all:",
        "-r",
        QuoteString(pinned),
    )


@operation(is_idempotent=False)
def fetched_from_hub(
    cli: str,
    repo: str,
    revision: str,
    dest: str,
    downloaded_revision: str | None,
    token_file: str | None = None,
) -> Commands:
    """
    Download repo@revision once into dest with the hub's CLI. The token (the controller's
    HF_TOKEN) was written by put_file(secret=True) to token_file, root-only, and is removed
    right after the download: it is never in argv, a log or a diff.

    + downloaded_revision: what the download marker in dest says (ModelStaging.hub_revision)
    + token_file: the root-only file holding the token, None for a public repository
    """
    if downloaded_revision == revision:
        host.noop(f"{repo}@{revision} is downloaded in {dest}")
        return
    argv = [
        *("python3", SCRIPT_DEST, "fetch-hub", "--cli", cli, "--repo", repo),
        *("--revision", revision, "--dest", dest),
    ]
    if token_file:
        argv += ["--token-file", token_file]
    command = shlex.join(argv)
    # The token file goes whatever the download's outcome; the exit status is the download's.
    wrapped = (
        f"{command}; rc=$?; rm -f {shlex.quote(token_file)}; exit $rc" if token_file else command
    )
    yield HostCall(_run_live, (wrapped, "downloading from the hub"), {})


# ------------------------------------------------------------------------------ the step


def slug_of(settings: Settings) -> str:
    return layout.model_slug(settings)


@operation()
def enabled_at_boot(unit: str, now: str | None) -> Commands:
    """
    Enable a unit at boot (`systemctl enable`), unless it is already.

    + unit: the unit's name
    + now: `systemctl is-enabled` as the ServingState fact read it (None: not asked)
    """
    if now == "enabled":
        host.noop(f"{unit} is enabled")
        return
    yield StringCommand("systemctl", "enable", QuoteString(unit))


@deploy("Model")
def _stage_model(report: HostReport) -> None:
    s = report.settings
    # Decided in the plan (host_plan, model_plan.py): every file, the unit, the source's
    # fetch and the staging; carried out here.
    plan = report.model_step
    if plan is None:
        raise OperationError("the model step needs the plan's model step (host_plan)")
    put_planned(plan.script)
    unit = put_planned(plan.unit)
    if plan.unit.changes is not False:  # the plan read the unit and it is the plan's: no reload
        systemd.daemon_reload(name="reload systemd", _if=unit.did_change)
    enabled_at_boot(name="enable the stage unit", unit=STAGE_UNIT, now=plan.enabled_now)

    if plan.sync is not None:
        sync = plan.sync
        synced_from_controller(
            name=f"sync from the controller ({gib(sync.local_bytes)})",
            local_dir=sync.local_dir,
            target_dir=sync.target_dir,
            local_digest=sync.local_digest,
            target_digest=sync.target_digest,
        )
    elif plan.hub is not None:
        hub = plan.hub
        if hub.download:
            hub_cli(
                name="Hugging Face CLI",
                cli=hub.cli,
                requirements=hub.requirements,
                installed=not hub.install_cli,
            )
        if hub.token is not None:
            put_planned(hub.token, name="hub token (root only)")
        fetched_from_hub(
            name="hub download (once)",
            cli=hub.cli,
            repo=hub.repo,
            revision=hub.revision,
            dest=hub.dest,
            downloaded_revision=hub.downloaded_revision,
            token_file=hub.token.path if hub.token is not None else None,
        )

    # The staged copy is readable by the servers' group only: the user exists before it
    # (made by the engine step, before its check, when this run builds the engine).
    if plan.make_user:
        service_user(name=f"service user {plan.user}", user=plan.user, make=not plan.user_exists)
    stage = plan.stage.plan
    logger.info(host_text(host, f"model {s.model_name}: {stage.mode}: {stage.why}"))
    staged(
        name=f"stage the copy ({stage.mode})",
        source_dir=s.source.target_dir,
        stage_dir=s.model_stage_dir,
        slug=slug_of(s),
        mode=stage.mode,
        why=stage.why,
        verify=s.model_verify,
        bwlimit_mbps=s.model_stage_bwlimit_mbps,
        key=plan.key,
        keep=plan.stage.keep_keys,
        group=s.service_user,
    )


# @deploy types every call as returning OperationMeta; this step returns nothing (a rank
# restarts when its unit, which names the staged copy by path, changes: plan/serve_plan.py).
stage_model = cast(Callable[[HostReport], None], _stage_model)
