"""`status`'s canary lines and JSON (operations/cli/status/canary.py): the last verdict from the
status fact's own command (one round trip), which ranks run which command line, and what the
next deploy does with a mixed host. The records are the CanaryState fixtures'
(tests/facts/canary.CanaryState/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from operations.cli.status.canary import CanaryView, groups
from operations.facts.canary import parse_canary
from operations.facts.serve import UnitState
from operations.facts.serve_status import ServingStatus, parse_status

FIXTURES = Path(__file__).resolve().parents[1] / "facts" / "canary.CanaryState"
OLD = "/opt/sglang/envs/0.5.11-cu128-fb8f6a42/bin/python"
NEW = "/opt/sglang/envs/0.5.12-cu128-1a2b3c4d/bin/python"


def unit(python: str, rank: int, *extra: str) -> UnitState:
    words = [python, "-m", "sglang.launch_server", "--attention-backend", "flashinfer", *extra]
    words += ["--config", "/etc/sglang/secrets.yaml", "--port", str(30000 + rank)]
    return UnitState(unit_sha256="a" * 64, exec_start=" ".join(words), load="loaded")


def host(canary_at: dict[int, str], size: int = 8) -> dict[int, UnitState]:
    return {r: unit(canary_at.get(r, OLD), r) for r in range(size)}


def view(fixture: str, units: dict[int, UnitState]) -> CanaryView:
    lines = json.loads((FIXTURES / f"{fixture}.json").read_text())["output"]
    return CanaryView.of(parse_canary(lines), units, sorted(units))


def fact(fixture: str) -> dict[str, Any]:
    """What the fixture says the fact reads (its "fact"), as JSON: not the parser's word."""
    read: dict[str, Any] = json.loads((FIXTURES / f"{fixture}.json").read_text())["fact"]
    return read


def test_one_command_line_and_no_verdict_says_nothing() -> None:
    shown = view("none", host({}))
    assert shown.lines() == []
    assert shown.to_json()["mixed"] is False
    assert shown.to_json()["groups"] == [
        {"ranks": list(range(8)), "engine": "0.5.11-cu128-fb8f6a42"}
    ]


def test_the_port_and_the_key_file_are_no_difference() -> None:
    units = host({})
    units[3] = UnitState(
        unit_sha256="b" * 64,
        exec_start=f"{OLD} -m sglang.launch_server --attention-backend flashinfer --port 30003",
        load="loaded",
    )
    assert len(groups(units, list(range(8)))) == 1


def test_a_flags_change_alone_is_mixed() -> None:
    units = host({})
    units[0] = unit(OLD, 0, "--mem-fraction-static", "0.8")
    found = groups(units, list(range(8)))
    assert [g.ranks for g in found] == [(1, 2, 3, 4, 5, 6, 7), (0,)]


def test_a_passed_canary_not_promoted_yet_is_named_with_its_engine() -> None:
    shown = view("passed", host({0: NEW}))
    text = "\n".join(shown.lines())
    assert "last verdict passed (rank 0 on 0.5.12-cu128-1a2b3c4d against rank 1" in text
    assert "ranks 1, 2, 3, 4, 5, 6, 7 on 0.5.11-cu128-fb8f6a42; rank 0 on 0.5.12" in text
    assert "the next deploy promotes" in text
    data = shown.to_json()
    assert data["mixed"] is True and data["canary_ranks"] == [0]
    assert data["record"] is not None and data["record"]["ok"] is True


def test_a_promoted_canary_says_every_rank_runs_one_line() -> None:
    shown = view("passed", host({r: NEW for r in range(8)}))
    assert shown.lines() == [
        "  canary: last verdict passed (rank 0 on 0.5.12-cu128-1a2b3c4d against rank 1, "
        "2026-12-06T18:00:00Z): every rank runs one command line "
        "(ranks 0, 1, 2, 3, 4, 5, 6, 7 on 0.5.12-cu128-1a2b3c4d)"
    ]


def test_a_failed_verdict_before_its_rollback_says_the_next_deploy_rolls_back() -> None:
    lines = view("failed", host({0: NEW})).lines()
    assert "last verdict FAILED" in lines[0]
    assert "not rolled back yet" in lines[0] and "rolls rank 0 back" in lines[0]
    assert "refused" in lines[1]
    # The program's own rows (scripts/capture_canary_records.py): speed alone failed.
    (speed,) = [row for row in fact("failed")["record"]["rows"] if not row["passed"]]
    assert speed["check"] == "speed"
    assert lines[2:] == [
        f"    speed: canary {speed['canary']}, baseline {speed['baseline']} "
        f"(threshold {speed['threshold']})"
    ]


def test_a_rolled_back_verdict_names_the_failed_row() -> None:
    lines = view("failed-rolled-back", host({})).lines()
    assert "FAILED" in lines[0] and "rolled back: ranks 0, 1" in lines[0]
    assert any(line.startswith("    speed") for line in lines)


def test_a_record_not_trusted_is_said_and_a_mixed_host_still_named() -> None:
    lines = view("foreign-owner", host({0: NEW})).lines()
    assert lines[0].startswith("  canary record not read: /var/lib/sglang-deploy/canary.json is")
    assert "no canary verdict names them" in lines[1]


def test_the_status_fact_reads_the_verdict_in_its_one_command() -> None:
    command = ServingStatus().command("/opt/sglang", "/dev/shm/m", canary=True).get_raw_value()
    assert "/var/lib/sglang-deploy/canary.json" in command
    assert command.count("sed 's/^/canary /'") == 1
    lines = json.loads((FIXTURES / "failed.json").read_text())["output"]
    read = parse_status(["now 1", *(f"canary {line}" for line in lines)])
    assert read.canary_lines == lines
    record = parse_canary(read.canary_lines).record
    assert record is not None and not record.ok


@pytest.mark.parametrize(
    "fixture", ["none", "passed", "failed", "failed-rolled-back", "garbled", "foreign-owner"]
)
def test_json_holds_the_record_as_read_and_each_command_lines_ranks(fixture: str) -> None:
    """`status --json`'s canary, through JSON and back: the record the fixture says the fact
    reads (or why none), the ranks it judged, and the two command lines' ranks and engines."""
    read = fact(fixture)
    record = read["record"]
    shown = json.loads(json.dumps(view(fixture, host({0: NEW})).to_json(), allow_nan=False))
    assert shown == {
        "record": record,
        "problem": read["problem"],
        "canary_ranks": [0] if record is not None else [],
        "mixed": True,
        "groups": [
            {"ranks": [1, 2, 3, 4, 5, 6, 7], "engine": "0.5.11-cu128-fb8f6a42"},
            {"ranks": [0], "engine": "0.5.12-cu128-1a2b3c4d"},
        ],
    }
    assert (record is None) == (fixture in ("none", "garbled", "foreign-owner"))
    assert (read["problem"] is None) == (fixture not in ("garbled", "foreign-owner"))
