"""The serve step's roll decisions (operations/plan/serve_plan.py roll_plan), from the resolved
ranks and the ServingState fact alone: which ranks start, which restart in which batches, what a
failed batch leaves behind and what a re-run (or a reboot in the middle of a roll) does next."""

from __future__ import annotations

import dataclasses

from operations.facts.serve import Serving, UnitState
from operations.plan import resolver
from operations.plan.planned_files import sha256
from operations.plan.rank_state import referenced_env_names, referenced_envs, referenced_models
from operations.plan.resolver import Rank
from operations.plan.serve_plan import roll_plan
from tests.unit.builders import facts, make_settings

KEY_OLD, KEY_NEW = "1111aaaa2222bbbb", "3333cccc4444dddd"


def ranks(key: str = KEY_OLD, **settings: object) -> list[Rank]:
    plan = resolver.resolve(make_settings(**settings), dataclasses.replace(facts(), model_key=key))
    assert not plan.errors, plan.errors
    return plan.ranks


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))[10:]


def serving_from(written: list[Rank], active: str = "active", **states: str) -> Serving:
    """A host whose unit files are `written` (as the deploy wrote them), all in `active`
    unless `states` says otherwise for a rank ("r3": "failed")."""
    return Serving(
        ranks={
            r.rank: UnitState(
                unit_sha256=sha256(r.unit),
                exec_start=exec_start(r.unit),
                load="loaded",
                active=states.get(f"r{r.rank}", active),
            )
            for r in written
        }
    )


def numbers(batches: list[list[Rank]]) -> list[list[int]]:
    return [[r.rank for r in b] for b in batches]


def test_a_bare_host_starts_every_rank_together() -> None:
    plan = roll_plan(ranks(), Serving(), batch_size=1)
    assert [r.rank for r in plan.start] == list(range(8))
    assert plan.batches == [] and plan.remove == []


def test_a_converged_host_changes_nothing() -> None:
    want = ranks()
    plan = roll_plan(want, serving_from(want), batch_size=1)
    assert plan.start == [] and plan.batches == [] and plan.remove == []
    assert [r.rank for r in plan.unchanged] == list(range(8))


def test_a_new_model_copy_rolls_every_rank_in_batches() -> None:
    old, new = ranks(KEY_OLD), ranks(KEY_NEW)
    assert all(KEY_NEW in r.unit and KEY_OLD not in r.unit for r in new)
    plan = roll_plan(new, serving_from(old), batch_size=3)
    assert numbers(plan.batches) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert plan.start == []


def test_a_new_engine_changes_the_unit_text_so_the_ranks_roll() -> None:
    old, new = ranks(), ranks(sglang_version="0.5.19", cuda_lane="cu129")
    assert old[0].engine_env != new[0].engine_env
    assert new[0].argv[0] == f"{new[0].engine_env}/bin/python"
    plan = roll_plan(new, serving_from(old), batch_size=1)
    assert numbers(plan.batches) == [[r] for r in range(8)]


def test_only_the_ranks_whose_own_unit_changed_restart() -> None:
    old = ranks()
    # Rank 5 was edited by hand on the host (or written by an older deploy): only it rolls.
    edited = [dataclasses.replace(r, unit=r.unit + "# edited\n") if r.rank == 5 else r for r in old]
    plan = roll_plan(old, serving_from(edited), batch_size=2)
    assert numbers(plan.batches) == [[5]]
    assert len(plan.unchanged) == 7


def test_after_a_failed_batch_the_rest_still_names_the_old_engine_and_model() -> None:
    """Batch [0, 1] was written and failed; the deploy stopped. What each unit file names is
    what a crash-restart or a reboot runs: ranks 2-7 still name the old environment and copy,
    and those stay referenced, so neither the engine prune nor the model prune removes them."""
    old, new = ranks(KEY_OLD), ranks(KEY_NEW, sglang_version="0.5.19", cuda_lane="cu129")
    host = serving_from([*new[:2], *old[2:]], r0="failed", r1="failed")
    unit = host.ranks[4]
    assert unit.engine_env() == old[4].engine_env and unit.model_path() == old[4].model_path
    assert referenced_envs(host) == {old[0].engine_env, new[0].engine_env}
    # What the engine's prune is told to keep, by name under ENGINE_ROOT/envs.
    names = referenced_env_names(host, "/opt/sglang")
    assert names == {old[0].engine_env.rsplit("/", 1)[1], new[0].engine_env.rsplit("/", 1)[1]}
    assert referenced_models(host) == {old[0].model_path, new[0].model_path}

    # Re-run with the same new settings: the failed ranks start (their unit is already new),
    # the others roll on from where the roll stopped.
    plan = roll_plan(new, host, batch_size=2)
    assert [r.rank for r in plan.start] == [0, 1]
    assert numbers(plan.batches) == [[2, 3], [4, 5], [6, 7]]

    # Or go back to the old settings: only the two rolled ranks change again.
    back = roll_plan(old, host, batch_size=2)
    assert [r.rank for r in back.start] == [0, 1] and back.batches == []


def test_a_reboot_in_the_middle_of_a_roll_continues_from_the_unit_files() -> None:
    """After a reboot every rank came back from its own unit file: rolled ones on the new
    engine, the others on the old. The next deploy restarts only the not-yet-rolled ones."""
    old, new = ranks(KEY_OLD), ranks(KEY_NEW)
    host = serving_from([*new[:3], *old[3:]])
    plan = roll_plan(new, host, batch_size=4)
    assert plan.start == [] and numbers(plan.batches) == [[3, 4, 5, 6], [7]]


