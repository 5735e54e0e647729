"""`make demo-day2` (issue 39, point 12): a simulated CT200 the deploy already converged
(operations/simulated/converged.py, inventory/demo_day2.py). Its answers, read by the facts'
own parsers, give the plan nothing to do; a plain --dry shows no change; a pin change shows
the roll, batch by batch; status shows 8 healthy ranks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from operations import kb, layout
from operations.facts.model import parse_staging
from operations.facts.preflight import SECTION, parse_host_facts
from operations.facts.serve import parse_serving
from operations.facts.serve_status import parse_status
from operations.plan import host_plan
from operations.plan.engine_plan import EngineFacts
from operations.plan.host_plan import Gathered
from operations.settings import Layer, Settings, load
from operations.simulated import converged, group_data
from tests.unit.widths import ours_wider_than

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")


def converged_facts(**data: object) -> tuple[Settings, Gathered]:
    """The settings (the repository's, `data` over them) and the converged host's facts, as the
    facts' own parsers read its answers."""
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
    return settings, facts


def converged_plan(**data: object) -> host_plan.HostReport:
    """The plan over the converged host's answers."""
    settings, facts = converged_facts(**data)
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


def _unproven(report: host_plan.HostReport) -> list[str]:
    return [w for w in report.plan.warnings if "is unproven:" in w]


def test_the_engine_the_check_passed_in_on_these_gpus_is_proven_not_unproven() -> None:
    """Issue 44: the converged host's engine check passed on its GPUs and recorded it: the plan
    says proven, with the day, instead of warning that 0.5.11's cu129 kernel is unproven."""
    report = converged_plan()
    assert _unproven(report) == [], report.plan.warnings
    (proven,) = [d for d in report.plan.decisions if d.what == "proven"]
    day = time.strftime("%Y-%m-%d", time.gmtime(converged.STARTED))
    assert proven.value == f"on this host's GPUs on {day} (the engine check)", proven
    assert "driver 570.172.08" in proven.why and "sglang-kernel 0.4.2+cu129" in proven.why
    # Another release is another environment: nothing proves it yet.
    assert _unproven(converged_plan(sglang_version="0.5.19"))


@pytest.mark.parametrize(
    "change",
    [
        {"driver": "580.65.06"},  # the node's driver moved since the check
        {"gpus": ["NVIDIA H100 80GB HBM3"] * 8},  # other GPUs
        {"gpus": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 7},  # one GPU fewer
        None,  # no record: an engine built before the check recorded one
    ],
)
def test_a_record_of_other_gpus_or_none_leaves_it_unproven(
    change: dict[str, Any] | None,
) -> None:
    settings, facts = converged_facts()
    state = facts.engine.state
    proven = state.get("proven", {})
    (name,) = proven
    records: dict[str, Any] = {} if change is None else {name: {**proven[name], **change}}
    engine = dataclasses.replace(facts.engine, state={**state, "proven": records})
    report = host_plan.decide(
        converged.HOST, settings, dataclasses.replace(facts, engine=engine), kb.load()
    )
    assert [d for d in report.plan.decisions if d.what == "proven"] == []
    (warning,) = _unproven(report)
    assert "sglang-kernel 0.4.2+cu129 is a CUDA 12.9 build" in warning


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
    # The engine check passed on this host's GPUs (its record is among the converged host's):
    # proven, with the day, not "unproven".
    assert "proven on this host's GPUs on " in " ".join(plain.split()), plain
    assert "unproven" not in plain, plain

    rolled = _run(
        PYINFRA,
        "inventory/demo_day2.py",
        "deploy.py",
        "--dry",
        "--data",
        "sglang_version=0.5.19",
        "--data",
        'rollout={"strategy": "rolling"}',
    )
    # Our lines wrap at the terminal's width (COLUMNS=80): read them as prose.
    assert "in batches [0] then [1] then [2]" in " ".join(rolled.split()), rolled
    assert "sglang 0.5.19 on cu128 is unproven" in " ".join(rolled.split()), rolled
    for out in (plain, rolled):
        assert ours_wider_than(80, out.splitlines()) == [], out
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
