"""`make demo-day2` (issue 39, point 12): a simulated CT200 the deploy already converged
(operations/simulated/converged.py, inventory/demo_day2.py). Its answers, read by the facts'
own parsers, give the plan nothing to do; a plain --dry shows no change; a pin change shows
the roll, batch by batch; status shows 8 healthy ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from operations import kb, layout
from operations.facts.model import parse_staging
from operations.facts.preflight import SECTION, parse_host_facts
from operations.facts.serve import parse_serving
from operations.facts.serve_status import parse_status
from operations.plan import host_plan
from operations.plan.engine_plan import EngineFacts
from operations.plan.host_plan import Gathered
from operations.settings import Layer, load
from operations.simulated import converged, group_data

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")


def converged_plan(**data: object) -> host_plan.HostReport:
    """The plan over the converged host's answers, as the facts' own parsers read them."""
    settings = converged.repository_settings()
    answers = converged.fake_responses(settings)
    found = parse_host_facts(answers[SECTION])
    serving = parse_serving(answers[converged.SERVING_SIGNATURE])
    staged = parse_staging(answers[converged.STAGING_SIGNATURE])
    report, _ = converged.bare_plan(settings)
    assert report.plan.engine is not None
    lock = f"{report.plan.engine.name}.lock"
    engine = EngineFacts(state=serving.engine or EngineFacts().state, locks={lock: "0" * 64})
    if data:
        everything = [Layer("--data", data), Layer("all", group_data.read("all"))]
        settings = load(converged.HOST, everything)
    model = found.model
    assert model is not None
    key = host_plan.model_key(settings, staged, None)
    facts = Gathered(
        host=found, serving=serving, staging=staged, model=model, model_key=key, engine=engine
    )
    return host_plan.decide(converged.HOST, settings, facts, kb.load())


def test_the_converged_host_gives_the_plan_nothing_to_do() -> None:
    report = converged_plan()
    assert report.ok, report.errors
    assert report.serve is not None and report.engine_step is not None
    roll = report.serve.roll
    assert (roll.start, roll.batches, roll.remove) == ([], [], []), roll
    assert len(roll.unchanged) == 8
    stale = [f.path for f in report.serve.files if f.read and f.changes]
    assert stale == [], stale
    assert not report.engine_step.install
    assert report.staging is not None and report.staging.what == "unchanged", report.staging


def test_another_pin_rolls_every_rank_in_batches() -> None:
    report = converged_plan(sglang_version="0.5.19")
    assert report.ok, report.errors
    assert report.serve is not None
    batches = [[r.rank for r in batch] for batch in report.serve.roll.batches]
    assert batches == [[r] for r in range(8)], batches


def test_status_reads_eight_healthy_ranks() -> None:
    settings = converged.repository_settings()
    lines = converged.fake_responses(settings)[converged.STATUS_SIGNATURE]
    status = parse_status(lines)
    assert status.health == {str(r): "200" for r in range(8)}
    assert sorted(status.ranks) == list(range(8))
    assert all(u.active == "active" for u in status.ranks.values())
    assert len(status.gpus) == 8


def _run(*args: str) -> str:
    result = subprocess.run(
        list(args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "80"},
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in out, out
    return out


def _changed_rows(out: str) -> list[str]:
    """The rows of pyinfra's table of detected changes that count a change."""
    table = out.split("Detected changes:", 1)[1].split("Detected changes may", 1)[0]
    return [row.strip() for row in table.splitlines() if "(@fake/ct200)" in row]


@pytest.mark.integration
def test_make_demo_day2_no_change_then_the_roll_then_status() -> None:
    plain = _run(PYINFRA, "inventory/demo_day2.py", "deploy.py", "--dry")
    assert _changed_rows(plain) == [], plain
    assert "nothing to restart" in plain, plain

    rolled = _run(
        PYINFRA, "inventory/demo_day2.py", "deploy.py", "--dry", "--data", "sglang_version=0.5.19"
    )
    assert "in batches [0] then [1] then [2]" in rolled, rolled
    rows = _changed_rows(rolled)
    for rank in range(8):
        assert any(f"restart batch {rank + 1}: restart sglang@{rank}.service" in r for r in rows)
    assert any(r.startswith("Engine | install") for r in rows), rows
    assert any(r.startswith("Smoke | chat requests") for r in rows), rows

    status = _run(sys.executable, "-m", "operations.status", "inventory/demo_day2.py")
    assert "8/8 ranks healthy" in status and "0.5.11 cu128" in status, status
    assert layout.unit_name(7) in status or "30007" in status, status


@pytest.mark.integration
def test_the_day2_demo_refuses_a_real_run() -> None:
    result = subprocess.run(
        [PYINFRA, "-y", "inventory/demo_day2.py", "deploy.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "--dry" in out and "Traceback" not in out, out
