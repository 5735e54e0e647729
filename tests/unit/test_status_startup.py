"""Each rank's last start in `status` and `status --json`: the probe's "phases" lines
(programs/serving_probe.py, read with programs/startup_phases.py in the pinned release's words)
parsed by the ServingStatus fact, carried per rank, shown as "start-up N s"."""

from __future__ import annotations

import json

from rich.console import Console

from operations.cli import status as st
from operations.facts.serve import RankStart
from operations.facts.serve_status import ServingStatus, parse_start, parse_status
from operations.plan.startup import startup_patterns
from tests.unit.builders import make_settings
from tests.unit.test_status import output

# The probe's line for 0.5.10's journal
# (tests/facts/serve_status.ServingStatus/start-up-phases.json).
CASE = "start-up-phases"


def test_the_probes_phases_line_is_read_into_each_ranks_start() -> None:
    status = parse_status(output(CASE))
    assert status.starts["0"] == RankStart(
        healthy_s=131.5,
        weights_s=4.58,
        graphs_s=114.02,
        graphs=1,
        warmup_s=7.5,
        last_phase="ready",
        last_at=131.5,
    )
    assert status.starts["1"] == RankStart(error="error FileNotFoundError")


def test_a_start_still_under_way_keeps_its_last_phase_and_nones() -> None:
    line = json.dumps({"last_phase": "weight_load_end", "last_at": 12.0, "weights_s": 9.5})
    assert parse_start(line) == RankStart(weights_s=9.5, last_phase="weight_load_end", last_at=12.0)


def test_an_unreadable_answer_is_said_not_raised() -> None:
    assert parse_start("[1, 2]").error == "unreadable start-up phases: '[1, 2]'"
    assert parse_start("{not json").error == "unreadable start-up phases: '{not json'"
    assert parse_start('{"healthy_s": "soon", "graphs": true}') == RankStart()


def test_the_fact_asks_each_rank_for_its_start_in_the_pinned_releases_words() -> None:
    settings = make_settings(dp_size=2, sglang_version="0.5.10")
    args = st.fact_args(settings, "ct200")
    assert args["start_units"] == {"0": "sglang@0.service", "1": "sglang@1.service"}
    assert args["phases"] == startup_patterns("0.5.10") != ""
    command = ServingStatus().command(**args).get_raw_value()
    assert "--phases" in command and "1=sglang@1.service" in command


def test_status_json_and_the_table_show_each_ranks_start() -> None:
    settings = make_settings(dp_size=2, server_host="127.0.0.10")
    r = st.host_result("ct200", settings, parse_status(output(CASE)))
    doc = json.loads(json.dumps(st.to_json([r])))
    first, second = doc["hosts"]["ct200"]["ranks"]
    assert first["startup"]["healthy_s"] == 131.5 and first["startup"]["graphs"] == 1
    assert second["startup"]["error"] == "error FileNotFoundError"
    console = Console(record=True, width=260)
    st.print_results([r], console=console)
    text = console.export_text()
    assert "start-up" in text and "132 s" in text and "error FileNotFoundError" in text
