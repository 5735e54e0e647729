"""A canary rollout (settings `rollout`, docs/reference/settings.md), decided in the plan.

With `rollout.strategy: canary` (or the strategy unset on a host where a rank already serves),
a roll that changes what the ranks run (their engine or their flags) goes in stages instead of
today's batches: the first `canary_ranks` ranks of the restart list roll first as their own
batch (drained through the router like any batch, and back in its pool), the comparison program
(layout.CANARY_SCRIPT) compares them with up to MAX_BASELINES ranks still on the old engine (the
baselines) on answers, speed and errors, writes its verdict on the host (layout.CANARY_RECORD,
facts/canary.py reads it), and only a passed verdict lets the rest roll. The strategy unset
rolls as today where no rank serves yet (a first deploy) or where a canary cannot be compared
(no serving rank left on the old engine, no benchmark client for the release), and says why.

The stage follows from the host's record for this run's target (`verdict_target`: the ranks'
flags digest, plan/throughput_plan.flags_digest, with the settings the verdict is judged by:
canary_ranks, max_slowdown, soak_s; so a changed threshold judges again, and `pause` does not)
and from what the ranks run now, so a run killed anywhere finishes what was started or rolls
back:

- canary: no verdict for the target: the canary batch, the comparison, then the rest;
- resume: no verdict, but some ranks already run the target (a run killed after the canary
  batch): they are the canary, compared before the rest roll;
- promote: a passed verdict, `pause` false: the rest roll as today, no comparison again;
- paused: a passed verdict with `pause` true, or `pause` true before this run's comparison: the
  rest wait for a run with `pause: false`;
- rollback: a failed verdict not yet rolled back, a canary rank still on the target: its unit
  is restored from its backup (layout.CANARY_BACKUP_DIR), then the deploy is refused;
- refused: a failed verdict: the host's plan errors, before any change. The verdict's time in
  the setting `canary_judge_again` judges it again on purpose (the canary or resume stage).

Only an engine or flags change is a canary's business: a rank whose unit changes otherwise (a
comment, the API key file's text) rolls as today. Ranks that are not serving when the deploy
starts (crashed, or added by a larger dp_size) never start on the new engine or flags before a
verdict passed: they start after this run's verdict passes (`start_after`), or stay stopped
(`stopped`: paused, refused, rolling back; said by name). One exception is the canary itself: a
rank not serving whose unit already names the target and whose old unit is backed up is a canary
an earlier run left unhealthy (or was cut off in); it is the canary again, and a canary batch
that fails is rolled back onto its saved unit in the same run (steps/serve.py).
The plan decides everything here, the comparison program's whole command line included; the
serve step carries it out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from operations import layout
from operations.facts.canary import Canary, CanaryRecord
from operations.facts.serve import Serving
from operations.plan.drain import DrainPlan
from operations.plan.rank_state import rank_pending_restart
from operations.plan.resolver.types import Rank
from operations.plan.throughput_plan import load_flags
from operations.plan.vocabulary import CanaryJson, Decision
from operations.settings import Settings

CanaryStage = Literal["canary", "resume", "promote", "paused", "rollback", "refused"]
# At most this many ranks on the old engine are the baselines (their median is the speed row's
# figure; one that fails its answers is the baseline's fault and dropped: canary_compare.py).
MAX_BASELINES = 3

# What the comparison checks, in the verdict table's order: the answers to fixed prompts at
# temperature 0 must be the same; the errors row needs the router's per-worker counters.
ANSWERS = "answers"
SPEED = "speed"
ERRORS = "errors"
ANSWERS_THRESHOLD = "exact (temperature 0)"
FIX = (
    "change a setting that reaches the ranks' command line, or one the verdict is judged by "
    "(rollout.max_slowdown, soak_s, canary_ranks), to judge again; or rollout.strategy: rolling "
    "to deploy anyway; or roll back the pin"
)
AGAIN = "canary_judge_again"


def verdict_target(flags: str, s: Settings) -> str:
    """What a verdict is for: the ranks' flags digest and the settings that judge it."""
    r = s.rollout
    judged = {"canary_ranks": r.canary_ranks, "max_slowdown": r.max_slowdown, "soak_s": r.soak_s}
    return hashlib.sha256(f"{flags} {json.dumps(judged, sort_keys=True)}".encode()).hexdigest()


