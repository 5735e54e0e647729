"""Step 3: the model's weights staged in /dev/shm, where eight servers load them at memory speed.

The copy itself is one script, operations/files/stage_model.py, run by the deploy (with live
progress) and by the boot unit sglang-stage-model.service (after every restart /dev/shm is
empty). Whether and how it runs was decided before any change (operations/staging.py, carried
in the HostReport); this module carries it out:

  source   -> a persistent directory on the target (rsync from the controller or the hub's CLI;
              a target directory is used as it is)
  stage    -> unchanged (a no-op that never reads the weights), beside the current copy, in
              place with the servers stopped, or refused with the numbers
Docs: docs/model.md.
"""

from __future__ import annotations

import os
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
from pyinfra.facts.files import File
from pyinfra.operations import files, systemd

from operations import layout, units
from operations.engine import installs as engine_installs
from operations.facts.model import script_module, script_text
from operations.host_call import Commands, HostCall, run
from operations.host_files import put_file
from operations.host_plan import HostReport
from operations.layout import CONFIG_DIR, STAGE_UNIT
from operations.pins import hub_requirements
from operations.preflight import STAGE_HEADROOM
from operations.serve import service_user
from operations.settings import Settings

SCRIPT_DEST = layout.STAGE_SCRIPT
UNIT_PATH = layout.unit_path(STAGE_UNIT)
# Root-only, and only for the length of one download: the token never lands in a unit file.
TOKEN_DIR = f"{CONFIG_DIR}/hub"
TOKEN_FILE = f"{TOKEN_DIR}/token"
TOKEN_ENV = "HF_TOKEN"
HUB_REQUIREMENT = "huggingface_hub>=0.34,<2"  # 0.34 introduced the `hf` command
STAGE_TIMEOUT_S = 3600
# Ranks the in-place swap stops; the serve step starts them again (the model changed).
RANK_UNITS = (layout.TARGET, layout.RANK_UNIT_GLOB)


def _python(report: HostReport) -> str:
    """The host's python3 minor, as the plan read it (the engine is locked for it)."""
    if report.plan.engine is None:
        raise OperationError("the model step needs the plan's engine (host_plan)")
    return report.plan.engine.python


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


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


def stage_command(
    source_dir: str,
    stage_dir: str,
    slug: str,
    mode: str,
    verify: str,
    bwlimit_mbps: float | None,
    python: str = "python3",
    script: str = SCRIPT_DEST,
    key: str | None = None,
    keep: tuple[str, ...] = (),
    group: str | None = None,
    headroom: float = STAGE_HEADROOM,
) -> list[str]:
    """The one command line of a staging run: the deploy and the boot unit both use it.
    key: the copy's name the rank units use; keep: copies units still name (not removed);
    headroom: the capacity rule's (preflight.STAGE_HEADROOM), which the script applies."""
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


