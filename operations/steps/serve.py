"""Step 4 of the deploy: one systemd unit per rank, started or rolled health-gated; the router.

What each rank runs (argv, environment, unit text) was decided by the resolver, and each unit names
its own engine environment and staged model copy by path. The plan (operations/plan/serve_plan.py,
decided in host_plan.decide) turned "what should run" and the ServingState fact into the fewest
changes and every file to write (`ServePlan`); this module carries it out:

- ranks that are not serving start together, then must all answer /health;
- a serving rank restarts when and only when its own unit file changes (or the API key file it
  reads): the new unit is written and the rank restarted in batches of `restart_batch_size`,
  each batch healthy before the next. A batch that fails stops the roll; the ranks not yet
  rolled keep unit files that name the previous engine and model, so a crash-restart or a
  reboot runs those again, never the new ones;
- ranks beyond `dp_size` are stopped, disabled and removed;
- once every batch is healthy, staged model copies no unit names any more are removed.
Behind a router (the plan's DrainPlan, operations/plan/drain.py), each batch (and each rank a shrink
removes) first leaves the router and finishes its in-flight requests; a rolled batch rejoins
only after /health and a chat request (programs/router_workers.py), and a batch that fails stays
out. Ranks started from stopped are put back when the router does not list them.
Nothing here asks a fact or takes a fact's value (tests/unit/test_steps_read_no_fact.py): a
converged host changes nothing.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, cast

from pyinfra import logger
from pyinfra.api.command import StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.operations import server, systemd

from operations import layout
from operations.layout import SECRETS_FILE, TARGET
from operations.plan.drain import DrainPlan
from operations.plan.host_plan import HostReport
from operations.plan.planned_files import PlannedFile
from operations.plan.resolver import Rank
from operations.plan.serve_plan import ServePlan
from operations.plan.smoke_plan import SmokeRequests
from operations.plan.vocabulary import DrainAction, RollStep
from operations.runtime.host_call import Commands
from operations.runtime.host_lines import host_text
from operations.runtime.pyinfra_internals import first_command
from operations.settings import Settings
from operations.steps.canary import backup_command, canary_compare, refused, restore_command
from operations.steps.health import wait_healthy
from operations.steps.host_files import line_writer, put_planned, show_change
from operations.steps.router import route
from operations.steps.smoke import smoke_requests

WAIT_SCRIPT = layout.WAIT_SCRIPT


class WorkersArgs(TypedDict):
    """router_workers' arguments for a batch (ServeStep._workers)."""

    action: DrainAction
    router: str
    api: tuple[str, str, str]
    timeout_s: int
    targets: list[str]
    key_file: str
    draining: str
    settle: tuple[int, str, str] | None
    worker_key: tuple[str, str] | None
    breakers: tuple[str, int] | None


