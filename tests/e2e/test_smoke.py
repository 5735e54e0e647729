"""The deploy's smoke request and `status --probe` end to end: real `pyinfra -y INVENTORY
deploy.py` runs against two testbed containers serving the SGLang server double (installed from
the loopback index with the real openai client its release requires) behind the real
sglang-router, asked as a client asks: the OpenAI API's request from the host, the API key,
the served model name. What each rank served is read from its own /metrics
(sglang:num_requests_total).

Two containers serve the module; each test brings its hosts to the settings it needs with a
deploy that must converge, so no test depends on another's order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import testbed as tb
from tests.e2e.deploying import Indexes, Run
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    ROUTER_PORT,
    base_data,
    converge,
    deploy,
    health,
    http,
    ok,
    requests_served,
    run_status,
    serving_spec,
    status_inventory,
    unit_states,
)
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container

pytestmark = pytest.mark.e2e

API_KEY = "sk-smoke-3f9a1c7e5b2d4a68"
MODEL = "Qwen/Qwen3.6-27B"
SMOKE_OP = "Smoke: chat requests (started ranks, router)"


@pytest.fixture(scope="module")
def hosts(testbed: tb.Testbed) -> Iterator[list[Container]]:
    containers = testbed.boot(serving_spec(), serving_spec())
    yield containers
    for container in containers:
        testbed.destroy(container)


def smoke_ops(run: Run) -> dict[str, str]:
    return {k: v for k, v in run.statuses.items() if k.startswith("Smoke:")}


def served(c: Container, ranks: range) -> dict[int, int]:
    return {rank: requests_served(c, 30000 + rank) for rank in ranks}


def status(tmp_path: Path, data: dict[Container, dict[str, Any]], *args: str) -> tuple[int, str]:
    hosts = {c.name: {**c.host_data(), **d} for c, d in data.items()}
    proc = run_status(status_inventory(tmp_path, hosts), *args)
    return proc.returncode, proc.stdout + proc.stderr


def test_eight_started_ranks_each_answer_one_request_and_a_rerun_asks_nothing(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    a.ssh_run("systemctl stop 'sglang@*.service' sglang-router.service 2>/dev/null; true")
    first = converge(tmp_path, a, indexes)
    assert smoke_ops(first)[SMOKE_OP].startswith("Success"), first
    # Each rank served exactly the deploy's one request: every rank was asked, not one of them.
    assert served(a, range(8)) == dict.fromkeys(range(8), 1)

    pids = unit_states(a, range(8))
    again = converge(tmp_path, a, indexes)
    assert set(smoke_ops(again).values()) == {"No changes"}, again
    assert served(a, range(8)) == dict.fromkeys(range(8), 1), "a converged run asks nothing"
    assert unit_states(a, range(8)) == pids


# A wrong sum, as the deploy and status name it: the question asked and the answer given.
WRONG = re.compile(
    r"not a truthful answer: asked 'What is (\d{3}) \+ (\d{3})\? Reply with the number only\.', "
    r"answered '(\d+)' \(the sum is (\d+)\)"
)


def wrong_sums(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(n) for n in found.groups()) for found in WRONG.finditer(text)]


@pytest.mark.parametrize(
    ("rank", "reply", "why", "journal"),
    [
        (3, "malformed", "200 with a malformed body", "serving Qwen/Qwen3.6-27B"),
        # Another model's server (its /v1/models and its start line name that model).
        (6, "wrong-model", "serves ['other-org/another-model']", "serving other-org/another"),
        # Fluent, well-formed and wrong (silently wrong kernels, issue 27): the sum plus one.
        (2, "wrong-sum", "not a truthful answer: asked 'What is ", "serving Qwen/Qwen3.6-27B"),
    ],
)
def test_a_rank_that_answers_garbage_fails_the_deploy_naming_it(
    hosts: list[Container],
    indexes: Indexes,
    tmp_path: Path,
    rank: int,
    reply: str,
    why: str,
    journal: str,
) -> None:
    a = hosts[0]
    converge(tmp_path, a, indexes)
    unit = f"sglang@{rank}.service"
    # The rank is healthy on /health but answers garbage (the double's knob, in a runtime
    # drop-in the unit-file hash does not see); stopped, the deploy starts it again.
    dropin = f"/run/systemd/system/{unit}.d"
    knob = f"printf '[Service]\\nEnvironment=SGLANG_DOUBLE_REPLY={reply}\\n' > {dropin}/r.conf"
    assert a.ssh_run(f"mkdir -p {dropin} && {knob} && systemctl daemon-reload")[0] == 0
    try:
        a.ssh_run(f"systemctl stop {unit}")
        run = deploy(tmp_path, {a: base_data(a, indexes)})
        assert run.rc != 0, run
        assert f"{unit}: did NOT answer as a client expects" in run.output, run
        assert why in run.output, run
        # The rank's own journal tail, with the double's start line.
        assert f"{unit}: last 40 journal lines" in run.output and journal in run.output, run
        assert health(a, 30000 + rank) == 200, "healthy by /health, and still refused"
        others = [f"sglang@{r}.service: did NOT" for r in range(8) if r != rank]
        assert not any(line in run.output for line in others), run
        if reply == "wrong-sum":
            # The question's numbers, the answer given and the true sum, all named.
            ((x, y, said, total),) = wrong_sums(run.output)
            assert total == x + y and said == total + 1, run
            # status --probe asks the same question (new numbers) and judges it the same way.
            rc, out = status(tmp_path, {a: base_data(a, indexes)}, "--probe")
            line = " ".join(out.split())  # the summary line, however the console wrapped it
            assert rc == 1, out
            assert "7/8 ranks answered a chat request" in line, out
            assert f"rank {rank}: POST /v1/chat/completions: not a truthful answer" in line, out
            ((x, y, said, total),) = wrong_sums(line)
            assert total == x + y and said == total + 1, out
    finally:
        a.ssh_run(f"rm -rf {dropin}; systemctl daemon-reload; systemctl restart {unit}")
    wait_for(lambda: health(a, 30000 + rank) == 200, timeout=60, what=f"rank {rank} back")


def test_two_hosts_behind_the_router_answer_and_every_rank_is_reached(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a, b = hosts
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    router = {"host": a.name, "port": ROUTER_PORT, "bind": a.address, "policy": "round_robin"}
    # Two hosts behind one router: both drains send the control-plane key from this file.
    (tmp_path / "cp-key").write_text("cp-smoke-test-key-5e6f7a8b9c0d\n")
    router["control_plane_key_file"] = str(tmp_path / "cp-key")
    common = {"router": router, "api_key_file": str(key_file)}
    data = {a: base_data(a, indexes, **common), b: base_data(b, indexes, **common)}
    run = deploy(tmp_path, data)
    (tmp_path / "deploy.log").write_text(run.output)  # kept by pytest for a failed run
    ok(run)
    assert API_KEY not in run.output
    # The new key restarts every rank: each answers, and a few go through the router.
    assert run.statuses[SMOKE_OP].startswith("Success"), run
    after_deploy = {c.name: served(c, range(8)) for c in (a, b)}
    # One request to each of the 16 (re)started ranks, and 4 more (the default) via the router.
    assert sum(n for counts in after_deploy.values() for n in counts.values()) == 16 + 4
    assert all(n >= 1 for counts in after_deploy.values() for n in counts.values())

    # status --probe: every rank of both hosts and the router answer; the key stays hidden.
    rc, out = status(tmp_path, data, "--probe")
    assert rc == 0, out
    assert API_KEY not in out
    for c in (a, b):
        assert f"{c.name}: 8/8 ranks healthy" in out and "8/8 ranks answered a chat request" in out
    assert "router answered" in out
    rc, out = status(tmp_path, data, "--probe", "--json")
    doc = json.loads(out[out.index("{") :])
    for c in (a, b):
        host = doc["hosts"][c.name]
        assert host["probed"] is True and [r["answered"] for r in host["ranks"]] == [True] * 8
        assert all(r["tokens"] == 12 and r["latency_s"] is not None for r in host["ranks"])
    assert doc["hosts"][a.name]["router"]["answered"] is True
    # Without --probe status asks nothing: no rank's counter moves.
    counts = {c.name: served(c, range(8)) for c in (a, b)}
    assert status(tmp_path, data)[0] == 0
    assert {c.name: served(c, range(8)) for c in (a, b)} == counts

    # N requests through the router reach every rank of both hosts (each rank's own counter).
    sent = 48
    for _ in range(sent):
        code, body = http(
            f"http://{a.address}:{ROUTER_PORT}/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            key=API_KEY,
        )
        assert code == 200 and body["model"] == MODEL, body
    grew = {
        (c.name, rank): n - counts[c.name][rank]
        for c in (a, b)
        for rank, n in served(c, range(8)).items()
    }
    assert sum(grew.values()) == sent, grew
    assert all(n > 0 for n in grew.values()), grew
