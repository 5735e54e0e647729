"""Before or after the ranks: the router's restart and the control-plane key take the place
that lets every drain speak the API, with the key, of the router running when it drains
(operations/plan/router_step.router_order)."""

from __future__ import annotations

import pytest

from operations.plan.router_step import router_order


@pytest.mark.parametrize(
    ("running", "moves", "key", "api_key", "first"),
    [
        # A move of a running router: first (the drains then speak the new router's API).
        (True, True, False, False, True),
        # A new control-plane key: the router takes it first, and so does every host's file.
        (True, False, True, False, True),
        (None, False, True, False, True),
        # A restart for its flags alone: where it always was, after the ranks.
        (True, False, False, False, False),
        # The ranks' API key changes: smg holds it for the ranks it starts with, so last.
        (True, False, True, True, False),
        (None, False, True, True, False),
        # Not running (a first deploy): smg is ready only once a rank is, so last.
        (False, True, True, False, False),
    ],
)
def test_the_router_goes_first_only_where_the_drains_need_it(
    running: bool | None, moves: bool, key: bool, api_key: bool, first: bool
) -> None:
    order = router_order(running, moves, key, api_key)
    assert order.first is first
    assert not order.refused
    assert bool(order.said) is first


def test_a_move_with_a_new_api_key_is_refused_with_what_to_do() -> None:
    order = router_order(True, True, False, True)
    assert not order.first
    assert "api_key_file" in order.refused
    assert "deploy the move first" in order.refused
