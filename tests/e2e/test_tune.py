"""The tune end to end (issue 50): `python -m operations.tune INVENTORY` against a testbed
container serving two ranks of the SGLang server double behind the real router (smg), with
clients sending through the router all along.

The double's speed depends on the levers the tune moves (tests/doubles/packages/sglang/
_generate_double.py): its running cap is --max-running-requests, a running batch past
--cuda-graph-max-bs decodes EAGER_COST times slower a step, and a --mem-fraction-static above
its limit does not start (an out-of-memory line in the journal). Its decode rate, batch cost
and eager cost are drawn here at random for each run (and printed on failure), so the test
cannot know which candidate is best: it checks that the proposal is within the measured noise
of the best measured, that the candidate that could not start is shown failed with the rank's
own line, that no client request failed, that rank 0 served throughout (same process, active)
and that every unit file ends as it was (a deploy afterwards changes nothing). A tune killed
while a candidate runs is put back by the next tune, which resumes it (what it measured kept),
or by the next deploy, under client load.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from tests import testbed as tb
from tests.e2e.deploying import Indexes
from tests.e2e.index import wait_for
from tests.e2e.load import Load
from tests.e2e.serving import (
    ROUTER_PORT,
    TOKENIZED_MODEL_DIR,
    HealthWatch,
    base_data,
    deploy,
    health_urls,
    ok,
    tokenized_model_host,
)
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, inventory_file

pytestmark = pytest.mark.e2e

MODEL_DIR = TOKENIZED_MODEL_DIR
DP_SIZE = 2
# The rank the tune takes: the highest (plan/tune_plan.py pick_rank).
TUNED = f"sglang@{DP_SIZE - 1}.service"
DROPIN = "/run/systemd/system/sglang@.service.d/speed.conf"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    yield from tokenized_model_host(testbed)


def data(c: Container, indexes: Indexes) -> dict[str, Any]:
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address, "policy": "round_robin"}
    workload = {
        "throughput_check": "off",
        "throughput_input_len": 8,
        "throughput_output_len": 32,
        "throughput_max_concurrency_per_rank": 512,
        "throughput_rounds": 3,
        "throughput_window_s": 3,
        "throughput_ramp_timeout_s": 60,
        "throughput_timeout_s": 240,
        # The current settings: a running cap and a graph size of 32.
        "max_running_requests": 32,
        "cuda_graph_max_bs": 32,
        "mem_fraction_static": 0.9,
    }
    return base_data(c, indexes, model_source=MODEL_DIR, dp_size=DP_SIZE, router=router, **workload)


def speed(c: Container) -> dict[str, float]:
    """The double's speed for every rank's next start, drawn now (a runtime drop-in)."""
    draw = random.SystemRandom()
    knobs = {
        "SGLANG_DOUBLE_TOKENS_PER_S": round(draw.uniform(8, 14), 2),
        "SGLANG_DOUBLE_BATCH_COST": round(draw.uniform(0.01, 0.04), 3),
        "SGLANG_DOUBLE_EAGER_COST": round(draw.uniform(1.5, 3.0), 2),
        "SGLANG_DOUBLE_MEM_LIMIT": 0.93,
    }
    lines = "".join(f"Environment={k}={v}\\n" for k, v in knobs.items())
    rc, _, err = c.ssh_run(
        f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\n{lines}' > {DROPIN}"
        " && systemctl daemon-reload"
    )
    assert rc == 0, err
    return knobs


def units(c: Container) -> str:
    _, out, _ = c.ssh_run("sha256sum /etc/systemd/system/sglang@*.service")
    return out


def main_pid(c: Container, unit: str) -> tuple[str, str]:
    _, out, _ = c.ssh_run(f"systemctl show {unit} -p ActiveState -p MainPID")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props.get("ActiveState", ""), props.get("MainPID", "")


def rows(c: Container) -> list[dict[str, Any]]:
    _, out, _ = c.ssh_run(f"cat {layout.TUNE_RECORDS}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_a_tune_proposes_within_noise_of_the_best_fails_none_and_leaves_every_unit(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    knobs = speed(c)
    settings = data(c, indexes)
    ok(deploy(tmp_path, {c: settings}))
    before, serving = units(c), main_pid(c, "sglang@0.service")
    assert serving[0] == "active", serving

    inventory = inventory_file(tmp_path, {c: settings}, filename="tune.py")
    watch = HealthWatch(health_urls(c, DP_SIZE))
    with Load(f"http://{c.address}:{ROUTER_PORT}") as load, watch:
        tuned = subprocess.run(
            [sys.executable, "-m", "operations.tune", str(inventory)],
            capture_output=True,
            text=True,
            timeout=1500,
            cwd=ROOT,
            check=False,
        )
    said = f"the double: {knobs}\n" + tuned.stdout + tuned.stderr
    prose = " ".join(said.split())  # our lines wrap at the terminal's width
    assert tuned.returncode == 0, said
    assert f"tune: rank {DP_SIZE - 1} ({TUNED})" in prose, said
    # No client request failed, and rank 0 served throughout: the same process, active.
    assert load.sent > 0 and load.failed == 0, load.report("client load")
    assert main_pid(c, "sglang@0.service") == serving, said
    # All but the tuned rank healthy throughout (7 of 8 on CT200), asked from outside.
    assert watch.asked > 10 and watch.down_ever <= {TUNED}, (watch, said)
    assert watch.most_down <= 1, (watch, said)
    # Every unit as it was; nothing left of the run; the rank back and serving.
    assert units(c) == before, said
    _, left, _ = c.ssh_run(f"ls {layout.TUNE_STATE} {layout.TUNE_STATE}.unit 2>/dev/null; true")
    assert left.strip() == "", left
    assert main_pid(c, TUNED)[0] == "active", said

    kept = [r for r in rows(c) if "name" in r]
    by_name = {r["name"]: r for r in kept}
    # The candidate that cannot start is shown failed with the rank's own journal line.
    failed = by_name["mem_fraction_static=0.95"]
    assert failed["status"] == "failed" and "out of memory" in failed["why"], failed
    assert "FAILED: never healthy: torch.OutOfMemoryError: CUDA out of memory" in prose, said
    # The proposal is within the measured noise of the best measured.
    measured = [r for r in kept if r["status"] == "measured"]
    assert by_name["current"]["status"] == "measured" and len(measured) >= 4, kept
    best = max(measured, key=lambda r: r["output_tok_s"])
    (summary,) = [r for r in rows(c) if "summary" in r]
    proposed = next(
        r
        for r in measured
        if r["lines"] == summary["proposal"] or (not summary["proposal"] and r["name"] == "current")
    )
    noise = max(best["noise"], proposed["noise"], by_name["current"]["noise"])
    assert proposed["output_tok_s"] >= best["output_tok_s"] * (1 - noise), (summary, kept, said)
    for line in summary["proposal"]:
        assert line in prose, said

    # A deploy afterwards changes nothing: the units and the router are as the plan says.
    again = deploy(tmp_path, {c: settings})
    ok(again)
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again


def state(c: Container) -> dict[str, Any]:
    _, out, _ = c.ssh_run(f"cat {layout.TUNE_STATE} 2>/dev/null; true")
    return json.loads(out) if out.strip() else {}


def killed_tune(c: Container, tune: list[str], measured: int) -> str:
    """A tune killed (SIGKILL, as a lost machine leaves it) once `measured` candidates but the
    current settings are in its records and the next one's unit is written; what it said."""
    first = subprocess.Popen(
        tune, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )

    def there() -> bool:
        if not state(c).get("candidate_sha256"):
            return False
        records = rows(c)
        starts = [r for r in records if r.get("event") == "start"]
        if not starts:
            return False
        this = [r for r in records if r.get("tune") == starts[-1]["tune"] and "name" in r]
        return len([r for r in this if r["name"] != "current"]) >= measured

    try:
        wait_for(there, 900, f"{measured} candidate(s) measured and the next under test")
        rc, _, err = c.ssh_run(f"kill -KILL {state(c)['pid']}")
        assert rc == 0, err
    finally:
        said, _ = first.communicate(timeout=600)
    assert first.returncode != 0, said
    return said


