"""Crash safety on real systemd (issue 31).

A deploy killed (`kill -9` of pyinfra, which drops its SSH sessions with it) inside a roll,
behind the real sglang-router 0.3.2: the kill is triggered by a marker the host writes at the
point (a `systemctl` double that holds the first `daemon-reload` after rank 0's unit names the new
release, i.e. between `_roll`'s unit write and its restart, with rank 0 drained out of the
router), never by a sleep. Then: at most one batch is out, the killed run's lock does not block
the next run, the next run converges (rank 0 pending restart is rolled and put back), the run
after it changes nothing, and status agrees with every process.

What runs is a fact: the ServingState fact's own command, run in a testbed container, tells a
rank whose process runs what its unit file says from one whose file was rewritten after the
process started (a deploy killed between `_roll`'s unit write and its restart), before and
after the daemon-reload, and the plan rolls exactly that rank. The unit runs a plain process
(the fact reads systemd and the files, not the server), so no engine is installed here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.facts.serve import Serving, ServingState, parse_serving
from operations.host_files import sha256
from operations.roll import ServePlan, roll_plan
from tests import testbed as tb
from tests.e2e.deploying import LANE, Deploying, Indexes, start_deploy
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    RELEASE,
    ROUTER_PORT,
    base_data,
    deploy,
    http,
    ok,
    release_indexes,
    serve_ops,
    serving_spec,
    status_inventory,
    unit_states,
)
from tests.e2e.serving import (
    run_status as status_command,
)
from tests.testbed import BootContainers, Container, ContainerSpec
from tests.unit.test_roll import ranks

pytestmark = pytest.mark.e2e


def unit_text(release: str) -> str:
    # A real unit systemd starts; the release is only in its text, as a rank unit's engine is.
    return (
        "[Unit]\nDescription=rank 0 (test_crash)\n\n[Service]\n"
        f"Environment=SGLANG_RELEASE={release}\n"
        "ExecStart=/bin/sleep infinity\n"
    )


def written(text: str) -> str:
    """A shell line that writes `text` as rank 0's unit, as put_file does (temp + rename)."""
    path = layout.unit_path(layout.unit_name(0))
    return f"printf '%s' '{text}' > {path}.tmp && mv -f {path}.tmp {path}"


def read(container: object) -> Serving:
    command = ServingState().command(
        engine_root="/opt/sglang",
        model_link="/dev/shm/models/m",
        paths=[layout.SECRETS_FILE],
        ranks=[0],
        router=False,
    )
    rc, out, err = container.ssh_run(command.get_raw_value())  # type: ignore[attr-defined]
    assert rc == 0, err
    return parse_serving(out.splitlines())


def test_a_unit_rewritten_after_its_process_started_is_pending_restart(
    boot_containers: BootContainers,
) -> None:
    (host,) = boot_containers(ContainerSpec())
    unit = layout.unit_name(0)

    def run(cmd: str) -> str:
        rc, out, err = host.ssh_run(cmd)
        assert rc == 0, f"{cmd}: {err}"
        return out

    run(f"{written(unit_text('0.5.11'))} && systemctl daemon-reload && systemctl start {unit}")
    started = read(host)
    assert started.ranks[0].running and started.ranks[0].started_at is not None
    assert started.pending_restart(0) is None, started.ranks[0]

    # The kill: the new unit is on disk, its process still the old one. The host's clock must
    # have passed the start's second (the fact compares seconds): wait for it, not a sleep.
    run(f"until [ $(date +%s) -gt {started.ranks[0].started_at} ]; do :; done")
    run(written(unit_text("0.5.19")))
    unreloaded = read(host)
    assert unreloaded.ranks[0].need_reload, unreloaded.ranks[0]
    assert unreloaded.pending_restart(0) == "its unit file changed and systemd was not reloaded"

    run("systemctl daemon-reload")
    reloaded = read(host)
    assert not reloaded.ranks[0].need_reload
    assert reloaded.pending_restart(0) == "its unit file changed after the process started"
    assert reloaded.ranks[0].main_pid == started.ranks[0].main_pid

    # The plan: the file is what the plan wants, yet the rank restarts (before: "nothing to
    # restart" for ever).
    want = ranks()[:1]
    on_disk = dataclasses.replace(
        reloaded,
        ranks={0: dataclasses.replace(reloaded.ranks[0], unit_sha256=sha256(want[0].unit))},
    )
    plan = roll_plan(want, on_disk, batch_size=1)
    assert [[r.rank for r in b] for b in plan.batches] == [[0]]
    assert "nothing to restart" not in ServePlan(roll=plan).summary()

    run(f"systemctl restart {unit}")
    restarted = read(host)
    assert restarted.ranks[0].main_pid != started.ranks[0].main_pid
    assert restarted.pending_restart(0) is None, restarted.ranks[0]