@operation(is_idempotent=False)
def router_workers(
    action: DrainAction,
    router: str,
    api: tuple[str, str, str],
    timeout_s: int,
    targets: list[str],
    key_file: str = layout.CONTROL_PLANE_KEY_FILE,
    draining: str = "",
    settle: tuple[int, str, str] | None = None,
    worker_key: tuple[str, str] | None = None,
    breakers: tuple[str, int] | None = None,
) -> Commands:
    """
    Take ranks out of the router and wait for their in-flight requests, or put them back.

    + action: "out" or "in" (see operations/programs/router_workers.py)
    + router: the router's URL as this host reaches it
    + api: the pinned release's (list, remove, add) calls, `METHOD /path`, from the knowledge base
    + timeout_s: out: the drain's bound; in: how long the router may take to list them healthy
    + targets: out: UNIT=WORKER_URL=METRICS_URL; in: UNIT=WORKER_URL
    + key_file: the control-plane key on the host (its path only: the script reads it)
    + draining: the state the router lists a removed worker in while it settles (smg), or ""
    + settle: (seconds, update call, the call that shows the update done): the drained worker's
      settle (smg), set before its removal and carried by its re-add; None: the router's own
    + worker_key: (the ranks' key file on the host, the add request's field): each re-add
      carries the ranks' key, read there (its path only); None: the router needs none
    + breakers: (the router's Prometheus server, its breaker timeout in seconds): out waits for
      another worker whose circuit breaker is not open there; None: for one listed ready
    """
    list_call, remove_call, add_call = api
    words = ["python3", layout.ROUTER_WORKERS_SCRIPT, "--router", router]
    words += ["--list", list_call, "--remove", remove_call, "--add", add_call]
    words += ["--key-file", key_file]
    words += ["--draining", draining] if draining else []
    if settle is not None:
        seconds, update_call, applied_call = settle
        words += ["--settle", str(seconds), "--update", update_call, "--applied", applied_call]
    if worker_key is not None and action == "in":
        key_file, field = worker_key
        words += ["--worker-key-file", key_file, "--worker-key-field", field]
    if breakers is not None and action == "out":
        metrics_url, breaker_timeout_s = breakers
        words += ["--router-metrics", metrics_url, "--breaker-timeout", str(breaker_timeout_s)]
    words += ["--timeout", str(timeout_s), action, *targets]
    yield shlex.join(words)


def workers_args(drain: DrainPlan, action: DrainAction, ranks: Sequence[int]) -> WorkersArgs:
    """router_workers' arguments for `ranks`: out (drain; UNIT=WORKER=METRICS) or in
    (readmit), from the plan's DrainPlan (the serve step's and the tune's)."""
    if action == "out":
        targets = [f"{layout.unit_name(r)}={drain.worker(r)}={drain.metrics(r)}" for r in ranks]
        timeout_s = drain.timeout_s
    else:
        targets = [f"{layout.unit_name(r)}={drain.worker(r)}" for r in ranks]
        timeout_s = drain.readmit_timeout_s
    api_drain = drain.api.drain
    return {
        "action": action,
        "router": drain.router_url,
        "api": (drain.api.list_workers, drain.api.remove_worker, drain.api.add_worker),
        "timeout_s": timeout_s,
        "targets": targets,
        "key_file": drain.key_file,
        "draining": api_drain.state if api_drain is not None else "",
        "settle": None
        if api_drain is None or drain.settle_s is None
        else (drain.settle_s, api_drain.settle_update, api_drain.settle_applied),
        "worker_key": drain.worker_key,
        "breakers": None
        if drain.router_metrics is None or drain.breaker_timeout_s is None
        else (drain.router_metrics, drain.breaker_timeout_s),
    }


def host_argv(op: Any, **arguments: Any) -> list[str]:
    """The one host command an operation of this step yields for `arguments`, as argv, for a
    roll batch to run among its steps (the operation's own generator, pyinfra's `_inner`)."""
    return shlex.split(first_command(op, **arguments))


@operation(is_idempotent=False)
def roll_batch(
    batch: str,
    steps: list[tuple[RollStep, list[str], list[str]]],
    writes: list[str],
    written: list[PlannedFile] | None = None,
    undo: list[tuple[RollStep, list[str], list[str]]] | None = None,
    undo_from: RollStep = "restart",
) -> Commands:
    """
    One batch of a roll as one host command (programs/roll_batch.py): its steps in order, each
    timed, the first that fails stopping the rest.

    + batch: the batch's units, for the script's lines
    + steps: (name, argv, preload): a shipped python3 script runs in the script's process,
      another interpreter starts with the batch and imports `preload` first; a step named
      `write` gets the next of `writes`
    + writes: each write step's stdin (host_files.line_writer), never on a command line
    + written: the plan's files the write steps write, shown under `--diff`
    + undo: a canary batch's rollback (steps as above), run when a step from `undo_from` on
      fails; the batch still fails
    + undo_from: the first step whose failure runs `undo`
    """
    for file in written or []:
        show_change(file)
    words = ["python3", layout.ROLL_BATCH_SCRIPT, "--batch", batch]
    if undo:
        words += ["--undo", json.dumps(undo), "--undo-from", undo_from]
    words.append(json.dumps(steps))  # last: what a simulated host reads the steps from
    yield StringCommand(shlex.join(words), _stdin="".join(writes))


