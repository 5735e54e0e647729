"""The docs' samples are what the programs print: scripts/gen_doc_samples.py runs each on the
simulated hosts (plan, status) and compares with docs/samples/ and every doc's sample block;
a sample a change of the code left stale fails here (`make samples` rewrites them)."""

from __future__ import annotations

import pytest

from scripts import gen_doc_samples as gen

pytestmark = pytest.mark.integration  # starts the plan and status commands on @fake hosts


@pytest.fixture(scope="module")
def samples() -> dict[str, str]:
    return {s.name: gen.produce(s) for s in gen.SAMPLES}


def test_every_sample_and_every_docs_copy_is_the_programs_output(samples: dict[str, str]) -> None:
    assert gen.differences(samples) == []


def test_the_samples_show_what_the_docs_say_they_show(samples: dict[str, str]) -> None:
    assert "@fake/ct200: ready" in samples["plan-box"]
    assert "clients  http://127.0.0.1:30000/v1" in samples["plan-box"]
    assert "@fake/ct200: 8/8 ranks healthy" in samples["status"]
    assert (
        "throughput: " in samples["status-measured"]
        and "canary: last verdict FAILED" in (samples["status-measured"])
    )
    # The programs' own output fits a log's width; a captured line is one line, as printed.
    shown = [samples[s.name] for s in gen.SAMPLES if not s.captured]
    assert max(len(line) for text in shown for line in text.splitlines()) <= gen.WIDTH


def test_a_stale_copy_in_a_doc_is_found(samples: dict[str, str]) -> None:
    doc = "<!-- sample: status -->\n```text\nold output\n```\n<!-- /sample -->\n"
    assert gen.with_samples(doc, samples) != doc
    assert samples["status"] in gen.with_samples(doc, samples)


def test_the_captured_throughput_line_is_the_guards_on_the_captured_records() -> None:
    """The throughput-line sample is captured (the check runs minutes against doubles): it is
    what the guard says of the second captured record against the first, with the planned
    thresholds and the card's ceilings (operations/simulated/converged.py's plan)."""
    import json

    from operations.programs import throughput_guard as guard
    from operations.simulated import converged

    records = [json.loads(x) for x in (gen.CAPTURED / "throughput.jsonl").read_text().splitlines()]
    report, _ = converged.bare_plan(converged.repository_settings())
    assert report.throughput is not None and report.throughput.run is not None
    argv = report.throughput.run.argv

    def arg(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    verdict = guard.judge(records[1], records[:1], float(arg("--max-slowdown")), arg("--guard"))
    beside = guard.beside_ceilings(records[1], json.loads(arg("--ceilings")))
    line = f"{verdict.line}; {beside}\n"
    assert (gen.CAPTURED / "throughput-line.txt").read_text() == line
    # The records are the simulated host's own check: its release, workload and hardware.
    meta = json.loads(arg("--meta"))
    assert all(r["workload"] == meta["workload"] and r["gpu"] == meta["gpu"] for r in records)


def test_the_captured_verdict_table_is_the_tables_of_the_captured_record() -> None:
    """The verdict-table sample is the real comparison's output (captured with the fact's
    fixtures): the table canary_rows lays out for the record the program kept, and its last
    line; within a log's width with pyinfra's indent (runtime/host_lines.host_block)."""
    import json

    from operations.programs import canary_rows

    state = (gen.CAPTURED / "canary-state.txt").read_text().splitlines()
    (text,) = [line for line in state if line.startswith("text ")]
    record = json.loads(text.removeprefix("text "))
    shown = (gen.CAPTURED / "verdict-table.txt").read_text().splitlines()
    assert shown[:-1] == canary_rows.table(record["rows"])
    assert shown[-1] == canary_rows.last_line(record["rows"]) + "; the canary rolled back"
    assert max(len(line) for line in shown[:-1]) <= canary_rows.TABLE_WIDTH
