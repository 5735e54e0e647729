"""The serve step end to end: real `pyinfra -y INVENTORY deploy.py` runs against testbed
containers, the SGLang server double (installed as the real package is, from the loopback
index) behind the real sglang-router.

Two containers serve the module. Tests that change what runs bring the host back to the
module's baseline settings first (a deploy that must converge), so no test depends on another's
order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import testbed as tb
from tests.e2e.deploying import MODEL_CONFIG, Indexes
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    MODEL_DIR,
    ROUTER_PORT,
    base_data,
    converge,
    deploy,
    health,
    http,
    ok,
    requests_served,
    serve_ops,
    unit_states,
)
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

API_KEY = "sk-test-6f1d2e0a9b8c4d3e"
CONTROL_KEY = "cp-test-0a1b2c3d4e5f60718293"


@pytest.fixture(scope="module")
def hosts(testbed: tb.Testbed) -> Iterator[list[Container]]:
    spec = ContainerSpec(
        extra_files={
            f"{MODEL_DIR}/config.json": MODEL_CONFIG,
            f"{MODEL_DIR}/model-00001-of-00001.safetensors": b"\0" * 4096,
        }
    )
    containers = testbed.boot(spec, spec)
    yield containers
    for container in containers:
        testbed.destroy(container)


def exec_start(c: Container, rank: int) -> str:
    """The ExecStart= of a rank's unit file: what a restart or a reboot runs."""
    _, out, _ = c.ssh_run(f"grep ^ExecStart= /etc/systemd/system/sglang@{rank}.service")
    return out.strip()


def journal_events(c: Container) -> list[tuple[float, int, str]]:
    """(time, rank, 'start'|'ready') from the journal, in order."""
    _, out, _ = c.ssh_run("journalctl -o short-unix --no-pager -u 'sglang@*' | tail -n 4000")
    events = []
    for line in out.splitlines():
        match = re.match(r"^(\d+\.\d+) \S+ (\S+)\[\d+\]: (.*)$", line)
        if not match:
            continue
        stamp, ident, text = float(match.group(1)), match.group(2), match.group(3)
        rank_match = re.match(r"sglang-(\d+)$", ident)
        if rank_match is None:
            continue
        rank = int(rank_match.group(1))
        # The double's two lines: when it starts loading, and when /health turns 200.
        if "ready to roll" in text:
            events.append((stamp, rank, "ready"))
        elif "loading for" in text:
            events.append((stamp, rank, "start"))
    return events


# -- tests -----------------------------------------------------------------------------------


