"""A canary rollout (settings `rollout`, docs/reference/settings.md), decided in the plan.

With `rollout.strategy: canary`, a roll that changes what the ranks run (their engine or their
flags) goes in stages instead of today's batches: the first `canary_ranks` ranks of the restart
list roll first as their own batch (drained through the router like any batch, and back in its
pool), the comparison program (layout.CANARY_SCRIPT) compares them with a rank still on the old
engine (the baseline) on answers, speed and errors, writes its verdict on the host
(layout.CANARY_RECORD, facts/canary.py reads it), and only a passed verdict lets the rest roll.

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
- refused: a failed verdict: the host's plan errors, before any change.

Only an engine or flags change is a canary's business: a rank whose unit changes otherwise (a
comment, the API key file's text) rolls as today. Ranks that are not serving start as today.
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
from operations.kb.bench_client import load_bench_client
from operations.plan.drain import DrainPlan
from operations.plan.rank_state import rank_pending_restart
from operations.plan.resolver.types import Rank
from operations.plan.vocabulary import CanaryJson, Decision
from operations.settings import Settings

CanaryStage = Literal["canary", "resume", "promote", "paused", "rollback", "refused"]

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
    def rolls_rest(self) -> bool:
        """Whether the rest roll in this run (after a passed comparison, or promoted)."""
        return self.stage in ("canary", "resume", "promote")

    def summary(self) -> str:
        """One line for the plan's ranks line."""
        if self.stage is None:
            return f"canary: none ({self.skip})"
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
            compared = f", compared with rank {self.baseline} on {ANSWERS}, {speed} and {errors}"
        first = (
            f"rank(s) {', '.join(map(str, self.canary_batch))} first"
            if self.canary_batch
            else f"rank(s) {ranks} already on it (an earlier run was cut off)"
        )
        head = f"canary: {first} (new engine {self.engine}){compared}"
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
    baseline: Rank,
    target: str,
    module: str,
    module_file: str,
    drain: DrainPlan | None,
) -> list[str]:
    """The comparison program's command line (the host's python3 runs it; the canary's engine
    runs the benchmark client against both sides, so both are measured by one client). The
    speed arguments are the throughput check's (plan/throughput_plan.py)."""
    first = canary[0]
    meta = {
        "release": s.sglang_version,
        "engine": first.engine_env,
        "canary_ranks": [r.rank for r in canary],
        "baseline_rank": baseline.rank,
    }
    argv = ["python3", layout.CANARY_SCRIPT]
    for r in canary:
        argv += ["--canary", f"{r.unit_name}={layout.rank_api_base(s, r.rank)}"]
    argv += ["--baseline", f"{baseline.unit_name}={layout.rank_api_base(s, baseline.rank)}"]
    argv += ["--model", s.model_name, "--key-file", layout.SECRETS_FILE]
    argv += ["--service-user", s.service_user]
    argv += ["--max-slowdown", str(s.rollout.max_slowdown), "--soak", str(s.rollout.soak_s)]
    argv += ["--record", layout.CANARY_RECORD, "--target", target]
    argv += ["--meta", json.dumps(meta, sort_keys=True)]
    metrics = router_metrics_url(s, drain)
    if metrics is not None and drain is not None:
        argv += ["--router-metrics", metrics]
        for r in [*canary, baseline]:
            argv += ["--worker", f"{r.unit_name}={drain.worker(r.rank)}"]
    argv += ["--python", layout.env_python(first.engine_env)]
    argv += ["--module", module, "--module-file", module_file]
    argv += ["--tokenizer", first.model_path]
    argv += ["--input-len", str(s.throughput_input_len)]
    argv += ["--output-len", str(s.throughput_output_len)]
    argv += ["--concurrency-per-rank", str(s.throughput_concurrency_per_rank)]
    argv += ["--prompts-per-rank", str(s.throughput_prompts_per_rank)]
    argv += ["--timeout", str(s.throughput_timeout_s)]
    return argv


def router_metrics_url(s: Settings, drain: DrainPlan | None) -> str | None:
    """The router's Prometheus server (its /metrics: per-worker counters) as this host reaches
    it: the address the drain reaches the router at, on router.metrics_port (the router serves
    its metrics on its bind address). None: no router, or rolls are not drain-protected."""
    if drain is None or s.router is None:
        return None
    address = drain.router_url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    # The program reads BASE/metrics (throughput_client.metrics): the server, not its page.
    return layout.local_url(address, s.router.metrics_port)


def _refusal(record: CanaryRecord) -> str:
    failed = "; ".join(
        f"{row.check}: {row.canary} against {row.baseline} ({row.threshold})"
        for row in record.failed_rows()
    )
    ranks = ", ".join(map(str, record.canary_ranks))
    return (
        f"canary: rank(s) {ranks} on {record.engine} ({record.release}) failed against rank "
        f"{record.baseline_rank} at {record.at}: {failed or 'no row passed'}; nothing changes "
        f"on the host; fix: {FIX}"
    )


