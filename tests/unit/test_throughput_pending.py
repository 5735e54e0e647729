"""A throughput check that failed or was cut off is run again by the next deploy (issue 43.6):
the host's marker (layout.THROUGHPUT_PENDING, which programs/throughput.py removes only when a
check passes) reaches the plan through the ServingState fact."""

from __future__ import annotations

import json
from pathlib import Path

from operations import layout
from operations.cli.status.throughput import ThroughputView
from operations.facts.serve import parse_serving
from operations.plan import throughput_plan as tp
from tests.unit.builders import make_settings
from tests.unit.test_throughput import _arg, ranks

FIXTURES = Path(__file__).resolve().parents[1] / "facts" / "serve.ServingState"


def test_the_fact_reads_the_marker() -> None:
    pending = json.loads((FIXTURES / "throughput-pending.json").read_text())
    assert parse_serving(pending["output"]).throughput_pending is True
    recorded = json.loads((FIXTURES / "toolkit-recorded.json").read_text())
    assert parse_serving(recorded["output"]).throughput_pending is False
    assert parse_serving([]).throughput_pending is False


def test_a_pending_check_runs_again_without_a_change_and_says_why() -> None:
    s = make_settings()
    quiet = tp.throughput_plan(s, ranks(), False, False, "digest1", {})
    assert quiet.run is None
    again = tp.throughput_plan(s, ranks(), False, False, "digest1", {}, pending=True)
    assert again.run is not None and again.decision is not None
    assert "the last check on this host did not pass" in again.decision.why
    # The program is told where the marker is: it makes it and removes it when a check passes.
    assert _arg(again.run.argv, "--pending") == [layout.THROUGHPUT_PENDING]
    # off stays off, whatever the host holds.
    off = make_settings(throughput_check="off")
    assert tp.throughput_plan(off, ranks(), False, False, "d", {}, pending=True).run is None


def test_status_says_a_pending_check_runs_again() -> None:
    view = ThroughputView.of([], pending=True)
    assert view.lines()[-1].endswith("the next deploy checks again")
    assert view.to_json()["pending"] is True
    assert ThroughputView.of([]).to_json()["pending"] is False