@dataclass(frozen=True)
class CanaryPlan:
    """What a canary rollout does this run (see the module's docstring); `stage` None: it does
    not apply (`skip` says why) and the roll is today's."""

    stage: CanaryStage | None = None
    skip: str = ""
    # The canary ranks, the ones of them this run restarts first (as one batch), the baseline.
    canary: list[int] = field(default_factory=list)
    canary_batch: list[int] = field(default_factory=list)
    baseline: int | None = None
    # Every baseline, the reference first (`baseline`); up to MAX_BASELINES.
    baselines: list[int] = field(default_factory=list)
    # Ranks not serving when the deploy starts: started after this run's verdict passes, or
    # left stopped this run (never started on the new engine or flags before a verdict).
    start_after: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    # A failed verdict judged again on purpose (settings canary_judge_again): its time.
    judged_again: str = ""
    # The batches after the comparison (or the promotion); held back while paused.
    rest: list[list[int]] = field(default_factory=list)
    # What the canary runs.
    release: str = ""
    engine: str = ""
    # What is compared, and the thresholds.
    checks: list[str] = field(default_factory=list)
    max_slowdown: float = 0.0
    soak_s: int = 0
    # The errors row has the router's counters (no router: skipped, and said so).
    soak: bool = False
    # The comparison program's command line ([]: no comparison this run).
    argv: list[str] = field(default_factory=list)
    # Before a canary rank's unit is rewritten: its unit file -> where its copy goes.
    backup: dict[str, str] = field(default_factory=dict)
    # A rollback: each backup -> the unit file it is restored to.
    restore: dict[str, str] = field(default_factory=dict)
    # The line the deploy fails with after a rollback (refused: in `errors`, before any change).
    refusal: str = ""
    errors: list[str] = field(default_factory=list)
    decision: Decision | None = None

    @property
    def compares(self) -> bool:
        return bool(self.argv)

    @property
    def restore_after(self) -> dict[str, str]:
        """What a failed comparison this run puts back: each canary rank's copy (made by the
        canary batch's backup step, this run or the run that was cut off) -> its unit file."""
        return {
            f"{layout.CANARY_BACKUP_DIR}/{layout.unit_name(n)}": layout.rank_unit_path(n)
            for n in self.canary
        }

    @property
    def restore_batch(self) -> dict[str, str]:
        """What a canary batch that fails from its write on puts back in the same run (the
        batch's ranks' copies -> their unit files; roll_batch.py --undo)."""
        return {
            f"{layout.CANARY_BACKUP_DIR}/{layout.unit_name(n)}": layout.rank_unit_path(n)
            for n in self.canary_batch
        }

    @property
    def rolls_rest(self) -> bool:
        """Whether the rest roll in this run (after a passed comparison, or promoted)."""
        return self.stage in ("canary", "resume", "promote")

    def summary(self) -> str:
        """One line for the plan's ranks line."""
        if self.stage is None:
            return f"canary: none ({self.skip})"
        return self._stages() + self._not_serving()

    def _not_serving(self) -> str:
        parts = []
        if self.start_after:
            parts.append(
                f"rank(s) {', '.join(map(str, self.start_after))} not serving: started after "
                "the verdict passes, left stopped if it fails"
            )
        if self.stopped:
            parts.append(
                f"rank(s) {', '.join(map(str, self.stopped))} not serving: stay stopped (no "
                "passed verdict for the new engine or flags)"
            )
        return "".join(f"; {p}" for p in parts)

    def _stages(self) -> str:
        ranks = ", ".join(map(str, self.canary))
        later = " then ".join(f"[{', '.join(map(str, b))}]" for b in self.rest) or "nothing"
        if self.stage in ("refused", "rollback"):
            back = (
                f"rank(s) {ranks} go back to their units before the canary; "
                if self.stage == "rollback"
                else ""
            )
            return f"canary: {back}{self.refusal}"
        if self.stage == "promote":
            return f"canary: rank(s) {ranks} passed on {self.engine}; promote: {later}"
        compared = ""
        if self.compares:
            speed = f"{SPEED} (<={self.max_slowdown:.0%} slower)"
            errors = (
                f"{ERRORS} ({self.soak_s} s soak through the router)"
                if self.soak
                else f"no {ERRORS} row (no router: the soak is skipped)"
            )
            against = (
                f"rank {self.baseline}"
                if len(self.baselines) < 2
                else f"ranks {', '.join(map(str, self.baselines))} (their median)"
            )
            compared = f", compared with {against} on {ANSWERS}, {speed} and {errors}"
        first = (
            f"rank(s) {', '.join(map(str, self.canary_batch))} first"
            if self.canary_batch
            else f"rank(s) {ranks} already on it (an earlier run was cut off)"
        )
        again = (
            f" (judging the failed verdict of {self.judged_again} again: {AGAIN})"
            if self.judged_again
            else ""
        )
        head = f"canary: {first} (new engine {self.engine}){again}{compared}"
        if self.stage == "paused":
            return f"{head}; paused (rollout.pause): set rollout.pause false to promote {later}"
        return f"{head}, then {later}"

    def to_json(self) -> CanaryJson:
        return {
            "stage": self.stage,
            "skip": self.skip,
            "canary": self.canary,
            "canary_batch": self.canary_batch,
            "baseline": self.baseline,
            "baselines": self.baselines,
            "start_after": self.start_after,
            "stopped": self.stopped,
            "judged_again": self.judged_again,
            "rest": self.rest,
            "release": self.release,
            "engine": self.engine,
            "checks": self.checks,
            "max_slowdown": self.max_slowdown,
            "soak_s": self.soak_s,
            "soak": self.soak,
            "argv": self.argv,
            "backup": self.backup,
            "restore": self.restore,
            "refusal": self.refusal,
            "errors": self.errors,
            "summary": self.summary(),
        }


