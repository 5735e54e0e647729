"""What the plan makes of the rank units the ServingState fact read (operations/facts/serve.py):
whether a running process runs what its unit file says now, which ranks a crash-restart or a
reboot would start, and which engine environments and model copies those unit files name (what
the prunes keep). Pure: the fact's values in, decisions out.
"""

from __future__ import annotations

from operations import layout
from operations.facts.serve import Serving, UnitState


def pending_restart(unit: UnitState, inputs_changed_at: int | None = None) -> str | None:
    """Why the unit's running process does not run what its unit file says now, or None: the
    file changed after the process started (ExecMainStartTimestamp, which systemd sets when it
    forks the main process: systemd.exec(5), org.freedesktop.systemd1(5)), or systemd was not
    even reloaded. `inputs_changed_at`: when a file the process reads only at start (the API
    key file) last changed. A kill between a unit's write and its restart leaves exactly this
    (issue 31). Seconds: a file written in the second the process started counts as read by it
    (the roll writes before it restarts)."""
    if not unit.running or unit.started_at is None:
        return None
    if unit.need_reload:
        return "its unit file changed and systemd was not reloaded"
    if unit.changed_at is not None and unit.changed_at > unit.started_at:
        return "its unit file changed after the process started"
    if inputs_changed_at is not None and inputs_changed_at > unit.started_at:
        return "the API key file changed after the process started"
    return None


def rank_pending_restart(serving: Serving, rank: int) -> str | None:
    """Why rank's process does not run what its unit file (and the key file) say now."""
    unit = serving.ranks.get(rank)
    if unit is None:
        return None
    return pending_restart(unit, serving.changed_at.get(layout.SECRETS_FILE))


def rank_files(serving: Serving) -> dict[int, UnitState]:
    """Ranks that have a unit file: what a crash-restart or a reboot runs."""
    return {rank: unit for rank, unit in serving.ranks.items() if unit.unit_sha256 is not None}


def referenced_envs(serving: Serving) -> set[str]:
    """Engine environment directories named by the host's rank unit files now. The engine's
    prune keeps these: a rank that was not rolled yet (or a failed roll) still runs one."""
    return {env for u in rank_files(serving).values() if (env := u.engine_env()) is not None}


def referenced_env_names(serving: Serving, engine_root: str) -> set[str]:
    """The names (ENGINE_ROOT/envs/<name>) of the environments the rank unit files name now:
    what the engine's prune must keep besides its own choice."""
    tree = layout.EngineTree(engine_root)
    return {name for env in referenced_envs(serving) if (name := tree.name_of(env)) is not None}


def referenced_models(serving: Serving) -> set[str]:
    """Staged model copies named by the host's rank unit files now."""
    return {path for u in rank_files(serving).values() if (path := u.model_path()) is not None}
