"""The canary rollout end to end (issue 45): real `pyinfra -y INVENTORY deploy.py` runs against a
testbed container serving two ranks of the SGLang server double behind the real router (smg),
compared by programs/canary_compare.py with the benchmark client double installed in the
engine. A change of the ranks' flags (mem_fraction_static) is the change a canary guards; the
double's decode rate, set per rank in a runtime drop-in (SGLANG_DOUBLE_TOKENS_PER_S, as
tests/e2e/test_throughput.py sets it for all), is what makes the canary slower.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from tests import testbed as tb
from tests.e2e.deploying import MODEL_CONFIG, Indexes
from tests.e2e.load import Load
from tests.e2e.serving import ROUTER_PORT, base_data, deploy, ok
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

MODEL_DIR = "/srv/models/qwen-tok"
CANARY = {"strategy": "canary", "canary_ranks": 1, "soak_s": 2}


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    spec = ContainerSpec(
        extra_files={
            f"{MODEL_DIR}/config.json": MODEL_CONFIG,
            f"{MODEL_DIR}/tokenizer.json": b"{}",
            f"{MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
        }
    )
    (container,) = testbed.boot(spec)
    yield container
    testbed.destroy(container)


def data(c: Container, indexes: Indexes, **extra: Any) -> dict[str, Any]:
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address, "policy": "round_robin"}
    workload = {
        "throughput_check": "off",
        "throughput_input_len": 8,
        "throughput_output_len": 32,
        "throughput_concurrency_per_rank": 2,
        "throughput_prompts_per_rank": 8,
        "throughput_timeout_s": 120,
    }
    return base_data(
        c, indexes, model_source=MODEL_DIR, dp_size=2, router=router, **{**workload, **extra}
    )


def rate(c: Container, unit: str, tokens_per_s: int) -> None:
    """The double's decode rate for a unit's next start (a runtime drop-in)."""
    dropin = f"/run/systemd/system/{unit}.d/tokens.conf"
    rc, _, err = c.ssh_run(
        f"mkdir -p {Path(dropin).parent} && printf '[Service]\\n"
        f"Environment=SGLANG_DOUBLE_TOKENS_PER_S={tokens_per_s}\\n' > {dropin}"
        " && systemctl daemon-reload"
    )
    assert rc == 0, err


def fraction(c: Container, rank: int) -> str:
    _, out, _ = c.ssh_run(f"grep -o 'mem-fraction-static [0-9.]*' {layout.rank_unit_path(rank)}")
    return out.split()[-1] if out.split() else ""


def record(c: Container) -> dict[str, Any]:
    _, out, _ = c.ssh_run(f"cat {layout.CANARY_RECORD}")
    found: dict[str, Any] = json.loads(out)
    return found


def test_a_canary_passes_then_promotes_and_a_slower_one_rolls_back_and_is_refused_again(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    rate(c, "sglang@.service", 2000)
    ok(deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.9)}))

    url = f"http://{c.address}:{ROUTER_PORT}"
    # A flags change under the canary, with clients sending through the router all along:
    # rank 0 first, compared with rank 1, then rank 1; no request fails.
    with Load(url) as load:
        passed = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.85, rollout=CANARY)})
    ok(passed)
    assert load.sent > 0 and load.failed == 0, load.failures[:5]
    assert "canary: passed" in passed.output, passed
    assert (fraction(c, 0), fraction(c, 1)) == ("0.85", "0.85")
    assert record(c)["ok"] is True and record(c)["canary_ranks"] == [0]

    # The next change comes with a canary 20 times slower: it rolls back, the deploy fails.
    rate(c, "sglang@0.service", 100)
    with Load(url) as load:
        slower = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.8, rollout=CANARY)})
    assert slower.rc != 0, slower
    # The abort, too, failed no client's request.
    assert load.sent > 0 and load.failed == 0, load.failures[:5]
    assert "canary: FAILED (speed" in slower.output, slower
    assert (fraction(c, 0), fraction(c, 1)) == ("0.85", "0.85")
    kept = record(c)
    assert kept["ok"] is False and kept["rolled_back"] is True, kept
    _, out, _ = c.ssh_run("systemctl is-active sglang@0.service sglang@1.service")
    assert out.split() == ["active", "active"], out

    # The same again: refused before any change, naming the verdict.
    again = deploy(tmp_path, {c: data(c, indexes, mem_fraction_static=0.8, rollout=CANARY)})
    assert again.rc != 0, again
    assert "failed against rank 1" in again.output, again
    assert (fraction(c, 0), fraction(c, 1)) == ("0.85", "0.85")