def command_words(argv: Sequence[str]) -> list[str]:
    """A rank's command line as the canary compares it: `--config SECRETS_FILE` left out, so a
    key added or removed (what the API key file holds) is no engine or flags change."""
    words = list(argv)
    for i in range(len(words) - 1):
        if words[i] == "--config" and words[i + 1] == layout.SECRETS_FILE:
            return words[:i] + words[i + 2 :]
    return words


def runs_other(serving: Serving, rank: Rank) -> bool:
    """Whether the rank's unit file on the host names another command line than the plan's.

    The fact reads the ExecStart= line's text (facts/serve.py); the plan holds the argv the
    unit's line is encoded from (render/execstart.encode). They are compared as words, the
    line decoded with the encoder's inverse (UnitState.argv), so quoting alone is no change; a
    line that cannot be decoded reads as [] and counts as a change (nothing is known of it)."""
    now = serving.ranks.get(rank.rank)
    words = now.argv() if now is not None else []
    return command_words(words) != command_words(rank.argv)


def batches(ranks: Sequence[int], size: int) -> list[list[int]]:
    return [list(ranks[i : i + size]) for i in range(0, len(ranks), size)]


def compare_argv(
    s: Settings,
    canary: Sequence[Rank],
    baselines: Sequence[Rank],
    target: str,
    drain: DrainPlan | None,
    held: Sequence[int] = (),
) -> list[str]:
    """The comparison program's command line (the host's python3 runs it; the canary's engine
    runs the benchmark client against every side, so all are measured by one client). The
    speed arguments are the throughput check's (plan/throughput_plan.py). `baselines`: the
    reference first; `held`: ranks not serving that stay stopped when the verdict fails (the
    program names them)."""
    first = canary[0]
    meta = {
        "release": s.sglang_version,
        "engine": first.engine_env,
        "canary_ranks": [r.rank for r in canary],
        "baseline_rank": baselines[0].rank,
        "baseline_ranks": [r.rank for r in baselines],
    }
    argv = ["python3", layout.CANARY_SCRIPT]
    for r in canary:
        argv += ["--canary", f"{r.unit_name}={layout.rank_api_base(s, r.rank)}"]
    for r in baselines:
        argv += ["--baseline", f"{r.unit_name}={layout.rank_api_base(s, r.rank)}"]
    for n in held:
        argv += ["--held", layout.unit_name(n)]
    argv += ["--key-file", layout.SECRETS_FILE]
    argv += ["--service-user", s.service_user]
    argv += ["--max-slowdown", str(s.rollout.max_slowdown), "--soak", str(s.rollout.soak_s)]
    argv += ["--record", layout.CANARY_RECORD, "--target", target]
    argv += ["--meta", json.dumps(meta, sort_keys=True)]
    metrics = router_metrics_url(s, drain)
    if metrics is not None and drain is not None:
        argv += ["--router-metrics", metrics]
        for r in [*canary, *baselines]:
            argv += ["--worker", f"{r.unit_name}={drain.worker(r.rank)}"]
    # The speed row's load: the throughput check's shape, its one writer.
    return argv + load_flags(s)


