"""The deploy's throughput check end to end: real `pyinfra -y INVENTORY deploy.py` runs against a
testbed container serving two ranks of the SGLang server double behind the real router (smg),
measured by the toolkit's load client (programs/load_client.py) as the service user, with the
ranks' key. The double decodes one batch at a time (tests/doubles/packages/sglang/
_generate_double.py): SGLANG_DOUBLE_TOKENS_PER_S, its batch cost and its running cap are set
here in a runtime drop-in every rank unit reads: a change of the ranks' flags that comes with a
slower double is what a slower release looks like to the check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from tests import testbed as tb
from tests.e2e.deploying import Indexes, Run
from tests.e2e.load import Load
from tests.e2e.serving import (
    ROUTER_PORT,
    TOKENIZED_MODEL_DIR,
    base_data,
    deploy,
    ok,
    tokenized_model_host,
)
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, inventory_file

pytestmark = pytest.mark.e2e

MODEL_DIR = TOKENIZED_MODEL_DIR
DROPIN = "/run/systemd/system/sglang@.service.d/tokens.conf"
OP = "load client"
RUNNING = 48


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    yield from tokenized_model_host(testbed)


def data(c: Container, indexes: Indexes, **extra: Any) -> dict[str, Any]:
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address, "policy": "round_robin"}
    workload = {
        "throughput_check": "after_change",
        "throughput_input_len": 8,
        "throughput_output_len": 32,
        "throughput_max_concurrency_per_rank": 256,
        "throughput_rounds": 3,
        "throughput_window_s": 2,
        "throughput_ramp_timeout_s": 60,
        "throughput_timeout_s": 240,
    }
    return base_data(
        c, indexes, model_source=MODEL_DIR, dp_size=2, router=router, **{**workload, **extra}
    )


def rate(c: Container, tokens_per_s: int) -> None:
    """The double's decode rate for the ranks' next start (a runtime drop-in): one request's
    rate, 2% a step more per request in the batch, RUNNING at most."""
    rc, _, err = c.ssh_run(
        f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\n"
        f"Environment=SGLANG_DOUBLE_TOKENS_PER_S={tokens_per_s}\\n"
        "Environment=SGLANG_DOUBLE_BATCH_COST=0.02\\n"
        f"Environment=SGLANG_DOUBLE_MAX_RUNNING={RUNNING}\\n' > {DROPIN}"
        " && systemctl daemon-reload"
    )
    assert rc == 0, err


def records(c: Container) -> list[dict[str, Any]]:
    _, out, _ = c.ssh_run(f"cat {layout.THROUGHPUT_RECORDS} 2>/dev/null; true")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def line(run: Run) -> str:
    return next((x for x in run.output.splitlines() if "throughput: " in x), "")


def test_a_deploy_measures_a_slower_change_fails_by_name_and_warn_passes(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    c.ssh_run(f"systemctl stop 'sglang@*.service' sglang-router.service; rm -f {DROPIN}; true")
    rate(c, 20)
    first = deploy(tmp_path, {c: data(c, indexes)})
    ok(first)
    assert first.status(OP).startswith("Success"), first
    # The deploy's one line.
    assert "throughput: " in first.output and "nothing to compare" in first.output, first
    (rec,) = records(c)
    assert rec["release"] == "0.5.11" and rec["errors"] == 0 and len(rec["rounds"]) == 3
    assert rec["workload"]["ranks"] == 2 and rec["workload"]["output_len"] == 32
    assert rec["router"] is not None and rec["gpu"] and rec["server_args"]
    # Each rank measured at its capacity, from its own counters, past the double's cap.
    assert sorted(rec["per_rank"]) == ["sglang@0.service", "sglang@1.service"]
    assert all(r["concurrency"] > RUNNING for r in rec["per_rank"].values()), rec
    assert rec["output_tok_s"] > 0 and rec["ttft_ms"]["p50"] is not None

    # Nothing changed: nothing measured, nothing recorded.
    again = deploy(tmp_path, {c: data(c, indexes)})
    ok(again)
    assert "not measured" in again.output or again.status(OP).startswith("No changes"), again
    assert len(records(c)) == 1

    # On demand: `operations.bench` measures again, under the deploy lock, and compares.
    inventory = inventory_file(tmp_path, {c: data(c, indexes)}, filename="bench.py")
    bench = subprocess.run(
        [sys.executable, "-m", "operations.bench", str(inventory)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    said = bench.stdout + bench.stderr  # pyinfra logs to stderr
    assert bench.returncode == 0, said
    assert "against the median of the last 1 passed record(s)" in said, said
    assert len(records(c)) == 2

    # A change of the ranks' flags, and the double half as fast: the deploy fails by name.
    rate(c, 10)
    slower = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.85)})
    assert slower.rc != 0, slower
    assert "past throughput_max_slowdown 0.1 beyond the noise" in slower.output, slower
    assert "ranks that fell: sglang@0.service, sglang@1.service" in slower.output, slower
    assert "changed since the record before: -" in slower.output, slower
    assert "--mem-fraction-static 0.85" in slower.output and "last passed: " in slower.output
    kept = records(c)
    assert len(kept) == 3 and kept[2]["output_tok_s"] < 0.9 * kept[1]["output_tok_s"]
    assert kept[2]["flags_digest"] != kept[1]["flags_digest"]
    # The ranks still serve: the check touched none.
    _, out, _ = c.ssh_run("systemctl is-active sglang@0.service sglang@1.service")
    assert out.split() == ["active", "active"], out

    # warn: slower again, with another flag change: passes with a warning, recorded.
    rate(c, 5)
    warned = deploy(
        tmp_path, {c: data(c, indexes, mem_fraction_static=0.8, throughput_guard="warn")}
    )
    ok(warned)
    assert "WARNING throughput: " in warned.output and "slower" in warned.output, warned
    assert len(records(c)) == 4


def test_a_rank_whose_requests_fail_fails_the_deploy_by_name(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    rate(c, 20)
    refuse = "/run/systemd/system/sglang@1.service.d/refuse.conf"
    c.ssh_run(
        f"mkdir -p {Path(refuse).parent} && printf '[Service]\\n"
        f"Environment=SGLANG_DOUBLE_COMPLETIONS=refuse\\n' > {refuse} && systemctl daemon-reload"
    )
    try:
        run = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.75)})
    finally:
        c.ssh_run(f"rm -f {refuse}; systemctl daemon-reload")
    assert run.rc != 0, run
    assert "requests failed (OSError: HTTP 503" in run.output, run
    assert records(c)[-1]["verdict"]["ok"] is False


def test_clients_traffic_through_the_router_is_not_read_as_a_slowdown(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    """Issue 49: a check on a host whose clients keep sending through the gateway counts what
    each rank generated for everyone, so the same speed passes under load."""
    c = host
    rate(c, 20)
    idle = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.7)})
    ok(idle)
    with Load(f"http://{c.address}:{ROUTER_PORT}") as load:
        busy = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.72)})
    ok(busy)
    last = records(c)[-1]
    # The double's chats take none of its capacity and are not counted as generated (its
    # docstring): what this run proves is that the check passes, and fails no client, while
    # clients send; the share of others' tokens is the guard's test's (tests/unit).
    assert last["verdict"]["ok"], last
    assert last["verdict"]["decided"] in ("passed", "within noise"), last
    assert load.failed == 0, load.report("client load")
