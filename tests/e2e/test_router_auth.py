"""The router's control plane, end to end, against the real smg 1.13.0 (the default) reachable by a
stranger: this test process, on loopback, with an HTTP server of its own that counts every
request it gets.

First the failure, played on the same container: the router as it was started before (no
control-plane key) accepts the stranger's unauthenticated `POST /workers` (202) and then sends
the stranger's server requests. Then the deployed router: the stranger's `POST /workers` and
`DELETE /workers/{id}` are refused (401) and change nothing, 0 requests reach its server, the
deploy's own drain (which sends the key) still rolls the ranks, and a converged re-run changes
nothing, the key included. The key is in one root-only file and nowhere else.

Then two hosts behind one router with no key file made by hand: the first run makes the key on
the controller (mode 600, beside the engine locks), both hosts get it, the router serves both
hosts' ranks and refuses a caller without it, and the re-run changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import stat
import threading
from collections.abc import Iterator
from http import server as httpserver
from pathlib import Path
from typing import Any

import pytest

from tests import testbed as tb
from tests.e2e.deploying import Indexes
from tests.e2e.index import wait_for
from tests.e2e.serving import ROUTER_PORT, base_data, deploy, http, ok, serve_ops, serving_spec
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.testbed import Container

pytestmark = pytest.mark.e2e

KEY_FILE = "/etc/sglang/router-control-plane.key"
OPEN_PORT = 8100  # the router as it was started before: no control-plane key


class Stranger:
    """An HTTP server of someone else's, on loopback: answers like a worker, counts requests
    (with whether each carried an Authorization header)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []
        seen = self.seen

        class Handler(httpserver.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append((self.command, self.path, "Authorization" in self.headers))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"model_path": "stranger", "choices": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = httpserver.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    (container,) = testbed.boot(serving_spec())
    yield container
    testbed.destroy(container)


@pytest.fixture
def hosts(testbed: tb.Testbed) -> Iterator[list[Container]]:
    """Two fresh hosts: the router's first run over both."""
    containers = testbed.boot(serving_spec(), serving_spec())
    yield containers
    for container in containers:
        testbed.destroy(container)


@pytest.fixture
def stranger() -> Iterator[Stranger]:
    made = Stranger()
    yield made
    made.stop()


def call(url: str, method: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    """One control-plane call as anyone on the network makes it."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            raw = response.read().decode()
            return response.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as error:
        return error.code, None


def workers(base: str, key: str) -> dict[str, str]:
    status, body = call(f"{base}/workers", "GET", key=key)
    assert status == 200, status
    return {w["url"]: w["id"] for w in body["workers"]}


def chat(base: str, n: int) -> None:
    for _ in range(n):
        status, body = http(
            f"{base}/v1/chat/completions",
            {"model": "Qwen/Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}]},
            key="sk-client-bearer-4b1d",
        )
        assert status == 200, (status, body)


def router_data(
    c: Container, indexes: Indexes, on: Container | None = None, **extra: Any
) -> dict[str, Any]:
    """Host `c`'s data behind the router on `on` (default: on `c`), no key file set."""
    at = on or c
    router = {"host": at.name, "port": ROUTER_PORT, "bind": at.address, "policy": "round_robin"}
    return base_data(c, indexes, dp_size=2, router=router, **extra)


def test_a_stranger_cannot_add_or_remove_workers_and_the_drain_still_works(
    host: Container, indexes: Indexes, tmp_path: Path, stranger: Stranger
) -> None:
    c = host
    first = deploy(tmp_path, {c: router_data(c, indexes)})
    ok(first)
    _, key, _ = c.ssh_run(f"cat {KEY_FILE}")
    key = key.strip()
    assert len(key) >= 32

    # The failure, first: the same router release, started as it was before (no key).
    _, exec_start, _ = c.ssh_run("grep ^ExecStart= /etc/systemd/system/sglang-router.service")
    # The router's interpreter and its launcher module (smg.launch_router, the default router).
    python, _, module = exec_start.split("=", 1)[1].split()[:3]
    open_router = (
        f"systemd-run --unit=open-router -p User=sglang {python} -m {module}"
        f" --worker-urls http://{c.address}:30000 --host {c.address} --port {OPEN_PORT}"
        f" --prometheus-host {c.address} --prometheus-port 29100"
    )
    assert c.ssh_run(open_router)[0] == 0
    try:
        opened = f"http://{c.address}:{OPEN_PORT}"
        wait_for(lambda: http(f"{opened}/health")[0] == 200, timeout=60, what="open router")
        status, _ = call(f"{opened}/workers", "POST", {"url": stranger.url})
        assert status == 202, status  # accepted from anyone
        wait_for(lambda: bool(stranger.seen), timeout=60, what="the stranger's server reached")
    finally:
        c.ssh_run("systemctl stop open-router.service; systemctl reset-failed open-router; true")
    stranger.seen.clear()

    # The deployed router: the stranger is refused, and nothing changes.
    base = f"http://{c.address}:{ROUTER_PORT}"
    wait_for(lambda: http(f"{base}/health")[0] == 200, timeout=60, what="router healthy")
    before = workers(base, key)
    assert sorted(before) == [f"http://{c.address}:{30000 + r}" for r in range(2)], before
    assert call(f"{base}/workers", "POST", {"url": stranger.url})[0] == 401
    assert call(f"{base}/workers", "POST", {"url": stranger.url}, key="guessed-key")[0] == 401
    assert call(f"{base}/workers", "GET")[0] == 401
    some_id = next(iter(before.values()))
    assert call(f"{base}/workers/{some_id}", "DELETE")[0] == 401
    chat(base, 10)  # clients are served by the ranks, through the router
    assert workers(base, key) == before
    assert stranger.seen == [], stranger.seen  # 0 requests reached the stranger's server

    # The key is in one root-only file: not in the unit, a command line, the journal or a log.
    assert key not in first.output
    _, mode, _ = c.ssh_run(f"stat -c '%a %U %G' {KEY_FILE}")
    assert mode.split() == ["600", "root", "root"], mode
    _, files, _ = c.ssh_run(f"grep -rl -- {key} /etc /opt /usr/local /var/lib/sglang; true")
    assert files.split() == [KEY_FILE], files
    _, cmdlines, _ = c.ssh_run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert key not in cmdlines
    _, journal, _ = c.ssh_run(f"journalctl --no-pager | grep -c -- {key}; true")
    assert journal.strip() == "0", journal

    # The deploy's own drain sends the key: a roll drains each rank out and back in.
    rolled = deploy(tmp_path, {c: router_data(c, indexes, mem_fraction_static=0.8)})
    ok(rolled)
    outs = [k for k in serve_ops(rolled) if "out of the router and drain" in k]
    backs = [k for k in serve_ops(rolled) if "back into the router" in k]
    assert outs and len(outs) == len(backs), serve_ops(rolled)
    assert all(v == "Success" for k, v in serve_ops(rolled).items() if k in outs + backs)
    assert sorted(workers(base, key)) == sorted(before)
    assert key not in rolled.output

    # Converged: nothing changes, the key is not rewritten, the router not restarted.
    _, sum_before, _ = c.ssh_run(f"sha256sum {KEY_FILE}; systemctl show -p MainPID sglang-router")
    again = deploy(tmp_path, {c: router_data(c, indexes, mem_fraction_static=0.8)})
    ok(again)
    assert {k: v for k, v in serve_ops(again).items() if v != "No changes"} == {}, again
    _, sum_after, _ = c.ssh_run(f"sha256sum {KEY_FILE}; systemctl show -p MainPID sglang-router")
    assert sum_after == sum_before


def test_two_hosts_behind_one_router_need_no_hand_made_key(
    hosts: list[Container], indexes: Indexes, tmp_path: Path
) -> None:
    a, b = hosts
    data = {a: router_data(a, indexes), b: router_data(b, indexes, on=a)}
    # The testbed's inventory keeps the engine locks here (tests/testbed/inventory.py).
    key_file = tmp_path / "locks" / "router-control-plane.key"
    assert not key_file.exists()
    first = deploy(tmp_path, data)
    ok(first)
    # Made on the controller by this first run: mode 600, ours, and said by its path only.
    found = key_file.stat()
    assert stat.S_IMODE(found.st_mode) == 0o600, oct(found.st_mode)
    key = key_file.read_text().strip()
    assert len(key) >= 32 and key not in first.output
    assert str(key_file) in first.output  # the plan names where the key is kept
    digest = hashlib.sha256((key + "\n").encode()).hexdigest()
    for c in (a, b):  # one key, on both hosts, root only
        _, out, _ = c.ssh_run(f"sha256sum {KEY_FILE}; stat -c '%a %U %G' {KEY_FILE}")
        assert out.split() == [digest, KEY_FILE, "600", "root", "root"], (c.name, out)

    base = f"http://{a.address}:{ROUTER_PORT}"
    wait_for(lambda: http(f"{base}/health")[0] == 200, timeout=60, what="router healthy")
    assert call(f"{base}/workers", "GET")[0] == 401
    ranks = [f"http://{c.address}:{30000 + r}" for c in (a, b) for r in range(2)]
    assert sorted(workers(base, key)) == sorted(ranks)
    chat(base, 8)

    # The re-run reads the key the first made: nothing changes, on either host.
    made = key_file.stat().st_mtime_ns
    _, pid_before, _ = a.ssh_run("systemctl show -p MainPID sglang-router")
    again = deploy(tmp_path, data)
    ok(again)
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again
    assert key_file.stat().st_mtime_ns == made and key_file.read_text().strip() == key
    _, pid_after, _ = a.ssh_run("systemctl show -p MainPID sglang-router")
    assert pid_after == pid_before