def router_metrics_url(s: Settings, drain: DrainPlan | None) -> str | None:
    """The router's Prometheus server (its /metrics: per-worker counters) as this host reaches
    it: the drain plan's (the address the drain reaches the router at, on router.metrics_port;
    the router serves its metrics on its bind address). None: no router, or rolls are not
    drain-protected."""
    if drain is None or s.router is None:
        return None
    # The program reads BASE/metrics (throughput_client.metrics): the server, not its page.
    return drain.router_metrics


def _refusal(record: CanaryRecord, stopped: Sequence[int] = ()) -> str:
    failed = "; ".join(
        f"{row.check}: {row.canary} against {row.baseline} ({row.threshold})"
        for row in record.failed_rows()
    )
    ranks = ", ".join(map(str, record.canary_ranks))
    down = f"; rank(s) {', '.join(map(str, stopped))} not serving stay stopped" if stopped else ""
    return (
        f"canary: rank(s) {ranks} on {record.engine} ({record.release}) failed against rank "
        f"{record.baseline_rank} at {record.at}: {failed or 'no row passed'}; nothing changes "
        f"on the host{down}; fix: {FIX}; or judge it again as it is: --data "
        f"{AGAIN}={record.at}"
    )


def _failed(
    record: CanaryRecord,
    ranks: Sequence[Rank],
    serving: Serving,
    state: Canary,
    start: Sequence[Rank],
) -> CanaryPlan:
    """A failed verdict for this target: roll a canary rank still on it back, then refuse. A
    rank still on it: its unit file is the target's, or its process does not run its file (a
    rollback cut off between the restore and the restart: the failed process still runs).
    Ranks not serving stay stopped (the host is refused before any change)."""
    by_rank = {r.rank: r for r in ranks}
    on_target = [
        n
        for n in record.canary_ranks
        if n in by_rank
        and n in serving.ranks
        and (not runs_other(serving, by_rank[n]) or rank_pending_restart(serving, n) is not None)
    ]
    back = [] if record.rolled_back else on_target
    stopped = [r.rank for r in start if r.rank not in back]
    refusal = _refusal(record, stopped)
    base = CanaryPlan(
        stage="refused",
        canary=list(record.canary_ranks),
        baseline=record.baseline_rank,
        stopped=stopped,
        release=record.release,
        engine=record.engine,
        refusal=refusal,
    )
    if record.rolled_back or not on_target:
        return replace(base, errors=[refusal])
    missing = [n for n in on_target if layout.unit_name(n) not in state.backups]
    if missing:
        why = (
            f"canary: rank(s) {', '.join(map(str, missing))} still run {record.engine}, which "
            f"failed, and {layout.CANARY_BACKUP_DIR} holds no trusted copy of their units to "
            "roll back to; roll back the pin (the ranks then roll onto it) or set "
            "rollout.strategy: rolling"
        )
        return replace(base, errors=[why, refusal])
    restore = {
        f"{layout.CANARY_BACKUP_DIR}/{layout.unit_name(n)}": layout.rank_unit_path(n)
        for n in on_target
    }
    return replace(base, stage="rollback", restore=restore)


