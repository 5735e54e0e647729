"""Upgrading the toolkit on a serving host, end to end: a host an earlier version of this
repository deployed (its commit, run from its own tree with this venv) is deployed again by this
tree, in one run, under client load through the router; a re-run changes nothing.

Two earlier versions, kept here in one place (CHANGELOG.md names each version's commit):
PREVIOUS, the version before this one, which moves forward at each version; and
LAST_ON_SGLANG_ROUTER, the last version whose router was sglang-router 0.3.2. From it, behind
the router with an API key, this tree moves the router to smg 1.13.0 and restarts every rank
(new unit contents, a new engine): the plan announces the router's move and its window, and no
client request fails outside that window, as every drain speaks the API of the router running
when it drains (the router moves before the ranks roll, operations/plan/router_step.py).
Without a router, the upgrade restarts what changed (not drain-protected, as the plan says) and
ends with all 8 serving. The commits must be in this clone's history: CI's clone is a full one.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from operations.plan.router_step import ROUTER_RESTART_WINDOW_S
from tests import testbed as tb
from tests.e2e.benching import slow_ranks
from tests.e2e.deploying import REPO, Indexes, Run, run_deploy
from tests.e2e.index import wait_for
from tests.e2e.load import CLIENTS, Load
from tests.e2e.serving import (
    RELEASE,
    ROUTER_PORT,
    base_data,
    health,
    http,
    ok,
    release_indexes,
    serving_spec,
    unit_states,
)
from tests.testbed import Container

pytestmark = pytest.mark.e2e

# The versions a host is upgraded from: (version, commit), CHANGELOG.md's.
PREVIOUS = ("0.14.0", "25e5cb84eeb11705dd93674b95706b33238576d8")
LAST_ON_SGLANG_ROUTER = ("0.9.0", "80d22312444e3134bd0a9b6cbf0f5b3bc531a455")
# Where an earlier version keeps its settings' schema (it refuses a key it does not know).
SCHEMAS = ("operations/settings/settings.schema.json", "operations/settings.schema.json")

GENERATE_S = 0.3
LOAD_S = 3
API_KEY = "sk-upgrade-test-key-0123456789"
OLD_ROUTER_ENV = "/opt/sglang/router/sglang-router-0.3.2"
NEW_ROUTER_ENV = "/opt/sglang/router/smg-1.13.0"
# What a client sees inside the router's restart: a refused or reset connection, or smg's
# answer while it lists no rank ready yet (tests/e2e/test_router_move.py).
REFUSED = ("ConnectionRefused", "ConnectionReset", "RemoteDisconnected", "404 ", "503 ")


def earlier_tree(tmp_path_factory: pytest.TempPathFactory, version: str, commit: str) -> Path:
    """An earlier version's tree, unpacked from this clone's history (git archive)."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the upgrade test needs commit {commit[:12]} (version {version}) in this clone's "
            "history: clone without --depth, or `git fetch --unshallow`"
        )
    tree = tmp_path_factory.mktemp(f"toolkit-{version}")
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    return tree