@operation(is_idempotent=False)
def staged(
    source_dir: str,
    stage_dir: str,
    slug: str,
    mode: str,
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
def hub_cli(cli: str, requirements: str) -> Commands:
    """
    The Hugging Face CLI at `cli`, installed into its own venv when missing: exactly the
    pinned wheels, hashes checked (`--require-hashes --only-binary :all:`), kept beside it as
    VENV/requirements.txt.

    + cli: the path of the `hf` command (model_hub_cli)
    + requirements: the pinned requirements with hashes (operations/pins hub_requirements)
    """
    if host.get_fact(File, path=cli):
        host.noop(f"{cli} is installed")
        return
    venv = os.path.dirname(os.path.dirname(cli))
    pinned = f"{venv}/requirements.txt"
    yield StringCommand("python3", "-m", "venv", QuoteString(venv))
    yield from put_file._inner(src=requirements, dest=pinned, sha256_now=None)
    yield StringCommand(
        QuoteString(f"{venv}/bin/pip"),
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


def stage_unit_text(settings: Settings, key: str | None) -> str:
    argv = stage_command(
        settings.source.target_dir,
        settings.model_stage_dir,
        slug_of(settings),
        "auto",  # at boot no rank runs yet: in place is safe when beside does not fit
        "manifest",
        settings.model_stage_bwlimit_mbps,
        python=layout.SYSTEM_PYTHON,
        key=key,
        group=settings.service_user,
    )
    return units.stage_unit(settings, argv)


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
    source = s.source
    slug = slug_of(s)
    # Decided in the plan (host_plan): the copy's key the rank units name, and the fact read.
    key = report.model_key
    serving = report.serving
    if serving is None:
        raise OperationError("the model step needs the plan's ServingState fact (host_plan)")
    put_file(
        name="staging script",
        src=script_text(),
        dest=SCRIPT_DEST,
        mode="755",
        sha256_now=serving.files.get(SCRIPT_DEST),
    )
    unit = put_file(
        name="stage-at-boot unit",
        src=stage_unit_text(s, key),
        dest=UNIT_PATH,
        sha256_now=serving.files.get(UNIT_PATH),
    )
    systemd.daemon_reload(name="reload systemd", _if=unit.did_change)
    enabled_at_boot(
        name="enable the stage unit",
        unit=STAGE_UNIT,
        now=serving.enabled.get(STAGE_UNIT),
    )

    # Decided once, before any change (operations/staging.py); carried out here.
    # A refused decision never gets here: it is one of the host's errors, and the gate stops it.
    decision = report.staging
    if decision is None or decision.refused:
        raise OperationError("the model step needs an accepted staging decision (host_plan)")
    staging = decision.staging
    if source.kind == "controller" and source.controller_dir is not None:
        local = script_module().scan(source.controller_dir)
        cached = staging.source.digest if staging is not None and staging.source else None
        synced_from_controller(
            name=f"sync from the controller ({_gib(local['bytes'])})",
            local_dir=source.controller_dir,
            target_dir=source.target_dir,
            local_digest=local["digest"],
            target_digest=cached,
        )
    elif source.kind == "hf" and source.repo and source.revision:
        done = staging.hub_revision if staging is not None else None
        if done != source.revision:
            hub_cli(
                name="Hugging Face CLI",
                cli=s.model_hub_cli,
                requirements=hub_requirements(_python(report)),
            )
        token = os.environ.get(TOKEN_ENV)
        if token and done != source.revision:
            put_file(
                name="hub token (root only)",
                src=token,
                dest=TOKEN_FILE,
                mode="600",
                dir_mode="700",
                secret=True,
            )
        fetched_from_hub(
            name="hub download (once)",
            cli=s.model_hub_cli,
            repo=source.repo,
            revision=source.revision,
            dest=source.target_dir,
            downloaded_revision=done,
            token_file=TOKEN_FILE if token else None,
        )

    # The staged copy is readable by the servers' group only: the user exists before it
    # (made by the engine step, before its check, when this run builds the engine).
    if not engine_installs(report):
        service_user(
            name=f"service user {s.service_user}",
            user=s.service_user,
            exists=serving.user_exists,
        )
    plan = decision.plan
    logger.info(f"{host.print_prefix}model {s.model_name}: {plan.mode}: {plan.why}")
    staged(
        name=f"stage the copy ({plan.mode})",
        source_dir=source.target_dir,
        stage_dir=s.model_stage_dir,
        slug=slug,
        mode=plan.mode,
        why=plan.why,
        verify=s.model_verify,
        bwlimit_mbps=s.model_stage_bwlimit_mbps,
        key=key,
        keep=decision.keep_keys,
        group=s.service_user,
    )


# @deploy types every call as returning OperationMeta; this step returns nothing (a rank
# restarts when its unit, which names the staged copy by path, changes: roll.py).
stage_model = cast(Callable[[HostReport], None], _stage_model)