def _verdict(s: Settings, state: Canary, target: str) -> tuple[CanaryRecord | None, str]:
    """The host's verdict for this target (None: none), and the time of a failed one judged
    again on purpose (settings canary_judge_again), or ""."""
    record = state.record if state.record is not None and state.record.target == target else None
    if record is not None and not record.ok and s.canary_judge_again == record.at:
        return None, record.at
    return record, ""


def _cannot_compare(s: Settings, why: str, numbers: Sequence[int]) -> CanaryPlan:
    """A canary that cannot be compared: refused when asked for by name, today's roll (said)
    when the strategy is unset."""
    if s.rollout.strategy is None:
        return CanaryPlan(skip=f"{why}; rollout.strategy unset: rolls as today")
    return CanaryPlan(stage="refused", canary=list(numbers), errors=[f"canary: {why}"])


def canary_plan(
    settings: Settings,
    restart: Sequence[Rank],
    ranks: Sequence[Rank],
    serving: Serving,
    state: Canary,
    flags: str,
    drain: DrainPlan | None = None,
    start: Sequence[Rank] = (),
) -> CanaryPlan:
    """The canary's decision for this host. `restart`: the serving ranks this run restarts, in
    the order today's roll would (serve_plan.roll_plan's batches, flattened: RollPlan.rolled);
    `ranks`: every rank the plan wants; `state`: the CanaryState fact; `flags`: the ranks'
    flags digest; `drain`: how a rank leaves and rejoins the router (None: no router, no soak);
    `start`: the ranks not serving (RollPlan.start), which today's roll would start at once."""
    s = settings
    rollout = s.rollout
    if rollout.strategy == "rolling":
        return CanaryPlan(skip="rollout.strategy: rolling")
    if rollout.strategy is None and not any(u.running for u in serving.ranks.values()):
        return CanaryPlan(skip="no rank serves yet: a first deploy rolls as today")
    target = verdict_target(flags, s)
    record, again = _verdict(s, state, target)
    if record is not None and not record.ok:
        return _finish(s, _failed(record, ranks, serving, state, start), state)
    changed = [r for r in restart if runs_other(serving, r)]
    if not changed:
        why = "no serving rank's engine or flags change"
        return CanaryPlan(skip=f"{why} (a unit change that leaves the command line alone rolls)")
    size = max(1, s.restart_batch_size)
    down = [r.rank for r in start]
    if record is not None:
        plan = CanaryPlan(
            stage="paused" if rollout.pause else "promote",
            canary=list(record.canary_ranks),
            baseline=record.baseline_rank,
            stopped=down if rollout.pause else [],
            rest=batches([r.rank for r in restart], size),
            release=record.release,
            engine=record.engine,
        )
        return _finish(s, plan, state)
    return _finish(
        s, _compared(s, changed, restart, ranks, serving, state, flags, drain, start, again), state
    )


