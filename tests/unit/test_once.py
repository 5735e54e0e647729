"""once.together: two fact-asking calls at the same time, each seeing the deploy's host."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import gevent
import gevent.event
import pytest
from pyinfra.context import ctx_host, host

from operations.facts.once import together


@pytest.fixture
def current_host() -> Iterator[object]:
    target = SimpleNamespace(connected=True, name="ct200")
    with ctx_host.use(target):
        yield target


def test_both_run_at_once_and_see_the_host(current_host: object) -> None:
    second_started = gevent.event.Event()

    def first() -> str:
        # Called in turn, `second` would start only after this returns: the wait times out.
        assert second_started.wait(timeout=10), "second did not run while first was waiting"
        return f"first on {host.name}"

    def second() -> str:
        second_started.set()
        return f"second on {host.name}"

    assert together(first, second) == ("first on ct200", "second on ct200")


def test_an_error_in_the_second_is_raised_after_both_ended(current_host: object) -> None:
    ended: list[str] = []

    def first() -> None:
        gevent.sleep(0)  # lets `second` run and fail first
        ended.append("first")

    def second() -> None:
        raise ValueError("ServingState: no answer")

    with pytest.raises(ValueError, match="no answer"):
        together(first, second)
    assert ended == ["first"]


def test_a_host_not_yet_connected_is_connected_once_before_both(current_host: object) -> None:
    connects: list[str] = []
    target = SimpleNamespace(
        connected=False, name="ct200", connect=lambda **kw: connects.append(kw["reason"])
    )
    with ctx_host.use(target):
        together(lambda: None, lambda: None)
    assert connects == ["to gather facts"]


def test_three_calls_run_at_once_and_the_first_error_in_order_is_raised(
    current_host: object,
) -> None:
    """gather asks three facts in one `together`: each waits here for the other two to start,
    which only works when all three run at once; of two failures, the earlier call's wins."""
    started = [gevent.event.Event() for _ in range(3)]

    def call(i: int, fail: bool) -> Callable[[], int]:
        def run() -> int:
            started[i].set()
            others = [e for j, e in enumerate(started) if j != i]
            assert all(e.wait(timeout=10) for e in others), f"call {i} ran alone"
            if fail:
                raise ValueError(f"call {i} failed")
            return i

        return run

    assert together(call(0, False), call(1, False), call(2, False)) == (0, 1, 2)
    for event in started:
        event.clear()
    with pytest.raises(ValueError, match="call 1 failed"):
        together(call(0, False), call(1, True), call(2, True))