def test_a_tune_killed_while_a_candidate_runs_is_put_back_and_resumed_by_the_next_tune(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    knobs = speed(c)
    settings = data(c, indexes)
    ok(deploy(tmp_path, {c: settings}))
    before = units(c)
    inventory = inventory_file(tmp_path, {c: settings}, filename="tune.py")
    tune = [sys.executable, "-m", "operations.tune", str(inventory)]
    killed_said = killed_tune(c, tune, measured=1)
    assert units(c) != before, killed_said  # the candidate's unit, left by the kill
    cut = [r for r in rows(c) if r.get("event") == "start"][-1]["tune"]
    done = [
        r["name"] for r in rows(c) if r.get("tune") == cut and r.get("name", "current") != "current"
    ]

    # The next tune puts the rank back first, then resumes: what the cut-off one measured is
    # kept (a budget that measures nothing more).
    again = subprocess.run(
        [*tune, "--budget-min", "1"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    said = f"the double: {knobs}\n" + again.stdout + again.stderr
    prose = " ".join(said.split())
    assert again.returncode == 0, said
    assert f"a tune was cut off while {TUNED} was under test" in prose, said
    assert f"{TUNED} is back on its own unit and in service" in prose, said
    assert f"resuming the tune of {cut} (cut off): {len(done)} of its candidates" in prose, said
    resumed = [r for r in rows(c) if r.get("kept_from") == cut]
    assert [r["name"] for r in resumed] == done and done, (done, said)
    assert f"(kept from {cut})" in prose, said
    assert units(c) == before, said
    assert state(c) == {} and main_pid(c, TUNED)[0] == "active", said
    # And the router lists it again: a deploy changes nothing.
    converged = deploy(tmp_path, {c: settings})
    ok(converged)
    assert {k: v for k, v in converged.statuses.items() if v != "No changes"} == {}, converged


def test_a_tune_killed_while_a_candidate_runs_is_put_back_by_the_next_deploy(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    speed(c)
    settings = data(c, indexes)
    ok(deploy(tmp_path, {c: settings}))
    before = units(c)
    inventory = inventory_file(tmp_path, {c: settings}, filename="tune.py")
    killed_said = killed_tune(c, [sys.executable, "-m", "operations.tune", str(inventory)], 0)
    assert units(c) != before, killed_said
    with (
        Load(f"http://{c.address}:{ROUTER_PORT}") as load,
        HealthWatch(health_urls(c, DP_SIZE)) as watch,
    ):
        restored = deploy(tmp_path, {c: settings})
    ok(restored)
    assert load.sent > 0 and load.failed == 0, load.report("client load")
    assert watch.down_ever <= {TUNED} and watch.most_down <= 1, (watch, restored)
    assert units(c) == before, restored
    assert main_pid(c, TUNED)[0] == "active", restored
    # The rank is back in the router too: the next deploy changes nothing.
    converged = deploy(tmp_path, {c: settings})
    ok(converged)
    assert {k: v for k, v in converged.statuses.items() if v != "No changes"} == {}, converged
