"""`python -m operations.bench` on the simulated CT200: it measures a host that serves what the
inventory says, and refuses one this inventory would still change (its record would name a
release, flags or model that do not serve yet)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from operations.plan.throughput_plan import BENCH_REFUSAL
from tests.unit.test_operator_errors import unfolded

pytestmark = pytest.mark.integration  # runs pyinfra through the bench's command line

ROOT = Path(__file__).resolve().parents[2]


def bench(inventory: str, *data: str) -> tuple[int, str]:
    words = [sys.executable, "-m", "operations.bench", inventory]
    for item in data:
        words += ["--data", item]
    result = subprocess.run(
        words, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180
    )
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    return result.returncode, out


def test_a_host_not_yet_deployed_is_not_measured() -> None:
    rc, out = bench("inventory/demo.py")
    assert rc == 1, out
    assert "refused: " + BENCH_REFUSAL in unfolded(out), out
    assert "Beginning operation run" not in out, out


def test_a_pin_not_yet_deployed_is_not_measured_and_the_converged_host_is() -> None:
    rc, out = bench("inventory/demo_day2.py", "sglang_version=0.5.19")
    assert rc == 1 and BENCH_REFUSAL in unfolded(out), out
    rc, out = bench("inventory/demo_day2.py")
    assert rc == 0, out
    assert "Throughput | load client" in out and "refused" not in out, out
