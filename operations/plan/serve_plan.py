"""What the serve and smoke steps do, decided in the plan from the ServingState fact.

host_plan.decide calls `serve_plan` once per host; the HostReport carries the ServePlan, the plan
command shows it (`python -m operations.plan --json`: "serve"), and operations/steps/serve.py and
operations/steps/smoke.py carry it out without deciding again:

- ranks that are not serving start together (`RollPlan.start`);
- a serving rank restarts when and only when its own unit file changes, or the API key file
  the ranks read changes (`secret_changed`): in batches of `restart_batch_size`;
- ranks beyond `dp_size` are removed;
- the router (re)starts when its environment is not installed, its unit changed or it is not
  active (`router_restart`);
- a chat request goes to each rank this run (re)starts and, when anything (re)started, through
  the router: behind a router each rolled batch is asked before it rejoins (`batch_smoke`), the
  rest after the serve step (`smoke`);
- once every batch is healthy, staged copies no unit names any more go (`prune_doomed`);
- every file the two steps write, with its content, the digest the ServingState fact read and
  its registry entry's mode and owners (`files`, `rank_units`, `smoke_files`,
  `control_plane_key`, and the router's `RouterStep`): the steps hand each to
  `host_files.put_planned` and read no fact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from operations import layout
from operations.facts.canary import Canary
from operations.facts.serve import Serving
from operations.kb.pins import PinError, router_requirements
from operations.plan import rank_state
from operations.plan.canary_plan import CanaryPlan, canary_plan
from operations.plan.drain import DrainPlan
from operations.plan.engine_spec import tools_uv_config
from operations.plan.monitoring import MonitoringPlan
from operations.plan.planned_files import PlannedFile, sha256
from operations.plan.resolver import Rank, RouterPlan
from operations.plan.resolver.router import control_key_text
from operations.plan.resolver.router import key_changes as router_key_changes
from operations.plan.router_step import RouterOrder, RouterStep, router_change, router_order
from operations.plan.serve_files import Writer, rank_units, serve_files_of
from operations.plan.smoke_plan import SmokeRequests, smoke_json, smoke_requests_of
from operations.plan.startup import RANK_SILENCE_S, startup_patterns
from operations.plan.vocabulary import FileJson, ServeJson
from operations.render.host_scripts import script_text
from operations.settings import Settings


def batches(ranks: Sequence[Rank], size: int) -> list[list[Rank]]:
    return [list(ranks[i : i + size]) for i in range(0, len(ranks), size)]


@dataclass(frozen=True)
class RollPlan:
    """What the serve step does to the ranks, decided from the fact alone."""

    # Not serving now: their (new) units are written and they start together.
    start: list[Rank] = field(default_factory=list)
    # Serving, and their unit changed: rewritten and restarted, one batch at a time.
    batches: list[list[Rank]] = field(default_factory=list)
    # Beyond dp_size: stopped, disabled, removed.
    remove: list[int] = field(default_factory=list)
    # Serving and unchanged: not touched.
    unchanged: list[Rank] = field(default_factory=list)
    # Rolled although their unit file is what the plan says: the running process does not run
    # it (a deploy killed between a unit's write and its restart), rank -> why.
    pending: dict[int, str] = field(default_factory=dict)
    # Serving, their unit changed, and not rolled this run: a canary rollout holds them back
    # (paused, refused, or rolling back; canary_plan.py).
    held: list[Rank] = field(default_factory=list)
    # Not serving, and a canary has no passed verdict yet (canary_plan.py): started after this
    # run's verdict passes (`start_after`), or not started this run (`stopped`).
    start_after: list[Rank] = field(default_factory=list)
    stopped: list[Rank] = field(default_factory=list)

    @property
    def rolled(self) -> list[Rank]:
        return [rank for batch in self.batches for rank in batch]


def roll_plan(
    ranks: Sequence[Rank], serving: Serving, batch_size: int, secret_changed: bool = False
) -> RollPlan:
    """Which ranks start, which restart in which batches, which go.

    A rank's unit file names its engine environment and model copy, so "what it runs changed"
    is "its unit text changed": nothing is inferred from links or times. After a roll that
    stopped at a failed batch (or a reboot in the middle of one) the fact shows the rolled
    ranks' files already new and the others old, so a re-run rolls exactly the rest.
    `secret_changed`: the API key file the ranks read with --config changed: all restart.
    A file on disk is what *will* run; a rank whose process started before its unit file (or
    the key file) last changed, or whose unit systemd has not reloaded, is "pending restart"
    (`rank_state.rank_pending_restart`) and rolls in the same drained, health-gated batches.
    """
    plan = RollPlan(remove=sorted(set(rank_state.rank_files(serving)) - {r.rank for r in ranks}))
    restart: list[Rank] = []
    for rank in ranks:
        now = serving.ranks.get(rank.rank)
        if now is None or not now.running:
            plan.start.append(rank)
        elif now.unit_sha256 != sha256(rank.unit) or secret_changed:
            restart.append(rank)
        elif (why := rank_state.rank_pending_restart(serving, rank.rank)) is not None:
            plan.pending[rank.rank] = why
            restart.append(rank)
        else:
            plan.unchanged.append(rank)
    plan.batches.extend(batches(restart, max(1, batch_size)))
    return plan


def staged_roll(roll: RollPlan, canary: CanaryPlan | None, batch_size: int) -> RollPlan:
    """Today's roll in the canary's order: the canary batch first (a stopped canary rank
    among it), then the rest in today's batches when they roll this run; the others are held.
    Ranks not serving start after the verdict or stay stopped, as the canary says. No canary:
    the roll unchanged."""
    if canary is None or canary.stage is None:
        return roll
    by_rank = {r.rank: r for r in (*roll.rolled, *roll.start)}
    order = [canary.canary_batch] if canary.canary_batch else []
    if canary.rolls_rest:
        order += canary.rest
    staged = [[by_rank[n] for n in batch if n in by_rank] for batch in order]
    staged = [batch for batch in staged if batch]
    rolled = {r.rank for batch in staged for r in batch}
    held = [r for r in roll.rolled if r.rank not in rolled]
    later, stopped = set(canary.start_after), set(canary.stopped)
    # A failed canary rank is put back by the rollback (or the host refused): never started.
    failed = set(canary.canary) if canary.stage in ("rollback", "refused") else set()
    return replace(
        roll,
        batches=staged,
        held=held,
        start=[r for r in roll.start if r.rank not in rolled | later | stopped | failed],
        start_after=[r for r in roll.start if r.rank in later],
        stopped=[r for r in roll.start if r.rank in stopped],
    )


def secrets_text(settings: Settings) -> str | None:
    """The options file that carries the API key, from the key the settings loader read; None
    when no key is configured or it could not be read (settings.controller_problems refuses
    that before any plan)."""
    read = settings.controller_files.api_key
    key = read.key if settings.api_key_file and read is not None else None
    if not key:
        return None
    # JSON string syntax is valid YAML and escapes whatever the key holds.
    return f"api-key: {json.dumps(key)}\n"


def _unread_keys(settings: Settings) -> list[str]:
    """A key file the settings name whose text the loader does not hold: nothing about it is
    decided (settings.controller_problems names the reason)."""
    errors = []
    if settings.api_key_file and secrets_text(settings) is None:
        errors.append(f"api_key_file {settings.api_key_file!r}: no key was read from it")
    if settings.control_plane_key_file and control_key_text(settings) is None:
        errors.append(
            f"the router's control-plane key {settings.control_plane_key_file!r} "
            f"({settings.control_plane_key_origin()}): no key was read from it"
        )
    return errors


def router_restarts(serving: Serving, plan: RouterPlan, key_changes: bool = False) -> bool:
    """Whether the serve step (re)starts the router this run: its environment is not installed,
    its unit text is new, it is not active, or its control-plane key is written this run
    (`key_changes`, resolver/router.py)."""
    unit = serving.files.get(layout.unit_path(layout.ROUTER_UNIT))
    router = serving.router
    installed = layout.router_marker(plan.env_dir) in serving.files
    stale = unit != sha256(plan.unit) or key_changes
    if stale or router is None or router.active != "active" or not installed:
        return True
    return rank_state.pending_restart(router) is not None


@dataclass(frozen=True)
class KeySource:
    """The controller's file of the router's control-plane key: its path (never its content),
    and whether this run made it (settings/controller_files.make_key)."""

    path: str
    made: bool


def key_source(s: Settings) -> KeySource | None:
    read = s.controller_files.control_plane_key
    if s.control_plane_key_file is None or read is None:
        return None
    return KeySource(s.control_plane_key_file, read.made)


@dataclass(frozen=True)
class ServePlan:
    """Everything the serve and smoke steps act on (see the module's docstring)."""

    roll: RollPlan
    # The API key file's text (never shown); None: no key configured.
    secret: str | None = None
    secret_changed: bool = False
    # No key configured, and the host has a key file: it goes.
    remove_secret: bool = False
    router_restart: bool = False
    # Behind a router, with smoke requests on: one per rolled batch, asked before it rejoins.
    batch_smoke: list[SmokeRequests | None] = field(default_factory=list)
    # What the smoke step asks after the serve step.
    smoke: SmokeRequests = field(default_factory=SmokeRequests)
    # Keys of the staged copies the units name, and the copies (paths) that go after the roll.
    prune_keep: list[str] = field(default_factory=list)
    prune_doomed: list[str] = field(default_factory=list)
    # How a batch leaves and rejoins the router (None: not drain-protected).
    drain: DrainPlan | None = None
    # Serving, unchanged ranks the router does not list: an interrupted run took them out (a
    # drain) and never put them back. They rejoin (the drain script's `in`) with no restart.
    readmit: list[int] = field(default_factory=list)
    # The serve step's files, in the order it writes them (scripts, the API key file, the
    # target unit, the monitoring files), and whether the target unit is new.
    files: list[PlannedFile] = field(default_factory=list)
    target_changes: bool = False
    # Each rank's unit (for the ranks that start or roll: what the step writes).
    rank_units: dict[int, PlannedFile] = field(default_factory=dict)
    # The smoke step's (the request script, unless the serve step ships it for a batch).
    smoke_files: list[PlannedFile] = field(default_factory=list)
    # The router's control-plane key, when this run writes it (resolver/router.key_changes).
    control_plane_key: PlannedFile | None = None
    # Where that key is kept on the controller, and whether this run made it there.
    control_plane_key_source: KeySource | None = None
    # On the router's host.
    router: RouterStep | None = None
    # Whether the router's restart and the control-plane key come before the ranks roll.
    order: RouterOrder = field(default_factory=lambda: RouterOrder(False))
    # Why the plan cannot be carried out (a release with no pinned requirements).
    errors: list[str] = field(default_factory=list)
    # The release's start-up lines for the health wait (plan/startup.py), and how long a start
    # may write nothing before the wait fails it.
    startup_lines: str = ""
    silence_s: int = RANK_SILENCE_S
    # A canary rollout's stages (None: the plan was not given the CanaryState fact).
    canary: CanaryPlan | None = None

    def summary(self) -> str:
        """What this run does to the ranks, for the plan printed before any change."""

        def names(ranks: Sequence[Rank]) -> str:
            return ", ".join(str(r.rank) for r in ranks)

        plan = self.roll
        parts = []
        if plan.start:
            parts.append(f"start rank(s) {names(plan.start)} together")
        if plan.batches:
            order = " then ".join(f"[{names(b)}]" for b in plan.batches)
            drained = (
                f", each drained through the router first (up to {self.drain.timeout_s}s)"
                if self.drain is not None
                else " (not drain-protected: no router)"
            )
            why = "unit changed"
            if plan.pending:
                pending = ", ".join(f"{r}: {w}" for r, w in sorted(plan.pending.items()))
                why = f"unit changed or pending restart ({pending})"
            parts.append(f"restart ({why}) in batches {order}{drained}")
        if self.canary is not None and self.canary.stage is not None:
            parts.append(self.canary.summary())
        if plan.held:
            parts.append(f"hold rank(s) {names(plan.held)} on their old units (canary)")
        if plan.remove:
            parts.append(f"stop and remove rank(s) {', '.join(map(str, plan.remove))}")
        if self.router is not None and self.router.restart:
            parts.append(router_change(self.router).value)
        if self.order.said and (plan.batches or self.router is not None):
            parts.append(self.order.said)
        if self.readmit:
            parts.append(
                f"put rank(s) {', '.join(map(str, self.readmit))} back into the router "
                "(an earlier run took them out and did not finish)"
            )
        return "; ".join(parts) or "every rank runs what the plan says: nothing to restart"

    def to_json(self) -> ServeJson:
        def numbers(ranks: Sequence[Rank]) -> list[int]:
            return [r.rank for r in ranks]

        return {
            "start": numbers(self.roll.start),
            "batches": [numbers(b) for b in self.roll.batches],
            "remove": self.roll.remove,
            "unchanged": numbers(self.roll.unchanged),
            "start_after": numbers(self.roll.start_after),
            "stopped": numbers(self.roll.stopped),
            "pending": {str(r): why for r, why in sorted(self.roll.pending.items())},
            "readmit": self.readmit,
            "secret_changed": self.secret_changed,
            "remove_secret": self.remove_secret,
            "router_restart": self.router_restart,
            "batch_smoke": [smoke_json(b) if b else None for b in self.batch_smoke],
            "smoke": smoke_json(self.smoke),
            "prune_keep": self.prune_keep,
            "prune_doomed": self.prune_doomed,
            "summary": self.summary(),
            "files": _files_json(self.files),
            "smoke_files": _files_json(self.smoke_files),
            "rank_units": _files_json([self.rank_units[r] for r in sorted(self.rank_units)]),
            "control_plane_key": (
                self.control_plane_key.to_json() if self.control_plane_key else None
            ),
            "control_plane_key_source": (
                {
                    "path": self.control_plane_key_source.path,
                    "made": self.control_plane_key_source.made,
                }
                if self.control_plane_key_source is not None
                else None
            ),
            "router_step": self.router.to_json() if self.router is not None else None,
            "router_first": self.order.first,
            "canary": self.canary.to_json() if self.canary is not None else None,
        }


def _files_json(files: Sequence[PlannedFile]) -> list[FileJson]:
    return [f.to_json() for f in files]


def serve_plan(
    settings: Settings,
    ranks: Sequence[Rank],
    serving: Serving,
    router: RouterPlan | None,
    drain: DrainPlan | None,
    watched: MonitoringPlan | None = None,
    python_minor: str | None = None,
    canary_state: Canary | None = None,
    target: str = "",
) -> ServePlan:
    """The serve and smoke steps' decisions for this host (router: set on the router's host;
    watched: the monitoring files; python_minor: the host's python3, "3.11", the router's;
    canary_state: the CanaryState fact, and target the ranks' flags digest, for a canary
    rollout: None, none is decided). Each part is decided by its own function: the roll and
    the canary (`rolled`), the router's restart, the smoke requests (`smoke_requests_of`), the
    copies pruned (`pruned`), the router's step and order (`router_part`), the files."""
    s = settings
    # What the fact read of every file these steps write, handed to planned_files once.
    write = Writer(s, file_digests(serving))
    secret = secrets_text(s)
    secret_changed = secret is not None and serving.files.get(layout.SECRETS_FILE) != sha256(secret)
    roll, canary = rolled(s, ranks, serving, drain, secret_changed, canary_state, target)
    # Whether this run writes the control-plane key here: decided once, for the key and the
    # router's restart.
    key_due = router_key_changes(s, serving.files)
    # smg holds the ranks' API key too (render/units.router_unit): a new key restarts it.
    holds_key = router is not None and router.package == "smg" and secret_changed
    router_restart = router is not None and router_restarts(serving, router, key_due or holds_key)
    started = [*roll.start, *roll.rolled, *roll.start_after]
    batch_smoke, smoke = smoke_requests_of(
        s, ranks, roll.batches, started, roll.rolled, router, drain, router_restart
    )
    keys, doomed = pruned(s, ranks, serving, roll)
    remove_secret = not s.api_key_file and layout.SECRETS_FILE in serving.files
    errors = _unread_keys(s) + (canary.errors if canary is not None else [])
    router_step, order = router_part(
        write,
        router,
        router_restart,
        python_minor,
        serving,
        key_due,
        secret_changed or remove_secret,
        errors,
    )
    if order.refused and roll.batches:
        errors.append(order.refused)
    rolls = bool(roll.batches) or (canary is not None and canary.stage == "rollback")
    compares = canary is not None and canary.compares
    serve_files, smoke_files = serve_files_of(
        write, secret, drain, any(batch_smoke), watched, rolls, compares
    )
    target_unit = layout.unit_path(layout.TARGET)
    return ServePlan(
        roll=roll,
        files=serve_files,
        target_changes=any(f.changes is not False for f in serve_files if f.path == target_unit),
        rank_units=rank_units(write, [*roll.start, *roll.rolled, *roll.start_after]),
        smoke_files=smoke_files,
        control_plane_key=_control_plane_key(write) if key_due else None,
        control_plane_key_source=key_source(s),
        router=router_step,
        errors=errors,
        readmit=left_out(roll, serving, drain),
        secret=secret,
        secret_changed=secret_changed,
        remove_secret=remove_secret,
        order=order,
        router_restart=router_restart,
        batch_smoke=batch_smoke,
        smoke=smoke,
        prune_keep=keys,
        prune_doomed=doomed,
        drain=drain,
        startup_lines=startup_patterns(s.sglang_version),
        canary=canary,
    )


def rolled(
    s: Settings,
    ranks: Sequence[Rank],
    serving: Serving,
    drain: DrainPlan | None,
    secret_changed: bool,
    canary_state: Canary | None,
    target: str,
) -> tuple[RollPlan, CanaryPlan | None]:
    """Today's roll, then in the canary's stages when the plan has the CanaryState fact."""
    roll = roll_plan(ranks, serving, s.restart_batch_size, secret_changed)
    if canary_state is None:
        return roll, None
    canary = canary_plan(
        s, roll.rolled, ranks, serving, canary_state, target, drain, start=roll.start
    )
    return staged_roll(roll, canary, s.restart_batch_size), canary


def pruned(
    s: Settings, ranks: Sequence[Rank], serving: Serving, roll: RollPlan
) -> tuple[list[str], list[str]]:
    """The keys of the staged copies the units name, and the copies that go after the roll."""
    keep = {r.model_path for r in ranks}
    keys = sorted(k for p in keep if (k := layout.copy_key(s, p)) is not None)
    if not keys:  # the ranks read the link (copy not known): nothing is named, nothing goes
        return keys, []
    if roll.held or roll.stopped:
        # A canary holds ranks on their old units (or stopped), which name the old copy:
        # nothing goes until every rank runs the new one.
        return keys, []
    present = rank_state.referenced_models(serving)
    if serving.model_target:
        present.add(layout.stage_tree(s).entry(serving.model_target))
    return keys, sorted(p for p in present - keep if layout.copy_key(s, p) is not None)


def router_part(
    write: Writer,
    router: RouterPlan | None,
    router_restart: bool,
    python_minor: str | None,
    serving: Serving,
    key_due: bool,
    ranks_key_changes: bool,
    errors: list[str],
) -> tuple[RouterStep | None, RouterOrder]:
    """The router's step on its host (a release with no pinned requirements: a line in
    `errors`), and whether it and its key come before the ranks roll (router_order)."""
    router_step = None
    if router is not None:
        try:
            router_step = _router_step(
                write, router, router_restart, python_minor, serving.router_envs
            )
        except PinError as e:
            errors.append(f"router version {router.version!r}: {e}")
    order = router_order(
        None
        if router is None
        else serving.router is not None and serving.router.active == "active",
        router_step is not None and bool(router_step.retired) and router_restart,
        key_due,
        ranks_key_changes,
    )
    return router_step, order


def left_out(roll: RollPlan, serving: Serving, drain: DrainPlan | None) -> list[int]:
    """Unchanged, serving ranks the router does not list (when this host could read its list):
    a run killed in a drain left them out. A rank being started or rolled rejoins anyway."""
    listed = serving.router_workers
    if drain is None or listed is None:
        return []
    return [r.rank for r in roll.unchanged if drain.worker(r.rank).rstrip("/") not in listed]


def file_digests(serving: Serving) -> dict[str, str]:
    """The sha256 the ServingState fact read of each file the serve and smoke steps write, by
    path: the managed files', and each rank unit's (read by glob)."""
    digests = dict(serving.files)
    for rank, unit in serving.ranks.items():
        if unit.unit_sha256 is not None:
            digests[layout.rank_unit_path(rank)] = unit.unit_sha256
    return digests


def _control_plane_key(write: Writer) -> PlannedFile:
    """The router's control-plane key on every host behind it, when this run writes it
    (resolver/router.key_changes): the key the settings loader read from the controller's
    Settings.control_plane_key_file. Root only: systemd hands the router unit a copy
    (LoadCredential=)."""
    s = write.settings
    text = control_key_text(s)
    assert text is not None  # key_changes: a key that was read
    return write.file("Router: control-plane key (root only)", layout.CONTROL_PLANE_KEY_FILE, text)


def _router_step(
    write: Writer, plan: RouterPlan, restart: bool, python: str | None, retired: Sequence[str]
) -> RouterStep:
    """The router's part of the serve step (raises PinError: no pinned requirements); `retired`:
    the router environments on the host (this release's is kept)."""
    if python is None:
        raise PinError("the host's python3 is not known")
    s, file = write.settings, write.file
    tree = layout.engine_tree(s)
    install = layout.router_marker(plan.env_dir) not in write.digests
    uv_config = None
    if install:
        # Root-only: the main index URL may carry credentials.
        wheelhouse_dir = tree.wheelhouse if s.wheelhouse else None
        uv_config = file("Router: uv.toml", tree.uv_config, tools_uv_config(s, wheelhouse_dir))
    return RouterStep(
        version=plan.version,
        package=plan.package,
        launcher_module=plan.argv[2],
        env_dir=plan.env_dir,
        retired=[env for env in retired if env != plan.env_dir],
        engine_root=s.engine_root,
        install=install,
        requirements=file(
            "Router: requirements",
            layout.env_requirements(plan.env_dir),
            router_requirements(plan.version, python, plan.package),
        ),
        uv_config=uv_config,
        launcher=file(
            "Router: launcher", layout.ROUTER_LAUNCH_SCRIPT, script_text("router_launch.py")
        ),
        unit=file("Router: unit", layout.unit_path(layout.ROUTER_UNIT), plan.unit, shown=True),
        restart=restart,
        health_url=plan.health_url,
    )
