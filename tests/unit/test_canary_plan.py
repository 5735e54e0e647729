"""The canary rollout's stages, decided in the plan (operations/plan/canary_plan.py) from the
settings, what the ranks run and the host's verdict (facts/canary.py): pure, each stage here."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from operations import layout
from operations.facts.canary import Canary, CanaryRecord, VerdictRow
from operations.facts.serve import Serving, UnitState
from operations.plan import resolver
from operations.plan.canary_plan import (
    CanaryPlan,
    canary_plan,
    compare_argv,
    runs_other,
    verdict_target,
)
from operations.plan.planned_files import sha256
from operations.plan.resolver import Rank
from operations.plan.serve_plan import RollPlan, roll_plan, staged_roll
from operations.plan.throughput_plan import flags_digest
from tests.unit.builders import facts, make_settings

OLD = {"sglang_version": "0.5.11"}
NEW = {"sglang_version": "0.5.12"}
CANARY = {"rollout": {"strategy": "canary"}}
NOTHING = Canary()


def ranks(**settings: object) -> list[Rank]:
    s = make_settings(**settings)
    plan = resolver.resolve(s, dataclasses.replace(facts(), model_key="1111aaaa2222bbbb"))
    assert not plan.errors, plan.errors
    return plan.ranks


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))[10:]


def serving_from(written: list[Rank]) -> Serving:
    return Serving(
        ranks={
            r.rank: UnitState(
                unit_sha256=sha256(r.unit),
                exec_start=exec_start(r.unit),
                load="loaded",
                active="active",
            )
            for r in written
        }
    )


def decide(
    written: list[Rank], state: Canary = NOTHING, **settings: object
) -> tuple[CanaryPlan, list[list[int]]]:
    s = make_settings(**{**NEW, **CANARY, **settings})
    want = ranks(**{**NEW, **CANARY, **settings})
    serving = serving_from(written)
    roll = roll_plan(want, serving, s.restart_batch_size)
    plan = canary_plan(s, roll.rolled, want, serving, state, flags_digest(want))
    staged = staged_roll(roll, plan, s.restart_batch_size)
    return plan, [[r.rank for r in b] for b in staged.batches]


def record(ok: bool, rolled_back: bool = False, paused: bool = False) -> CanaryRecord:
    row = VerdictRow("speed: output tok/s", "1520.4", "1102.7", "<=10% slower", ok)
    return CanaryRecord(
        target=verdict_target(flags_digest(ranks(**NEW, **CANARY)), make_settings(**NEW, **CANARY)),
        release="0.5.12",
        engine=ranks(**NEW)[0].engine_env,
        canary_ranks=(0,),
        baseline_rank=1,
        at="2026-12-06T18:00:00Z",
        ok=ok,
        paused=paused,
        rows=(VerdictRow("answers: known sum", "742", "742", "exact", True), row),
        rolled_back=rolled_back,
    )


def test_rolling_is_todays_roll() -> None:
    plan, order = decide(ranks(**OLD), rollout={"strategy": "rolling"})
    assert plan.stage is None and plan.skip == "rollout.strategy: rolling"
    assert order == [[r] for r in range(8)]


def test_a_new_engine_rolls_the_canary_first_then_compares_then_the_rest() -> None:
    plan, order = decide(ranks(**OLD), restart_batch_size=2)
    assert plan.stage == "canary"
    assert plan.canary == [0] and plan.canary_batch == [0] and plan.baseline == 1
    assert plan.rest == [[1, 2], [3, 4], [5, 6], [7]]
    assert order == [[0], [1, 2], [3, 4], [5, 6], [7]]
    assert plan.backup == {layout.rank_unit_path(0): f"{layout.CANARY_BACKUP_DIR}/sglang@0.service"}
    # No router: no soak, and the plan says so.
    assert plan.checks == ["answers", "speed"] and not plan.soak
    assert "no errors row (no router: the soak is skipped)" in plan.summary()
    assert plan.baselines == [1, 2, 3]
    assert "compared with ranks 1, 2, 3 (their median) on answers, speed (<=10% slower)" in (
        plan.summary()
    )
    assert plan.decision is not None and plan.decision.what == "rollout"


def test_two_canary_ranks_and_the_lowest_old_rank_as_baseline() -> None:
    plan, order = decide(ranks(**OLD), rollout={"strategy": "canary", "canary_ranks": 2})
    assert plan.canary == [0, 1] and plan.baseline == 2 and plan.baselines == [2, 3, 4]
    assert order[0] == [0, 1]


def test_a_comment_or_the_key_file_alone_is_no_canary() -> None:
    want = ranks(**NEW, **CANARY)
    commented = [dataclasses.replace(r, unit="# an older comment\n" + r.unit) for r in want]
    plan, order = decide(commented)
    assert plan.stage is None and "engine or flags" in plan.skip
    assert order == [[r] for r in range(8)]  # the unit text changed: today's roll
    # Quoting alone is no change: the line is compared as the words it runs.
    serving = serving_from(want)
    line = serving.ranks[0].exec_start or ""
    quoted = dataclasses.replace(serving.ranks[0], exec_start=line.replace(" -m ", ' "-m" '))
    assert not runs_other(Serving(ranks={0: quoted}), want[0])
    # A key added or removed: `--config SECRETS_FILE` is not an engine or flags change.
    keyed = dataclasses.replace(want[0], argv=[*want[0].argv, "--config", layout.SECRETS_FILE])
    assert not runs_other(serving, keyed)


def test_a_run_killed_after_the_canary_batch_resumes_with_the_comparison() -> None:
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    plan, order = decide([new[0], *old[1:]])
    assert plan.stage == "resume" and plan.canary == [0] and plan.canary_batch == []
    assert plan.baseline == 1 and plan.compares and plan.backup == {}
    assert order == [[r] for r in range(1, 8)]


def test_a_passed_verdict_promotes_without_comparing_again() -> None:
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    plan, order = decide([new[0], *old[1:]], Canary(record(ok=True)))
    assert plan.stage == "promote" and not plan.compares
    assert order == [[r] for r in range(1, 8)]


def test_pause_stops_after_the_verdict_and_a_run_without_it_promotes() -> None:
    paused: dict[str, object] = {"rollout": {"strategy": "canary", "pause": True}}
    plan, order = decide(ranks(**OLD), NOTHING, **paused)
    assert plan.stage == "paused" and plan.compares and order == [[0]]
    assert "set rollout.pause false to promote" in plan.summary()
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    plan, order = decide([new[0], *old[1:]], Canary(record(ok=True)), **paused)
    assert plan.stage == "paused" and order == []


def test_a_failed_verdict_is_refused_by_name_before_any_change() -> None:
    plan, order = decide(ranks(**OLD), Canary(record(ok=False, rolled_back=True)))
    assert plan.stage == "refused" and order == []
    [line] = plan.errors
    assert "rank(s) 0" in line and "speed: output tok/s: 1102.7 against 1520.4" in line
    assert "2026-12-06T18:00:00Z" in line and "rollout.strategy: rolling" in line
    assert "roll back the pin" in line


def test_a_failed_canary_still_on_the_target_rolls_back_from_its_backup() -> None:
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    state = Canary(record(ok=False), backups={"sglang@0.service": "c" * 64})
    plan, order = decide([new[0], *old[1:]], state)
    assert plan.stage == "rollback" and plan.errors == [] and order == []
    assert plan.restore == {
        f"{layout.CANARY_BACKUP_DIR}/sglang@0.service": layout.rank_unit_path(0)
    }
    assert "roll back the pin" in plan.refusal
    # No trusted backup: nothing to restore from, refused before any change.
    plan, _ = decide([new[0], *old[1:]], Canary(record(ok=False)))
    assert plan.stage == "refused" and "no trusted copy" in plan.errors[0]


def test_a_rollback_cut_off_after_its_restore_restarts_the_failed_process() -> None:
    # The unit file is the old one again, its process (started before the restore) still the
    # failed canary's: the rollback runs again rather than being refused with it serving.
    old = ranks(**OLD)
    serving = serving_from(old)
    restored = dataclasses.replace(serving.ranks[0], started_at=100, changed_at=200)
    serving = dataclasses.replace(serving, ranks={**serving.ranks, 0: restored})
    s = make_settings(**{**NEW, **CANARY})
    want = ranks(**NEW, **CANARY)
    state = Canary(record(ok=False), backups={"sglang@0.service": "c" * 64})
    roll = roll_plan(want, serving, s.restart_batch_size)
    plan = canary_plan(s, roll.rolled, want, serving, state, flags_digest(want))
    assert plan.stage == "rollback" and plan.canary == [0], plan
    # Restarted on the old file since: nothing left to roll back, refused by name.
    settled = dataclasses.replace(restored, started_at=300)
    serving = dataclasses.replace(serving, ranks={**serving.ranks, 0: settled})
    plan = canary_plan(s, roll.rolled, want, serving, state, flags_digest(want))
    assert plan.stage == "refused" and plan.errors == [plan.refusal]


def test_a_changed_threshold_judges_again_and_pause_alone_does_not() -> None:
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    failed = Canary(record(ok=False, rolled_back=True))
    plan, order = decide(ranks(**OLD), failed, rollout={"strategy": "canary", "max_slowdown": 0.3})
    assert plan.stage == "canary" and order[0] == [0], plan
    assert "--max-slowdown" in plan.argv and "0.3" in plan.argv
    # A passed verdict while paused: pause: false promotes it (pause is no part of the target).
    paused = Canary(record(ok=True, paused=True))
    plan, _ = decide([new[0], *old[1:]], paused)
    assert plan.stage == "promote", plan


def test_a_verdict_for_another_target_is_not_this_ones() -> None:
    stale = dataclasses.replace(record(ok=False, rolled_back=True), target="0" * 64)
    plan, _ = decide(ranks(**OLD), Canary(stale))
    assert plan.stage == "canary"


def test_the_comparison_argv() -> None:
    from operations.plan.throughput_plan import load_flags

    s = make_settings(**NEW, **CANARY)
    want = ranks(**NEW, **CANARY)
    argv = compare_argv(s, want[:1], want[1:3], "f" * 64, None, [5])
    assert argv[:2] == ["python3", layout.CANARY_SCRIPT]

    def arg(flag: str) -> list[str]:
        return [argv[i + 1] for i, w in enumerate(argv) if w == flag]

    assert arg("--canary") == [f"sglang@0.service={layout.rank_api_base(s, 0)}"]
    assert arg("--baseline") == [
        f"sglang@1.service={layout.rank_api_base(s, 1)}",
        f"sglang@2.service={layout.rank_api_base(s, 2)}",
    ]
    assert arg("--held") == ["sglang@5.service"]
    assert arg("--max-slowdown") == ["0.1"] and arg("--soak") == ["60"]
    assert arg("--record") == [layout.CANARY_RECORD] and arg("--target") == ["f" * 64]
    assert json.loads(arg("--meta")[0]) == {
        "release": "0.5.12",
        "engine": want[0].engine_env,
        "canary_ranks": [0],
        "baseline_rank": 1,
        "baseline_ranks": [1, 2],
    }
    assert arg("--router-metrics") == [] and arg("--model") == [s.model_name]
    # The speed row's load is the throughput check's, written by its one writer.
    assert argv[-len(load_flags(s)) :] == load_flags(s)


def test_behind_a_router_the_errors_row_reads_its_per_worker_counters() -> None:
    from operations import kb as kbmod
    from operations.plan import drain as drainmod

    router = {"router": {"host": "ct200", "port": 8000}}
    s = make_settings(**NEW, **CANARY, **router)
    drain, _, _ = drainmod.decide("ct200", s, [("ct200", s)], kbmod.load())
    assert drain is not None
    want = ranks(**NEW, **CANARY, **router)
    argv = compare_argv(s, want[:1], want[1:2], "f" * 64, drain)
    at = argv.index("--router-metrics")
    assert argv[at + 1] == "http://127.0.0.1:29000"
    workers = [argv[i + 1] for i, w in enumerate(argv) if w == "--worker"]
    assert workers == [f"sglang@0.service={drain.worker(0)}", f"sglang@1.service={drain.worker(1)}"]


def test_the_serve_plan_carries_the_canary_and_refuses_a_failed_one() -> None:
    from operations.plan.serve_plan import serve_plan

    s = make_settings(**NEW, **CANARY)
    want = ranks(**NEW, **CANARY)
    target = flags_digest(want)
    serve = serve_plan(s, want, serving_from(ranks(**OLD)), None, None, None, None, NOTHING, target)
    assert serve.canary is not None and serve.canary.stage == "canary"
    assert [r.rank for r in serve.roll.batches[0]] == [0]
    assert "canary: rank(s) 0 first" in serve.summary()
    assert serve.to_json()["canary"] is not None
    failed = Canary(record(ok=False, rolled_back=True))
    serve = serve_plan(s, want, serving_from(ranks(**OLD)), None, None, None, None, failed, target)
    assert any(e.startswith("canary: rank(s) 0") for e in serve.errors)
    assert serve.roll.batches == [] and len(serve.roll.held) == 8


def stopped(serving: Serving, *numbers: int) -> Serving:
    """The ranks named not serving (crashed): their unit files stay what they were."""
    down = {n: dataclasses.replace(serving.ranks[n], active="failed") for n in numbers}
    return dataclasses.replace(serving, ranks={**serving.ranks, **down})


def staged(
    serving: Serving, state: Canary = NOTHING, **settings: object
) -> tuple[CanaryPlan, RollPlan]:
    s = make_settings(**{**NEW, **CANARY, **settings})
    want = ranks(**{**NEW, **CANARY, **settings})
    roll = roll_plan(want, serving, s.restart_batch_size)
    plan = canary_plan(s, roll.rolled, want, serving, state, flags_digest(want), start=roll.start)
    return plan, staged_roll(roll, plan, s.restart_batch_size)


def numbers(found: list[Rank]) -> list[int]:
    return [r.rank for r in found]


def test_a_rank_down_before_a_canary_starts_only_after_the_verdict() -> None:
    plan, roll = staged(stopped(serving_from(ranks(**OLD)), 5))
    assert plan.stage == "canary" and plan.canary == [0] and plan.start_after == [5]
    assert roll.start == [] and numbers(roll.start_after) == [5] and roll.stopped == []
    assert numbers(roll.batches[0]) == [0]
    assert "--held" in plan.argv and "sglang@5.service" in plan.argv
    assert "rank(s) 5 not serving: started after the verdict passes" in plan.summary()


def test_ranks_added_by_a_larger_dp_size_wait_for_the_verdict_too() -> None:
    serving = serving_from(ranks(**OLD, dp_size=4))
    plan, roll = staged(serving, dp_size=6)
    assert plan.start_after == [4, 5] and roll.start == []
    # Paused: they stay stopped, said by name, until a run promotes.
    paused: dict[str, Any] = {"rollout": {"strategy": "canary", "pause": True}}
    plan, roll = staged(serving, dp_size=6, **paused)
    assert plan.stopped == [4, 5] and plan.start_after == []
    assert numbers(roll.stopped) == [4, 5] and roll.start == []
    assert "rank(s) 4, 5 not serving: stay stopped" in plan.summary()


def test_after_a_failed_verdict_a_rank_down_stays_stopped_and_is_named() -> None:
    failed = Canary(record(ok=False, rolled_back=True))
    plan, roll = staged(stopped(serving_from(ranks(**OLD)), 6), failed)
    assert plan.stage == "refused" and plan.stopped == [6]
    assert roll.start == []
    assert "rank(s) 6 not serving stay stopped" in plan.errors[0]


def test_a_canary_an_earlier_run_left_unhealthy_is_the_canary_again() -> None:
    # Rank 0's unit names the new engine, it is not serving, its old unit is backed up: it
    # starts again as the canary (health-gated, rolled back onto the backup if it fails).
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    serving = stopped(serving_from([new[0], *old[1:]]), 0)
    state = Canary(backups={"sglang@0.service": "c" * 64})
    plan, roll = staged(serving, state)
    assert plan.stage == "resume" and plan.canary == [0] and plan.canary_batch == [0]
    assert plan.backup == {} and plan.start_after == []
    assert numbers(roll.batches[0]) == [0]
    # Failing again in its batch, it goes back onto the earlier run's copy of its old unit.
    assert plan.restore_batch == {
        f"{layout.CANARY_BACKUP_DIR}/sglang@0.service": layout.rank_unit_path(0)
    }
    # Without a backup it is no canary to roll back: it waits for the verdict like any rank.
    plan, _ = staged(serving)
    assert plan.stage == "canary" and plan.canary == [1] and plan.start_after == [0]


def test_a_failed_canary_that_is_down_is_rolled_back_never_started_on_its_unit() -> None:
    old, new = ranks(**OLD), ranks(**NEW, **CANARY)
    serving = stopped(serving_from([new[0], *old[1:]]), 0)
    state = Canary(record(ok=False), backups={"sglang@0.service": "c" * 64})
    plan, roll = staged(serving, state)
    assert plan.stage == "rollback" and plan.stopped == [] and plan.canary == [0]
    assert roll.start == [] and roll.batches == []


def test_the_strategy_unset_is_a_canary_on_a_serving_host_and_todays_roll_on_a_first() -> None:
    unset: dict[str, Any] = {"rollout": {}}
    plan, order = decide(ranks(**OLD), **unset)
    assert plan.stage == "canary" and order[0] == [0]
    assert plan.decision is not None and "rollout.strategy unset (canary)" in plan.decision.why
    # A first deploy: nothing serves, every rank starts as today.
    s = make_settings(**NEW, **unset)
    want = ranks(**NEW, **unset)
    roll = roll_plan(want, Serving(), s.restart_batch_size)
    first = canary_plan(s, roll.rolled, want, Serving(), NOTHING, "f", start=roll.start)
    assert first.stage is None and "a first deploy rolls as today" in first.skip
    assert numbers(staged_roll(roll, first, 1).start) == list(range(8))
    # Explicit settings win: rolling rolls; and where a canary cannot be compared the unset
    # strategy rolls as today, said, where `canary` by name is refused.
    plan, order = decide(ranks(**OLD), rollout={"strategy": "rolling"})
    assert plan.stage is None and order == [[r] for r in range(8)]
    lone = stopped(serving_from(ranks(**OLD)), *range(1, 8))
    plan, _ = staged(lone, **unset)
    assert plan.stage is None and "no serving rank keeps the old engine" in plan.skip
    assert "rollout.strategy unset: rolls as today" in plan.skip
    plan, _ = staged(lone)
    assert plan.stage == "refused" and "no serving rank keeps the old engine" in plan.errors[0]


def test_a_failed_verdict_is_judged_again_by_its_time_and_only_by_it() -> None:
    failed = Canary(record(ok=False, rolled_back=True))
    line = decide(ranks(**OLD), failed)[0].errors[0]
    assert "--data canary_judge_again=2026-12-06T18:00:00Z" in line
    plan, order = decide(ranks(**OLD), failed, canary_judge_again="2026-12-06T18:00:00Z")
    assert plan.stage == "canary" and order[0] == [0] and plan.compares
    assert plan.judged_again == "2026-12-06T18:00:00Z"
    assert "judging the failed verdict of 2026-12-06T18:00:00Z again" in plan.summary()
    # Another time names no verdict of the host's: refused as before, and --why says so.
    plan, _ = decide(ranks(**OLD), failed, canary_judge_again="2026-12-01T00:00:00Z")
    assert plan.stage == "refused"
    assert plan.decision is not None and "names no failed verdict" in plan.decision.why