def test_a_crash_looped_rank_is_started_not_rolled() -> None:
    want = ranks()
    plan = roll_plan(want, serving_from(want, r6="failed"), batch_size=1)
    assert [r.rank for r in plan.start] == [6] and plan.batches == []


def test_a_changed_api_key_restarts_every_serving_rank_in_batches() -> None:
    want = ranks()
    plan = roll_plan(want, serving_from(want), batch_size=4, secret_changed=True)
    assert numbers(plan.batches) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_dp_size_shrinking_removes_the_extra_units_and_leaves_the_rest_alone() -> None:
    plan = roll_plan(ranks(dp_size=4), serving_from(ranks()), batch_size=1)
    assert plan.remove == [4, 5, 6, 7]
    assert plan.batches == [] and [r.rank for r in plan.unchanged] == [0, 1, 2, 3]


# -- what runs is a fact (issue 31) ------------------------------------------------------------
# A deploy killed after a batch's unit files were written and before its restart: the files
# name the new release, the processes still run the old one. Before, roll_plan compared files
# only and said "every rank runs what the plan says: nothing to restart" on every later run.
STARTED = 1796066000


def killed_after_write(want: list[Rank], written: set[int], active: str = "active") -> Serving:
    """The host after such a kill: every unit file is `want`'s, every rank started at STARTED,
    the ranks in `written` had their file rewritten after that."""
    host = serving_from(want)
    return dataclasses.replace(
        host,
        ranks={
            r: dataclasses.replace(
                u,
                started_at=STARTED,
                main_pid=4000 + r,
                changed_at=STARTED + 30 if r in written else STARTED - 30,
                active=active,
            )
            for r, u in host.ranks.items()
        },
    )


def test_a_rank_whose_process_is_older_than_its_unit_file_is_pending_restart() -> None:
    from operations.plan.serve_plan import ServePlan

    want = ranks(sglang_version="0.5.19", cuda_lane="cu129")
    plan = roll_plan(want, killed_after_write(want, {3}), batch_size=1)
    assert numbers(plan.batches) == [[3]]
    assert plan.pending == {3: "its unit file changed after the process started"}
    summary = ServePlan(roll=plan).summary()
    assert "nothing to restart" not in summary and "pending restart (3: " in summary


def test_a_unit_systemd_was_not_reloaded_for_is_pending_restart() -> None:
    want = ranks()
    host = killed_after_write(want, set())
    host.ranks[5] = dataclasses.replace(host.ranks[5], need_reload=True)
    plan = roll_plan(want, host, batch_size=2)
    assert numbers(plan.batches) == [[5]] and set(plan.pending) == {5}


def test_an_api_key_file_newer_than_the_processes_rolls_them_all() -> None:
    want = ranks()
    host = dataclasses.replace(
        killed_after_write(want, set()), changed_at={"/etc/sglang/secrets.yaml": STARTED + 5}
    )
    plan = roll_plan(want, host, batch_size=4)
    assert numbers(plan.batches) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert set(plan.pending.values()) == {"the API key file changed after the process started"}


def test_a_unit_written_before_its_process_started_is_converged() -> None:
    want = ranks()
    plan = roll_plan(want, killed_after_write(want, set()), batch_size=1)
    assert plan.batches == [] and plan.pending == {}
    # Written in the second the process started: the roll writes before it restarts.
    same = killed_after_write(want, set())
    same.ranks[0] = dataclasses.replace(same.ranks[0], changed_at=STARTED)
    assert roll_plan(want, same, batch_size=1).batches == []


def test_a_stopped_rank_is_started_not_pending() -> None:
    want = ranks()
    host = killed_after_write(want, {2}, active="inactive")
    plan = roll_plan(want, host, batch_size=1)
    assert [r.rank for r in plan.start] == list(range(8)) and plan.pending == {}


def test_ranks_the_router_does_not_list_are_put_back_without_a_restart() -> None:
    """Issue 31: a run killed between a drain's `out` and its `in` leaves a converged rank out
    of the router; the plan puts back exactly the serving, unchanged ranks it does not list."""
    from operations import kb
    from operations.plan import drain
    from operations.plan.serve_plan import left_out

    s = make_settings(router={"host": "ct200", "port": 8000})
    plan, _, _ = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is not None and plan.list_url() == "http://127.0.0.1:8000/workers"
    want = ranks(router={"host": "ct200", "port": 8000})
    listed = {plan.worker(r): True for r in range(8) if r != 2}
    host = dataclasses.replace(serving_from(want), router_workers=listed)
    assert left_out(roll_plan(want, host, batch_size=1), host, plan) == [2]
    # Not read (the router did not answer): nothing is inferred.
    unread = dataclasses.replace(host, router_workers=None)
    assert left_out(roll_plan(want, unread, batch_size=1), unread, plan) == []
    # Rank 2 rolls anyway (its unit changed): its batch rejoins, no second `in`.
    changed = dataclasses.replace(host, ranks={**host.ranks})
    changed.ranks[2] = dataclasses.replace(host.ranks[2], unit_sha256="0" * 64)
    assert left_out(roll_plan(want, changed, batch_size=1), changed, plan) == []
    assert left_out(roll_plan(want, host, batch_size=1), host, None) == []