def _compared(
    s: Settings,
    changed: Sequence[Rank],
    restart: Sequence[Rank],
    ranks: Sequence[Rank],
    serving: Serving,
    state: Canary,
    flags: str,
    drain: DrainPlan | None,
    start: Sequence[Rank],
    again: str,
) -> CanaryPlan:
    """No verdict for the target: the canary (or resume) stage. Ranks already on the target
    with no verdict for it are the canary: serving ones (a run killed after the canary batch;
    one whose file is the target's but whose process does not run it yet restarts first), and
    a stopped one whose old unit is backed up (a canary an earlier run left unhealthy: started
    again in the canary batch, health-gated, rolled back onto its saved unit if it fails)."""
    rollout = s.rollout
    moved = {r.rank for r in changed}
    already = [
        r
        for r in ranks
        if r.rank not in moved
        and (now := serving.ranks.get(r.rank)) is not None
        and not runs_other(serving, r)
        and (now.running or layout.unit_name(r.rank) in state.backups)
    ]
    starting = {r.rank for r in start} | {r.rank for r in restart}
    stage: CanaryStage = "resume" if already else "canary"
    canary = already or list(changed[: rollout.canary_ranks])
    numbers = [r.rank for r in canary]
    first = [n for n in numbers if n in starting]
    held = [r.rank for r in start if r.rank not in numbers]
    old = [r for r in changed if r.rank not in numbers and serving.ranks[r.rank].running]
    if not old:
        why = (
            "no serving rank keeps the old engine to compare rank(s) "
            f"{', '.join(map(str, numbers))} with"
        )
        return _cannot_compare(s, f"{why}; set rollout.strategy: rolling", numbers)
    baselines = sorted(old, key=lambda r: r.rank)[:MAX_BASELINES]
    target = verdict_target(flags, s)
    return CanaryPlan(
        stage="paused" if rollout.pause else stage,
        canary=numbers,
        canary_batch=first,
        baseline=baselines[0].rank,
        baselines=[r.rank for r in baselines],
        start_after=[] if rollout.pause else held,
        stopped=held if rollout.pause else [],
        judged_again=again,
        rest=batches(
            [r.rank for r in restart if r.rank not in first], max(1, s.restart_batch_size)
        ),
        release=s.sglang_version,
        engine=canary[0].engine_env,
        argv=compare_argv(s, canary, baselines, target, drain, held)
        + (["--pause"] if rollout.pause else []),
        # The old unit of each canary rank this run rewrites, kept for a rollback.
        backup={
            layout.rank_unit_path(n): f"{layout.CANARY_BACKUP_DIR}/{layout.unit_name(n)}"
            for n in first
            if n in moved
        },
    )


def _finish(s: Settings, plan: CanaryPlan, state: Canary) -> CanaryPlan:
    """The thresholds, the checks and the decision `plan --why` shows."""
    if plan.stage is None:
        return replace(plan, decision=Decision("rollout", plan.summary(), plan.skip))
    soak = plan.compares and any(w == "--router-metrics" for w in plan.argv)
    checks = [ANSWERS, SPEED, *([ERRORS] if soak else [])]
    done = replace(
        plan,
        checks=checks,
        max_slowdown=s.rollout.max_slowdown,
        soak_s=s.rollout.soak_s,
        soak=soak,
    )
    how = "rollout.strategy canary" if s.rollout.strategy else "rollout.strategy unset (canary)"
    why = (
        f"{how}: {s.rollout.canary_ranks} rank(s) first, compared with up to "
        f"{MAX_BASELINES} ranks still on the old engine (the lowest) on {ANSWERS} "
        f"({ANSWERS_THRESHOLD}), {SPEED} (the throughput client, at most "
        f"{s.rollout.max_slowdown:.0%} slower than the baselines' median) and {ERRORS} (the "
        f"router's per-worker failures over {s.rollout.soak_s} s; skipped without a router); "
        f"ranks not serving start only after a passed verdict; the verdict is kept in "
        f"{layout.CANARY_RECORD}"
    )
    if state.problem is not None:
        why += f"; the host's record was not read: {state.problem}"
    asked = s.canary_judge_again
    if asked and asked != plan.judged_again:
        why += (
            f"; {AGAIN} {asked!r} names no failed verdict of this host's for this change: ignored"
        )
    return replace(done, decision=Decision("rollout", done.summary(), why))
