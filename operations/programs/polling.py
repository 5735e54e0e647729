"""Polling with backoff, for the host scripts that wait on something (wait_healthy.py: a rank's
/health; router_workers.py: the router's worker list and a drained rank's gauges).

A fixed sleep makes every wait a multiple of it: with 1 s, a rank that answers after 3.05 s is
seen at 4 s. These sleeps start short and grow, so what is ready soon (a drain with one short
request left, a worker the router lists at once) is seen within milliseconds, and what takes
minutes (a real rank loading its weights) is asked at most every `most` seconds.
"""

from __future__ import annotations

from collections.abc import Iterator


def backoff(first: float, growth: float, most: float) -> Iterator[float]:
    """The sleeps between polls: `first`, then each `growth` times the one before, at most
    `most`."""
    interval = first
    while True:
        yield interval
        interval = min(most, interval * growth)