NEW_RELEASE = "0.5.19"
REACHED = "/run/test-crash-reached"
ARMED = "/run/test-crash-armed"
UV = "/opt/sglang/tools/bin/uv"
# TEST DOUBLES, each with one fault-injection point: while ARMED exists and the call is the one
# named, the double writes its PID to REACHED and holds (the test kills the deploy meanwhile);
# every other call is the real program's.
# systemctl, installed in /usr/local/sbin (first in root's PATH over SSH): the first
# `daemon-reload` after rank 0's unit file names the new release, i.e. between `_roll`'s unit
# write and its restart (operations/serve.py), with rank 0 drained out of the router.
SYSTEMCTL_DOUBLE = f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the roll between a unit write and its restart.
if [ "$1" = daemon-reload ] && [ -e {ARMED} ] && grep -q {NEW_RELEASE}-{LANE} \\
    /etc/systemd/system/sglang@0.service 2>/dev/null; then
  rm -f {ARMED}
  echo $$ > {REACHED}
  exec sleep 600
fi
exec /usr/bin/systemctl "$@"
"""
# uv, in place of the engine's own (moved to uv.real): its `sync` of the new engine, i.e. with
# the new environment made by `uv venv` and not yet installed (operations/engine.py build_env).
UV_DOUBLE = f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the engine install after `uv venv`.
if [ "$1" = sync ] && [ -e {ARMED} ]; then
  rm -f {ARMED}
  echo $$ > {REACHED}
  exec sleep 600
fi
exec {UV}.real "$@"
"""


def killed_at(c: Container, install: str, undo: str, run: Callable[[], Deploying]) -> None:
    """Start `run` with the double `install` put in place and armed; kill -9 the deploy when
    the host writes REACHED; then undo the double and end the held process by its PID."""
    assert c.ssh_run(f"{install} && touch {ARMED}")[0] == 0
    held = ""
    try:
        deploying = run()
        try:
            wait_for(
                lambda: c.ssh_run(f"test -s {REACHED}")[0] == 0,
                timeout=600,
                what="the deploy at the fault-injection point",
            )
        finally:
            deploying.kill()
        held = c.ssh_run(f"cat {REACHED}")[1].strip()
    finally:
        c.ssh_run(f"{undo}; rm -f {ARMED} {REACHED}")
        if held.isdigit():
            c.ssh_run(f"kill {held}")


def written_double(path: str, text: str) -> str:
    return f"cat > {path} <<'EOF'\n{text}EOF\nchmod 755 {path}"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    yield from release_indexes(tmp_path_factory, "crash", (RELEASE, NEW_RELEASE))


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    (container,) = testbed.boot(serving_spec())
    yield container
    testbed.destroy(container)


def router_data(c: Container, indexes: Indexes, **extra: object) -> dict[str, object]:
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address}
    return base_data(c, indexes, router=router, **extra)


def listed(c: Container) -> dict[str, bool]:
    # The worker API wants the router's control-plane key (docs/security.md).
    _, key, _ = c.ssh_run(f"cat {layout.CONTROL_PLANE_KEY_FILE}")
    status, body = http(f"http://{c.address}:{ROUTER_PORT}/workers", key=key.strip())
    assert status == 200, status
    return {w["url"]: w["is_healthy"] for w in body["workers"]}