def test_eight_ranks_serve_and_a_second_run_changes_nothing(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    first = converge(tmp_path, a, indexes)
    assert all(state == "active" for state, _ in unit_states(a, range(8)).values())
    assert [health(a, 30000 + rank) for rank in range(8)] == [200] * 8
    # The unit runs as the service user, from the engine's current environment.
    _, user, _ = a.ssh_run("ps -o user= -p $(systemctl show sglang@0.service -p MainPID --value)")
    assert user.strip() == "sglang"
    assert "Serve: /health of" in " ".join(serve_ops(first))

    pids = unit_states(a, range(8))
    second = converge(tmp_path, a, indexes)
    changed = {k: v for k, v in serve_ops(second).items() if v != "No changes"}
    assert changed == {}, second
    assert unit_states(a, range(8)) == pids, "a converged run must restart nothing"


def test_systemd_brings_back_a_killed_rank(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    converge(tmp_path, a, indexes)
    _, old_pid = unit_states(a, range(2, 3))[2]
    assert a.ssh_run(f"kill -9 {old_pid}")[0] == 0

    def back() -> bool:
        state, pid = unit_states(a, range(2, 3))[2]
        return state == "active" and pid not in (0, old_pid) and health(a, 30002) == 200

    wait_for(back, timeout=60, what="rank 2 restarted by systemd")


def test_a_changed_setting_rolls_one_rank_at_a_time_and_then_converges(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    converge(tmp_path, a, indexes)
    a.ssh_run("journalctl --rotate >/dev/null 2>&1; journalctl --vacuum-time=1s >/dev/null 2>&1")
    since = float(a.ssh_run("date +%s.%N")[1])

    rolled = converge(tmp_path, a, indexes, mem_fraction_static=0.85)
    batches = [k for k in serve_ops(rolled) if re.match(r"Serve: restart batch \d+: restart", k)]
    assert len(batches) == 8, rolled
    _, unit, _ = a.ssh_run("systemctl cat sglang@5.service")
    assert "--mem-fraction-static 0.85" in unit

    events = [e for e in journal_events(a) if e[0] >= since]
    starts = {rank: t for t, rank, kind in events if kind == "start"}
    readies = {rank: t for t, rank, kind in events if kind == "ready"}
    assert sorted(starts) == list(range(8)), events
    for rank in range(1, 8):
        # Rank N starts only after rank N-1 answered healthy: one batch at a time.
        assert starts[rank] >= readies[rank - 1], (rank, events)

    again = converge(tmp_path, a, indexes, mem_fraction_static=0.85)
    assert {k: v for k, v in serve_ops(again).items() if v != "No changes"} == {}
    converge(tmp_path, a, indexes)


def test_dp_size_shrinks_and_grows(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    converge(tmp_path, a, indexes)
    converge(tmp_path, a, indexes, dp_size=4)
    assert all(s == "active" for s, _ in unit_states(a, range(4)).values())
    for rank in range(4, 8):
        assert a.ssh_run(f"test -e /etc/systemd/system/sglang@{rank}.service")[0] != 0
        assert unit_states(a, range(rank, rank + 1))[rank][0] in ("inactive", "")
    converge(tmp_path, a, indexes)
    assert [health(a, 30000 + rank) for rank in range(8)] == [200] * 8


def test_a_rank_that_cannot_start_fails_the_deploy_and_the_others_keep_serving(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a = hosts[0]
    converge(tmp_path, a, indexes)
    pids = unit_states(a, range(8))
    # Something else takes rank 3's port: its restart fails, as a real clash would.
    squatter = f"systemd-run --unit squat-30003 python3 -m http.server --bind {a.address} 30003"
    a.ssh_run(f"systemctl stop sglang@3.service; {squatter}")
    wait_for(lambda: health(a, 30003) in (404, 501, 200), timeout=30, what="squatter listening")
    try:
        run = deploy(tmp_path, {a: base_data(a, indexes, mem_fraction_static=0.8)})
        assert run.rc != 0
        # The failure says the real reason, not just "timeout": who holds the rank's port
        # (the health wait's listener check), then the rank's own journal. The journal holds
        # the bind error only once the rank has tried to bind, which on a loaded machine may
        # come after the wait's first look: the listener is what the wait judges.
        assert f"{a.address}:30003 is held by uid 0 (root), not by the service user" in run.output
        assert "sglang@3.service" in run.output and "journal lines" in run.output
        assert "were not touched" in run.output
        after = unit_states(a, range(8))
        for rank in (0, 1, 2, 4, 5, 6, 7):
            # The deploy stopped before rolling: the same processes still serve.
            assert after[rank] == pids[rank] and health(a, 30000 + rank) == 200
    finally:
        a.ssh_run("systemctl stop squat-30003.service")
    converge(tmp_path, a, indexes)


def test_two_hosts_behind_one_router_and_the_api_key_stays_secret(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a, b = hosts
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    # Both hosts' drains send the router's control-plane key: one file on the controller.
    control_key = tmp_path / "control-plane-key"
    control_key.write_text(CONTROL_KEY + "\n")
    router = {
        "host": a.name,
        "port": ROUTER_PORT,
        "bind": a.address,
        "policy": "round_robin",
        "control_plane_key_file": str(control_key),
    }
    common = {"dp_size": 2, "router": router, "api_key_file": str(key_file)}
    run = deploy(
        tmp_path,
        {a: base_data(a, indexes, **common), b: base_data(b, indexes, **common)},
    )
    ok(run)
    assert API_KEY not in run.output and CONTROL_KEY not in run.output
    url = f"http://{a.address}:{ROUTER_PORT}"
    wait_for(lambda: http(f"{url}/health")[0] == 200, timeout=60, what="router healthy")
    # The worker API is closed: 401 without the control-plane key, both hosts' ranks with it.
    assert http(f"{url}/workers")[0] == 401
    status, listed = http(f"{url}/workers", key=CONTROL_KEY)
    assert status == 200 and len(listed["workers"]) == 4, listed
    ranks = [(c, 30000 + r) for c in (a, b) for r in range(2)]
    before = {(c.name, port): requests_served(c, port) for c, port in ranks}
    sent = 40
    for _ in range(sent):
        status, body = http(
            f"{url}/v1/chat/completions",
            {"model": "Qwen/Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}]},
            key=API_KEY,
        )
        assert status == 200, body
        assert "Qwen/Qwen3.6-27B" in json.dumps(body), body  # a rank's reply, not the router's
    # Each rank counts the requests it served (sglang:num_requests_total on its /metrics):
    # every one went to some rank, and each rank of both hosts, the second host's included,
    # served its share through the router on the first host (round_robin).
    served = {}
    for c, port in ranks:
        served[(c.name, port)] = requests_served(c, port) - before[(c.name, port)]
    assert sum(served.values()) == sent, served
    assert all(n > 0 for n in served.values()), served

    # Without the key, a rank refuses; /health stays open.
    assert http(f"http://{b.address}:30000/v1/models")[0] == 401
    assert http(f"http://{b.address}:30000/v1/models", key=API_KEY)[0] == 200
    for c in (a, b):
        _, files, _ = c.ssh_run(
            f"grep -rl -- {API_KEY} /etc /opt /usr/local /var/lib/sglang 2>/dev/null; true"
        )
        assert files.split() == ["/etc/sglang/secrets.yaml"], files
        _, mode, _ = c.ssh_run("stat -c '%a %U %G' /etc/sglang/secrets.yaml")
        assert mode.split() == ["640", "root", "sglang"]
        _, cmdlines, _ = c.ssh_run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
        assert API_KEY not in cmdlines and CONTROL_KEY not in cmdlines
        # The control-plane key: root only, on both hosts, in that one file.
        _, files, _ = c.ssh_run(
            f"grep -rl -- {CONTROL_KEY} /etc /opt /usr/local /var/lib/sglang 2>/dev/null; true"
        )
        assert files.split() == ["/etc/sglang/router-control-plane.key"], files
        _, mode, _ = c.ssh_run("stat -c '%a %U %G' /etc/sglang/router-control-plane.key")
        assert mode.split() == ["600", "root", "root"]
        assert "--config /etc/sglang/secrets.yaml" in cmdlines

    # Issue 29: the same deploy again, behind the router with the API key, changes nothing and
    # rewrites no managed file (the drain script was rewritten on every run before).
    again = deploy(
        tmp_path, {a: base_data(a, indexes, **common), b: base_data(b, indexes, **common)}
    )
    ok(again)
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again
    assert API_KEY not in again.output and CONTROL_KEY not in again.output

    # A roll behind smg with the key: each of the first host's ranks drained out, restarted,
    # and added back with the ranks' key (smg calls a worker POSTed without `api_key`
    # unauthenticated, and the rank refuses it: smg 1.13.0 model_gateway/src/worker/
    # service.rs:471-477), so every rank is listed ready again and serves through the router.
    # (One host rolls: two testbed containers restarting units at the same instant sometimes
    # get systemd's 219/CGROUP from the nested cgroup tree, a testbed limit, not the deploy's.)
    status, listed = http(f"{url}/workers", key=CONTROL_KEY)
    models = {w["url"]: w.get("model_id") for w in listed["workers"]}
    rolled = {**common, "mem_fraction_static": 0.85}
    roll = deploy(
        tmp_path, {a: base_data(a, indexes, **rolled), b: base_data(b, indexes, **common)}
    )
    ok(roll)
    backs = [k for k in serve_ops(roll) if "back into the router" in k]
    assert len(backs) == 2, serve_ops(roll)  # a batch per rank of the first host
    assert API_KEY not in roll.output and CONTROL_KEY not in roll.output
    status, listed = http(f"{url}/workers", key=CONTROL_KEY)
    assert status == 200, listed
    assert sorted(w["status"] for w in listed["workers"]) == ["ready"] * 4, listed
    # smg read each re-added rank's metadata as it read the ranks it started with: it sent the
    # key (without it, the rank's 401 leaves smg an unknown model for the worker).
    assert {w["url"]: w.get("model_id") for w in listed["workers"]} == models, (models, listed)
    assert set(models.values()) == {"Qwen/Qwen3.6-27B"}, models
    _, cmdlines, _ = a.ssh_run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert API_KEY not in cmdlines
    status, body = http(
        f"{url}/v1/chat/completions",
        {"model": "Qwen/Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}]},
        key=API_KEY,
    )
    assert status == 200, body

    converge(tmp_path, a, indexes)


def test_a_failed_batch_leaves_the_rest_on_the_old_version_across_restarts_and_a_reboot(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    """A roll that stops at a failed batch: the ranks not yet rolled keep unit files that name
    the previous settings, so a crash-restart and a whole reboot run those, never the new ones;
    the next deploy rolls exactly the rest, and a converged run changes nothing."""
    a = hosts[1]
    converge(tmp_path, a, indexes, restart_batch_size=2)
    old = {rank: exec_start(a, rank) for rank in range(8)}
    assert all("--mem-fraction-static 0.9 " in line for line in old.values())
    # Rank 1 keeps serving but cannot start again: a runtime drop-in (gone at reboot, and not
    # part of the unit file the fact hashes) makes its next start fail. Batch [0, 1] fails, and
    # ranks 2-7 are never rewritten. Stopping rank 1 instead would make it a rank "not serving",
    # which the deploy starts before any roll (and the roll would never begin).
    dropin = "/run/systemd/system/sglang@1.service.d"
    fail = f"printf '[Service]\\nExecStartPre=/bin/false\\n' > {dropin}/fail.conf"
    assert a.ssh_run(f"mkdir -p {dropin} && {fail} && systemctl daemon-reload")[0] == 0
    try:
        run = deploy(tmp_path, {a: base_data(a, indexes, mem_fraction_static=0.8,
                                             restart_batch_size=2)})  # fmt: skip
        assert (
            run.rc != 0 and "The roll stopped at sglang@0.service, sglang@1.service" in run.output
        )
        assert "--mem-fraction-static 0.8 " in exec_start(a, 0)
        for rank in range(2, 8):
            assert exec_start(a, rank) == old[rank], rank
    finally:
        a.ssh_run(f"rm -rf {dropin}; systemctl daemon-reload")

    # A crash-restart of a rank not rolled yet runs its own (old) unit.
    _, pid_before = unit_states(a, range(4, 5))[4]
    assert a.ssh_run("systemctl restart sglang@4.service")[0] == 0
    wait_for(lambda: health(a, 30004) == 200, timeout=60, what="rank 4 back")
    _, cmdline, _ = a.ssh_run(
        "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value sglang@4)/cmdline"
    )
    assert (
        "--mem-fraction-static 0.9 " in cmdline and unit_states(a, range(4, 5))[4][1] != pid_before
    )

    # A reboot: every rank comes back from its own unit file (the stage unit restages first).
    a.reboot()
    wait_for(
        lambda: all(health(a, 30000 + r) == 200 for r in range(8)), timeout=180, what="all ranks"
    )
    for rank in range(2, 8):
        _, cmdline, _ = a.ssh_run(
            f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value sglang@{rank})/cmdline"
        )
        assert "--mem-fraction-static 0.9 " in cmdline, (rank, cmdline)

    # The next deploy with the new settings rolls exactly the ranks not rolled yet.
    rolled = converge(tmp_path, a, indexes, mem_fraction_static=0.8, restart_batch_size=2)
    restarts = [k for k in serve_ops(rolled) if re.match(r"Serve: restart batch \d+: restart", k)]
    assert restarts == [
        "Serve: restart batch 1: restart sglang@2.service, sglang@3.service",
        "Serve: restart batch 2: restart sglang@4.service, sglang@5.service",
        "Serve: restart batch 3: restart sglang@6.service, sglang@7.service",
    ], rolled
    again = converge(tmp_path, a, indexes, mem_fraction_static=0.8, restart_batch_size=2)
    assert {k: v for k, v in serve_ops(again).items() if v != "No changes"} == {}, again
