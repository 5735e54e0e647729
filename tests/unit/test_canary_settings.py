"""The `rollout` setting (docs/reference/settings.md): its defaults are the schema's and Rollout's
alike, and every wrong value is one line naming rollout.<key>, what was found and what is
accepted, before any host is asked."""

from __future__ import annotations

import pytest

from operations.settings import Rollout, SettingsError, schema
from tests.unit.builders import make_settings


def refusal(**overrides: object) -> str:
    with pytest.raises(SettingsError) as caught:
        make_settings(**overrides)
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert "\n" not in problems[0]
    return problems[0]


def test_the_default_strategy_is_unset_and_the_schema_default_is_rollouts() -> None:
    # Unset: the plan decides (a canary on a serving host, today's roll on a first deploy).
    assert make_settings().rollout == Rollout()
    assert Rollout().strategy is None
    assert make_settings(rollout={"strategy": "rolling"}).rollout.strategy == "rolling"
    default = schema()["properties"]["rollout"]["default"]
    assert Rollout(**default) == Rollout()


def test_a_partial_mapping_keeps_the_other_defaults() -> None:
    rollout = make_settings(rollout={"strategy": "canary", "max_slowdown": 0.2}).rollout
    assert rollout == Rollout(strategy="canary", max_slowdown=0.2)
    assert isinstance(make_settings(rollout={"max_slowdown": 0.5}).rollout.max_slowdown, float)


@pytest.mark.parametrize(
    ("value", "named", "found"),
    [
        ({"strategy": "blue"}, "rollout.strategy", "found 'blue'"),
        ({"canary_ranks": 0}, "rollout.canary_ranks", "found 0"),
        ({"canary_ranks": True}, "rollout.canary_ranks", "found True"),
        ({"max_slowdown": 1}, "rollout.max_slowdown", "found 1"),
        ({"max_slowdown": 0}, "rollout.max_slowdown", "found 0"),
        ({"soak_s": -1}, "rollout.soak_s", "found -1"),
        ({"pause": "no"}, "rollout.pause", "found 'no'"),
        ({"soak": 60}, "rollout.soak", "{'soak': 60}"),
    ],
)
def test_a_wrong_key_is_one_line_naming_it(value: object, named: str, found: str) -> None:
    line = refusal(rollout=value)
    assert line.startswith("ct200: rollout = ")
    assert named in line and found in line and "accepted:" in line


def test_not_a_mapping_says_what_is_accepted() -> None:
    line = refusal(rollout="canary")
    assert "rollout = 'canary'" in line and "a mapping {strategy, canary_ranks" in line


def test_a_canary_needs_a_rank_left_on_the_old_engine() -> None:
    one = refusal(dp_size=1, rollout={"strategy": "canary"})
    assert "rollout.canary_ranks = 1 with dp_size 1" in one
    assert 'rollout.strategy "rolling"' in one and "on the controller" in one
    all_of_them = refusal(dp_size=2, rollout={"strategy": "canary", "canary_ranks": 2})
    assert "accepted: rollout.canary_ranks 1, or" in all_of_them
    # Rolling needs no baseline: any canary_ranks is only kept for a later canary.
    assert make_settings(dp_size=1, rollout={"canary_ranks": 4}).rollout.canary_ranks == 4
    seven = make_settings(rollout={"strategy": "canary", "canary_ranks": 7})
    assert seven.rollout.canary_ranks == 7