@pytest.fixture(scope="module", params=[PREVIOUS, LAST_ON_SGLANG_ROUTER], ids=lambda v: v[0])
def earlier(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Earlier:
    version, commit = request.param
    return Earlier(version, earlier_tree(tmp_path_factory, version, commit))


@dataclass(frozen=True)
class Earlier:
    version: str
    tree: Path


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    yield from release_indexes(tmp_path_factory, "upgrade", (RELEASE,))


@pytest.fixture
def host(boot_containers: tb.BootContainers) -> Container:
    (container,) = boot_containers(serving_spec())
    slow_ranks(container, GENERATE_S, LOAD_S)
    return container


def earlier_data(tree: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The host data an earlier version accepts: its settings' keys and the connector's."""
    schema = next(tree / s for s in SCHEMAS if (tree / s).exists())
    known = json.loads(schema.read_text())["properties"]
    return {k: v for k, v in data.items() if k in known or k.startswith("ssh_")}


def deploy_earlier(tmp_path: Path, earlier: Earlier, c: Container, data: dict[str, Any]) -> Run:
    run = run_deploy(tmp_path, {c: earlier_data(earlier.tree, data)}, repo=earlier.tree)
    ok(run)
    return run


def router_env(c: Container) -> str:
    """The router environment the running router process has its code mapped from."""
    _, pid, _ = c.ssh_run("systemctl show -p MainPID --value sglang-router.service")
    _, maps, _ = c.ssh_run(f"grep -o '/opt/sglang/router/[^/]*' /proc/{pid.strip()}/maps | sort -u")
    return maps.strip()


def changes(run: Run) -> dict[str, str]:
    return {k: v for k, v in run.statuses.items() if v != "No changes"}


def all_serving(c: Container) -> bool:
    return all(health(c, 30000 + r) == 200 for r in range(8))


def test_a_host_an_earlier_version_served_behind_its_router_upgrades_under_load(
    host: Container, earlier: Earlier, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address}
    data = base_data(c, indexes, router=router, api_key_file=str(key_file))
    deploy_earlier(tmp_path, earlier, c, data)
    moves = router_env(c) == OLD_ROUTER_ENV
    assert moves or router_env(c) == NEW_ROUTER_ENV
    url = f"http://{c.address}:{ROUTER_PORT}"
    pids = unit_states(c, range(8))
    router_pid = c.ssh_run("systemctl show -p MainPID --value sglang-router.service")[1]
    with Load(url, key=API_KEY) as load:
        started = time.monotonic()
        run = run_deploy(tmp_path, {c: data})
        took = time.monotonic() - started
        after = load.sent
        # The load goes on through smg after the upgrade.
        wait_for(lambda: load.sent >= after + 4 * CLIENTS, 60, "answers through smg")
    print(load.report(f"upgrade {earlier.version} -> this tree in {took:.1f}s"))
    print(f"client-visible window: {load.window_s():.2f}s")
    ok(run)
    assert API_KEY not in run.output
    # Every rank that restarted was drained through the router running at the time.
    backs = [k for k in run.statuses if "back into the router" in k]
    assert all(run.statuses[k].startswith("Success") for k in backs), run.statuses
    if backs:  # the load ran through the roll
        assert after > 8 * CLIENTS, load.report("upgrade")
    if moves:
        # The plan announced the move and its window before any change, and the ranks rolled.
        assert "move the router sglang-router-0.3.2 -> smg 1.13.0" in run.output, run.output
        assert f"refused for about {ROUTER_RESTART_WINDOW_S}s" in run.output
        assert "the router moves before the ranks roll" in run.output
        assert backs, run.statuses
        # What failed, failed inside the router's restart window, as the plan said.
        assert load.window_s() <= ROUTER_RESTART_WINDOW_S, load.report(f"{load.window_s()}s")
        refused = [f for f in load.failures if not any(r in f for r in REFUSED)]
        assert refused == [], sorted(set(load.failures))
    else:
        # From the previous version: as CHANGELOG.md says, no rank and no router restarts,
        # and no request fails.
        assert backs == [], run.statuses
        assert unit_states(c, range(8)) == pids
        assert c.ssh_run("systemctl show -p MainPID --value sglang-router.service")[1] == router_pid
        assert load.failed == 0, load.report("upgrade")
    assert router_env(c) == NEW_ROUTER_ENV
    assert c.ssh_run(f"test -d {OLD_ROUTER_ENV}")[0] != 0, "the old router's environment is left"
    _, control_key, _ = c.ssh_run("cat /etc/sglang/router-control-plane.key")
    status, listed = http(f"{url}/workers", key=control_key.strip())
    assert status == 200, status
    assert sorted(w["status"] for w in listed["workers"]) == ["ready"] * 8, listed
    assert all_serving(c)
    again = run_deploy(tmp_path, {c: data})
    ok(again)
    assert changes(again) == {}, again


def test_a_host_an_earlier_version_served_without_a_router_upgrades(
    host: Container, earlier: Earlier, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    data = base_data(c, indexes)
    deploy_earlier(tmp_path, earlier, c, data)
    assert all_serving(c)
    run = run_deploy(tmp_path, {c: data})
    ok(run)
    assert all_serving(c)
    again = run_deploy(tmp_path, {c: data})
    ok(again)
    assert changes(again) == {}, again