def _failed(
    record: CanaryRecord, ranks: Sequence[Rank], serving: Serving, state: Canary
) -> CanaryPlan:
    """A failed verdict for this target: roll a canary rank still on it back, then refuse. A
    rank still on it: its unit file is the target's, or its process does not run its file (a
    rollback cut off between the restore and the restart: the failed process still runs)."""
    by_rank = {r.rank: r for r in ranks}
    refusal = _refusal(record)
    on_target = [
        n
        for n in record.canary_ranks
        if n in by_rank
        and n in serving.ranks
        and (not runs_other(serving, by_rank[n]) or rank_pending_restart(serving, n) is not None)
    ]
    base = CanaryPlan(
        stage="refused",
        canary=list(record.canary_ranks),
        baseline=record.baseline_rank,
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


def canary_plan(
    settings: Settings,
    restart: Sequence[Rank],
    ranks: Sequence[Rank],
    serving: Serving,
    state: Canary,
    flags: str,
    drain: DrainPlan | None = None,
) -> CanaryPlan:
    """The canary's decision for this host. `restart`: the serving ranks this run restarts, in
    the order today's roll would (serve_plan.roll_plan's batches, flattened: RollPlan.rolled);
    `ranks`: every rank the plan wants; `state`: the CanaryState fact; `flags`: the ranks'
    flags digest; `drain`: how a rank leaves and rejoins the router (None: no router, no soak)."""
    s = settings
    rollout = s.rollout
    if rollout.strategy != "canary":
        return CanaryPlan(skip="rollout.strategy: rolling")
    target = verdict_target(flags, s)
    record = state.record if state.record is not None and state.record.target == target else None
    if record is not None and not record.ok:
        return _finish(s, _failed(record, ranks, serving, state), state)
    changed = [r for r in restart if runs_other(serving, r)]
    if not changed:
        why = "no serving rank's engine or flags change"
        return CanaryPlan(skip=f"{why} (a unit change that leaves the command line alone rolls)")
    size = max(1, s.restart_batch_size)
    if record is not None:
        plan = CanaryPlan(
            stage="paused" if rollout.pause else "promote",
            canary=list(record.canary_ranks),
            baseline=record.baseline_rank,
            rest=batches([r.rank for r in restart], size),
            release=record.release,
            engine=record.engine,
        )
        return _finish(s, plan, state)
    # Ranks already on the target with no verdict for it: a run killed after the canary batch.
    # They are the canary; one whose file is the target's but whose process does not run it
    # yet (killed between the write and the restart) restarts first, as the canary batch.
    moved = {r.rank for r in changed}
    already = [
        r
        for r in ranks
        if r.rank not in moved
        and (now := serving.ranks.get(r.rank)) is not None
        and now.running
        and not runs_other(serving, r)
    ]
    restarting = {r.rank for r in restart}
    stage: CanaryStage = "resume" if already else "canary"
    canary = already or changed[: rollout.canary_ranks]
    numbers = [r.rank for r in canary]
    first = [n for n in numbers if n in restarting]
    old = [r for r in changed if r.rank not in numbers and serving.ranks[r.rank].running]
    refused = CanaryPlan(stage="refused", canary=numbers)
    if not old:
        why = (
            "canary: no serving rank keeps the old engine to compare rank(s) "
            f"{', '.join(map(str, numbers))} with; set rollout.strategy: rolling"
        )
        return replace(refused, errors=[why])
    baseline = min(old, key=lambda r: r.rank)
    client = load_bench_client(s.sglang_version)
    if client is None:
        why = (
            f"canary: sglang {s.sglang_version} has no benchmark client in the knowledge base "
            "(knowledge/bench/) for the speed row: run scripts/gen_bench_client.py "
            f"{s.sglang_version} on the controller, or set rollout.strategy: rolling"
        )
        return replace(refused, errors=[why])
    plan = CanaryPlan(
        stage="paused" if rollout.pause else stage,
        canary=numbers,
        canary_batch=first,
        baseline=baseline.rank,
        rest=batches([r.rank for r in restart if r.rank not in first], size),
        release=s.sglang_version,
        engine=canary[0].engine_env,
        argv=compare_argv(s, canary, baseline, target, client.module, client.file, drain)
        + (["--pause"] if rollout.pause else []),
        # The old unit of each canary rank this run rewrites, kept for a rollback.
        backup={
            layout.rank_unit_path(n): f"{layout.CANARY_BACKUP_DIR}/{layout.unit_name(n)}"
            for n in first
            if n in moved
        },
    )
    return _finish(s, plan, state)


def _finish(s: Settings, plan: CanaryPlan, state: Canary) -> CanaryPlan:
    """The thresholds, the checks and the decision `plan --why` shows."""
    soak = plan.compares and any(w == "--router-metrics" for w in plan.argv)
    checks = [ANSWERS, SPEED, *([ERRORS] if soak else [])]
    done = replace(
        plan,
        checks=checks,
        max_slowdown=s.rollout.max_slowdown,
        soak_s=s.rollout.soak_s,
        soak=soak,
    )
    why = (
        f"rollout.strategy canary: {s.rollout.canary_ranks} rank(s) first, compared with the "
        f"lowest rank still on the old engine on {ANSWERS} ({ANSWERS_THRESHOLD}), {SPEED} (the "
        f"throughput client, at most {s.rollout.max_slowdown:.0%} slower) and {ERRORS} (the "
        f"router's per-worker failures over {s.rollout.soak_s} s; skipped without a router); "
        f"the verdict is kept in {layout.CANARY_RECORD}"
    )
    if state.problem is not None:
        why += f"; the host's record was not read: {state.problem}"
    return replace(done, decision=Decision("rollout", done.summary(), why))