def restart_command(units: str) -> str:
    """A drained batch's restart onto its new unit files, for /bin/sh: the old processes are
    told to stop (`--no-block`: the stop job is queued and SIGTERM sent, systemctl returns),
    systemd reloads the unit files while they shut down (a reload took 0.13-0.25 s, a stop as
    long or, for a real rank, longer: bench/roll_bench.py), a second `stop` waits for the job
    to end (merged into it, or at once when the units are already inactive), and the units
    start. No client waits across the reload (systemd/systemd PR #8803 made such a wait safe,
    in v239). Only the batch's own unit files are new (written just before this) and only its
    own units stop: every other rank's file still names what its process runs, so a
    crash-restart of one runs that. A stop systemd refuses fails the step with nothing
    stopped: the old processes serve on, the batch stays out of the router. A start refused at
    the start limit (a crash loop left the unit `failed`) is retried once after `reset-failed`,
    as a deploy starts afresh; `|| true`: see ServeStep._start, the health wait judges the batch
    and shows how to go back. A failed reload still starts the units, on what systemd had loaded
    (the old release, with NeedDaemonReload: "pending restart" for the next run), and fails the
    step, so the batch stays out of the router and the roll stops."""
    return (
        f"systemctl stop --no-block {units} || exit; "
        "systemctl daemon-reload; reloaded=$?; "
        f"systemctl stop {units}; "
        f"systemctl start {units} || {{ systemctl reset-failed {units}; "
        f"systemctl start {units}; }} || true; "
        'if [ "$reloaded" -ne 0 ]; then '
        f'echo "systemctl daemon-reload failed (exit $reloaded): {units} started on the unit '
        'files systemd had loaded"; exit "$reloaded"; fi'
    )


def ranks_label(ranks: Sequence[int]) -> str:
    """The ranks an operation acts on, for its name: up to two by unit name, more as ranges
    (`ranks 0-7`). pyinfra's change table is as wide as its longest operation name, and eight
    unit names made it 254 columns."""
    if len(ranks) <= 2:
        return ", ".join(layout.unit_name(r) for r in ranks)
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return "ranks " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


@operation()
def pruned_model_copies(stage_dir: str, slug: str, keep: list[str], doomed: list[str]) -> Commands:
    """
    Remove staged copies of the model that no rank unit names any more (after a whole roll).

    + stage_dir: the tmpfs (copies are STAGE_DIR/models/.SLUG@KEY)
    + slug: the model's directory name
    + keep: the keys the units name now
    + doomed: the copies the fact shows that are not kept (nothing to do when empty)
    """
    if not doomed:
        host.noop("every staged copy is named by a unit")
        return
    argv = ["python3", layout.STAGE_SCRIPT, "prune", stage_dir, slug]
    for key in keep:
        argv += ["--keep", key]
    yield shlex.join(argv)


