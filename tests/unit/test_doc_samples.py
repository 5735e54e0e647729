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
    assert max(len(line) for text in samples.values() for line in text.splitlines()) <= gen.WIDTH


def test_a_stale_copy_in_a_doc_is_found(samples: dict[str, str]) -> None:
    doc = "<!-- sample: status -->\n```text\nold output\n```\n<!-- /sample -->\n"
    assert gen.with_samples(doc, samples) != doc
    assert samples["status"] in gen.with_samples(doc, samples)