def running_release(c: Container, rank: int) -> str:
    """What rank's process runs: its /proc/PID/cmdline's interpreter (ENV/bin/python)."""
    pid = unit_states(c, range(rank, rank + 1))[rank][1]
    _, out, _ = c.ssh_run(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    return NEW_RELEASE if f"{NEW_RELEASE}-{LANE}" in out else RELEASE


def test_a_deploy_killed_in_the_engine_install_or_between_a_unit_write_and_its_restart(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    ok(deploy(tmp_path, {c: router_data(c, indexes)}))
    # Behind a router, a converged re-run changes nothing (issue 29).
    again = deploy(tmp_path, {c: router_data(c, indexes)})
    ok(again)
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again

    def roll() -> Deploying:
        return start_deploy(tmp_path, {c: router_data(c, indexes, sglang_version=NEW_RELEASE)})

    # Killed inside the engine install: the new environment is made, not installed. Every rank
    # still serves the old release, all in the router; nothing names the partial environment.
    killed_at(
        c, f"mv {UV} {UV}.real && {written_double(UV, UV_DOUBLE)}", f"mv -f {UV}.real {UV}", roll
    )
    _, partial, _ = c.ssh_run(f"ls -d /opt/sglang/envs/{NEW_RELEASE}-*")
    assert partial.strip(), "the kill was not inside the install"
    assert [running_release(c, r) for r in range(8)] == [RELEASE] * 8
    workers = listed(c)
    assert len(workers) == 8 and all(workers.values()), workers

    # Killed between rank 0's unit write and its restart (the re-run first finishes the engine).
    systemctl = "/usr/local/sbin/systemctl"
    killed_at(c, written_double(systemctl, SYSTEMCTL_DOUBLE), f"rm -f {systemctl}", roll)

    # Killed there: rank 0's file names the new release, its process still runs the old one,
    # and it is out of the router (one batch); the others serve, unchanged.
    assert running_release(c, 0) == RELEASE
    workers = listed(c)
    assert f"http://{c.address}:30000" not in workers, workers
    assert len(workers) == 7 and all(workers.values()), workers
    status = run_status(tmp_path, c, router_data(c, indexes, sglang_version=NEW_RELEASE))
    assert "pending restart" in status["ranks"][0]["state"], status["ranks"][0]

    finished = deploy(tmp_path, {c: router_data(c, indexes, sglang_version=NEW_RELEASE)})
    ok(finished)
    backs = [k for k in serve_ops(finished) if "back into the router" in k]
    assert len(backs) == 8, serve_ops(finished)
    assert [running_release(c, r) for r in range(8)] == [NEW_RELEASE] * 8
    workers = listed(c)
    assert sorted(workers) == [f"http://{c.address}:{30000 + r}" for r in range(8)], workers
    assert all(workers.values()), workers

    converged = deploy(tmp_path, {c: router_data(c, indexes, sglang_version=NEW_RELEASE)})
    ok(converged)
    assert {k: v for k, v in converged.statuses.items() if v != "No changes"} == {}, converged
    status = run_status(tmp_path, c, router_data(c, indexes, sglang_version=NEW_RELEASE))
    pids = unit_states(c, range(8))
    for row in status["ranks"]:
        assert row["state"] == "active (running)", row
        assert row["pid"] == pids[row["rank"]][1], row
        assert row["sglang_version"] == NEW_RELEASE, row


def run_status(tmp_path: Path, c: Container, data: dict[str, object]) -> dict[str, Any]:
    """`python -m operations.status --json` for the host: its document."""
    inventory = status_inventory(tmp_path, {c.name: {**c.host_data(), **data}})
    proc = status_command(inventory, "--json")
    doc: dict[str, Any] = json.loads(proc.stdout)
    host_doc: dict[str, Any] = doc["hosts"][c.name]
    return host_doc