class ServeStep:
    """Carries out the plan's ServePlan (operations/plan/serve_plan.py): which ranks start, restart
    (in what batches) and go, the files it writes (each with the digest the plan read), the staged
    copies no unit names. It reads no fact and decides nothing."""

    def __init__(self, report: HostReport) -> None:
        if report.serve is None:
            raise OperationError("the serve step needs the plan's ServePlan (host_plan)")
        self.settings = report.settings
        self.decided: ServePlan = report.serve
        self.plan = self.decided.roll
        self.drain: DrainPlan | None = report.drain

    def summary(self) -> str:
        """What this run does to the ranks, for the plan printed before any change."""
        return self.decided.summary()

    def run(self) -> None:
        # The units run as the service user, which the model step made (deploy.py runs it
        # first: the staged copy is readable by its group only).
        for file in self.decided.files:
            put_planned(file)
        if self.decided.remove_secret:
            server.shell(name="remove the API key file", commands=[f"rm -f {SECRETS_FILE}"])
        if self.plan.remove:
            self._remove()
        if self.plan.start:
            self._start(self.plan.start, "start")
        elif self.decided.target_changes:
            systemd.daemon_reload(name="reload systemd")
        if self.decided.target_changes:
            systemd.service(name=f"enable {TARGET}", service=TARGET, enabled=True)
        if self.decided.readmit:
            self._in(self.decided.readmit, "left out by an earlier run")
        canary = self.decided.canary
        if canary is not None and canary.stage == "rollback":
            # A failed verdict whose rollback did not finish: the canary ranks go back first,
            # and the deploy fails with the verdict (canary_plan.py).
            self._roll_back([r for r in canary.canary], canary.restore)
            refused(name="Canary | refused", line=canary.refusal)
            return
        if canary is not None and canary.compares and not canary.canary_batch:
            self._compare()  # an earlier run rolled the canary and was cut off before this
            self._start_after()
        for number, (batch, asked) in enumerate(
            zip(self.plan.batches, self.decided.batch_smoke, strict=True), 1
        ):
            first = canary is not None and number == 1 and bool(canary.canary_batch)
            self._roll(
                batch,
                "canary" if first else f"restart batch {number}",
                asked,
                backup=canary.backup if first and canary is not None else {},
                canary=first,
            )
            if first and canary is not None and canary.compares:
                self._compare()
                self._start_after()
        self._prune_models()

    def _start_after(self) -> None:
        """The ranks that were not serving, once the canary's verdict passed (a failed one
        failed the deploy before this: they stay stopped, as the comparison said)."""
        if self.plan.start_after:
            self._start(self.plan.start_after, "after the canary's verdict passed")

    def _compare(self) -> None:
        canary = self.decided.canary
        if canary is None:
            raise OperationError("the comparison needs the plan's CanaryPlan")
        rollback = json.dumps(self._restore_steps(canary.canary, canary.restore_after))
        canary_compare(
            name=f"Canary | compare {ranks_label(canary.canary)} with {canary.baseline}",
            argv=canary.argv,
            rollback=rollback,
        )

    def _restore_steps(
        self, ranks: Sequence[int], restore: Mapping[str, str]
    ) -> list[tuple[RollStep, list[str], list[str]]]:
        """A rollback as a roll batch's steps: out of the router and drained, the old unit
        files back, restarted, /health, back into the router."""
        s = self.settings
        units = " ".join(layout.unit_name(r) for r in ranks)
        steps: list[tuple[RollStep, list[str], list[str]]] = []
        if self.drain is not None:
            steps.append(("drain", host_argv(router_workers, **self._workers("out", ranks)), []))
        steps.append(("restore", ["/bin/sh", "-c", restore_command(restore)], []))
        steps.append(("restart", ["/bin/sh", "-c", restart_command(units)], []))
        checks = [(layout.unit_name(r), layout.rank_health_url(s, r)) for r in ranks]
        health = host_argv(
            wait_healthy,
            checks=checks,
            timeout_s=s.health_timeout_s,
            service_user=s.service_user,
        )
        steps.append(("health", health, []))
        if self.drain is not None:
            steps.append(("readmit", host_argv(router_workers, **self._workers("in", ranks)), []))
        return steps

    def _roll_back(self, ranks: Sequence[int], restore: Mapping[str, str]) -> None:
        steps = self._restore_steps(ranks, restore)
        names = ", ".join(layout.unit_name(r) for r in ranks)
        roll_batch(
            name=f"Canary | roll back {ranks_label(list(ranks))}",
            batch=names,
            steps=steps,
            writes=[],
        )

    def _out(self, ranks: Sequence[int], what: str) -> None:
        """Ranks leave the router and finish their in-flight requests (behind a router)."""
        if self.drain is None:
            return
        router_workers(
            name=f"{what}: take {ranks_label(ranks)} out of the router and drain",
            **self._workers("out", ranks),
        )

    def _in(self, ranks: Sequence[int], what: str) -> None:
        """Ranks (healthy, answered) rejoin the router (behind a router)."""
        if self.drain is None:
            return
        router_workers(
            name=f"{what}: put {ranks_label(ranks)} back into the router",
            **self._workers("in", ranks),
        )

    def _workers(self, action: DrainAction, ranks: Sequence[int]) -> WorkersArgs:
        """router_workers' arguments: out (drain; UNIT=WORKER=METRICS) or in (readmit)."""
        if self.drain is None:
            raise OperationError("router_workers needs the plan's DrainPlan")
        return workers_args(self.drain, action, ranks)

    def _remove(self) -> None:
        self._out(self.plan.remove, "dp_size shrank")
        units = [layout.unit_name(r) for r in self.plan.remove]
        paths = " ".join(layout.rank_unit_path(r) for r in self.plan.remove)
        server.shell(
            name=f"stop and remove {ranks_label(self.plan.remove)} (dp_size shrank)",
            commands=[
                f"systemctl disable --now {' '.join(units)}",
                f"rm -f {paths}",
                "systemctl daemon-reload",
                f"systemctl reset-failed {' '.join(units)} || true",
            ],
        )

    def _write_units(self, ranks: Sequence[Rank], why: str) -> None:
        for rank in ranks:
            put_planned(self.decided.rank_units[rank.rank], name=f"{rank.unit_name} ({why})")

    def _start(self, start: Sequence[Rank], why: str) -> None:
        s = self.settings
        self._write_units(start, why)
        systemd.daemon_reload(name="reload systemd")
        units = " ".join(r.unit_name for r in start)
        server.shell(
            name=f"start {ranks_label([r.rank for r in start])} ({why})",
            commands=[
                f"systemctl enable {units}",
                # A crash loop left the unit `failed` at its start limit: a deploy starts afresh.
                f"systemctl reset-failed {units} || true",
                # A start that fails at once is judged by the health wait that follows, which
                # prints the unit's journal and how to go back; the bare error would not.
                f"systemctl restart {units} || true",
            ],
        )
        wait_healthy(
            name=f"/health of {ranks_label([r.rank for r in start])}",
            checks=[(r.unit_name, layout.rank_health_url(s, r.rank)) for r in start],
            timeout_s=s.health_timeout_s,
            service_user=s.service_user,
            hint=(
                "The ranks that were serving before this run were not touched: the deploy stops "
                "here, before any restart."
            ),
            phases=self.decided.startup_lines,
            silence_s=self.decided.silence_s,
        )
        # A rank a failed roll left out of the router, started again: back in (when not listed).
        self._in([r.rank for r in start], why)

    def _roll(
        self,
        batch: list[Rank],
        what: str,
        asked: SmokeRequests | None,
        backup: Mapping[str, str] | None = None,
        canary: bool = False,
    ) -> None:
        """One batch, as one host command (roll_batch, programs/roll_batch.py): out of the router
        and drained, its changed unit files written, systemd reloaded while it stops, started
        (restart_command), /health, a chat request, back into the router; a step that fails
        stops the batch there (a batch is never restarted undrained, never put back unhealthy)
        and the roll with it. The canary batch (`canary`): one that fails from its write on is
        rolled back onto its saved unit files (the plan's backups) before the deploy fails."""
        s = self.settings
        names = ", ".join(r.unit_name for r in batch)
        label = ranks_label([r.rank for r in batch])
        units = " ".join(r.unit_name for r in batch)
        hint = (
            f"The roll stopped at {names}; the ranks not yet restarted still serve the previous "
            "engine and model, and their unit files still name them, so a crash-restart or a "
            "reboot runs the previous version too. To go back, set the previous settings (pin, "
            "flags or model) and run the deploy again: the previous engine environment is kept "
            "while a unit names it."
        )
        if canary:
            hint = (
                f"The canary {names} did not become healthy: it is rolled back onto its saved "
                "unit file(s) (the line after this says whether that passed), and no other rank "
                "was moved."
            )
        drain = self.drain
        ranks = [r.rank for r in batch]
        # (name, argv, modules a waiting interpreter imports first): programs/roll_batch.py
        steps: list[tuple[RollStep, list[str], list[str]]] = []
        writes: list[str] = []
        written: list[PlannedFile] = []
        if drain is not None:
            steps.append(("drain", host_argv(router_workers, **self._workers("out", ranks)), []))
        if backup:
            # A canary batch: its old unit files are the rollback's (canary_plan.py).
            steps.append(("backup", ["/bin/sh", "-c", backup_command(backup)], []))
        for rank in batch:
            unit = self.decided.rank_units[rank.rank]
            if unit.changes is False:
                continue  # a pending restart: its file is already what the plan says
            command, content = line_writer(
                unit.data, unit.path, owner=unit.owner, group=unit.group, mode=unit.mode
            )
            steps.append(("write", ["/bin/sh", "-c", command], []))
            writes.append(content)
            written.append(unit)
        steps.append(("restart", ["/bin/sh", "-c", restart_command(units)], []))
        checks = [(r.unit_name, layout.rank_health_url(s, r.rank)) for r in batch]
        health = host_argv(
            wait_healthy,
            checks=checks,
            timeout_s=s.health_timeout_s,
            service_user=s.service_user,
            hint=hint,
            phases=self.decided.startup_lines,
            silence_s=self.decided.silence_s,
        )
        steps.append(("health", health, []))
        if drain is not None:
            if asked is not None and asked.targets:
                smoke = host_argv(
                    smoke_requests,
                    python=asked.python,
                    model=s.model_name,
                    timeout_s=s.smoke_timeout_s,
                    targets=asked.targets,
                    service_user=s.service_user,
                )
                # Its interpreter starts with the batch, while the rank loads.
                steps.append(("smoke", smoke, []))
            steps.append(("readmit", host_argv(router_workers, **self._workers("in", ranks)), []))
            name = f"{what}: restart {label} (out of the router and drain, back into the router)"
        else:
            name = f"{what}: restart {label}"
        undo = None
        if canary and self.decided.canary is not None:
            undo = self._restore_steps(ranks, self.decided.canary.restore_batch)
        first_change: RollStep = "write" if writes else "restart"
        roll_batch(
            name=name,
            batch=names,
            steps=steps,
            writes=writes,
            written=written,
            undo=undo,
            undo_from=first_change,
        )

    def _prune_models(self) -> None:
        if not self.decided.prune_keep:
            return  # the ranks read the link (copy not known): nothing is named, nothing goes
        s = self.settings
        pruned_model_copies(
            name="prune model copies",
            stage_dir=s.model_stage_dir,
            slug=layout.model_slug(s),
            keep=self.decided.prune_keep,
            doomed=self.decided.prune_doomed,
        )


@deploy("Serve")
def _serve(report: HostReport) -> ServeStep:
    step = ServeStep(report)
    logger.info(host_text(host, f"ranks: {step.summary()}"))
    decided = step.decided
    # The router and its control-plane key before the ranks or after them, as the plan's
    # RouterOrder says: every drain speaks the API, with the key, of the router then running.
    if decided.order.first:
        _router_and_key(report.settings, decided)
    step.run()
    if not decided.order.first:
        _router_and_key(report.settings, decided)
    return step


def _router_and_key(s: Settings, decided: ServePlan) -> None:
    """The control-plane key (when this run writes it), then the router (on its host)."""
    if decided.control_plane_key is not None:
        put_planned(decided.control_plane_key)
    if decided.router is not None:
        route(s, decided.router)


# @deploy types every call as returning OperationMeta; this step returns its ServeStep.
serve = cast(Callable[..., ServeStep], _serve)
