"""Who is sent the API key (issue 20, item 4): the listener check smoke.py and wait_healthy.py
share (operations/programs/hostsafe.py, inlined into each). Its /proc/net/tcp parser reads lines
captured on a real machine (tests/fixtures/proc-net-tcp/SOURCE.md); the attack runs the real
scripts, as the host gets them, against a real listener that a process of another user
(`nobody`, dropped to before it binds) holds, and the listener records every request it gets:
the key never reaches it, and the error names the port and the owner. The positive cases run
the same scripts against a listener of the expected user.

systemctl and journalctl are stand-ins (the unit's ActiveState is the test's to say), and so is
httpx for smoke.py, which the controller's environment does not have (the engine environment's
real one is used end to end, tests/e2e/test_smoke.py): a urllib client with the calls smoke.py
makes. The listener check, the key file and the requests on the wire are real.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations.render.host_scripts import load
from tests.unit.shipped import script_path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "proc-net-tcp"
KEY = "sk-live-listener-7f3a9c"
MODEL = "e2e/tiny"
NOBODY = 65534

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="binds as another user: needs root")


# The script as the host gets it: the listener check is hostsafe.py's, inlined.
smoke = load("smoke.py", "listeners_smoke")


# -- /proc/net/tcp and tcp6, as captured ------------------------------------------------------


def ip(text: str) -> Any:
    return ipaddress.ip_address(text)


def captured() -> list[Any]:
    found = []
    for name in ("tcp", "tcp6"):
        found += smoke.parse_listeners((FIXTURES / name).read_text())
    return found


def test_the_captured_listeners_are_read_with_address_port_and_uid() -> None:
    mine = {(x.address, x.port, x.uid) for x in captured() if x.uid == NOBODY}
    assert mine == {
        (ip("127.0.0.1"), 39001, NOBODY),
        (ip("::"), 39002, NOBODY),
        (ip("::1"), 39003, NOBODY),
        (ip("0.0.0.0"), 39004, NOBODY),
        (ip("::ffff:127.0.0.1"), 39005, NOBODY),
    }
    # Only listening sockets (st 0A): the captured TIME_WAIT lines (st 06) are not listeners.
    tcp = (FIXTURES / "tcp").read_text().splitlines()[1:]
    listening = [line for line in tcp if line.split()[3] == "0A"]
    assert len(smoke.parse_listeners((FIXTURES / "tcp").read_text())) == len(listening) < len(tcp)
    assert (ip("127.0.0.1"), 22) not in {(x.address, x.port) for x in captured()}


@pytest.mark.parametrize(
    ("url", "reached"),
    [
        ("http://127.0.0.1:39001/v1", ["127.0.0.1"]),
        # An IPv4 client reaches a dual-stack :: listener, and an IPv4-mapped one.
        ("http://127.0.0.1:39002/v1", ["::"]),
        ("http://127.0.0.1:39005/v1", ["::ffff:127.0.0.1"]),
        ("http://127.0.0.1:39004/health", ["0.0.0.0"]),
        ("http://[::1]:39003/v1", ["::1"]),
        ("http://[::1]:39002/v1", ["::"]),
        # An IPv6 client never reaches an IPv4 listener.
        ("http://[::1]:39004/v1", []),
        ("http://127.0.0.1:39003/v1", []),
    ],
)
def test_every_listener_a_connection_may_reach_is_counted(url: str, reached: list[str]) -> None:
    _, reaching = smoke.listening(url, captured())
    assert sorted(x.address for x in reaching) == [ip(a) for a in reached]


def test_another_users_listener_is_named_with_port_and_owner() -> None:
    where, reaching = smoke.listening("http://127.0.0.1:39001/v1", captured())
    assert smoke.owner_problem(where, reaching, "root") == (
        "127.0.0.1:39001 is held by uid 65534 (nobody), not by the service user root (uid 0)"
    )
    assert smoke.owner_problem(where, reaching, "nobody") is None
    where, reaching = smoke.listening("http://127.0.0.1:39999/v1", captured())
    assert smoke.owner_problem(where, reaching, "nobody") == "nothing listens on 127.0.0.1:39999"
    no_user = smoke.owner_problem(where, reaching, "no-such-user-x")
    assert no_user == "the service user 'no-such-user-x' does not exist on this host"


# -- the attack, with the real scripts ---------------------------------------------------------

# A server that records every request it gets (request line and Authorization header) on its
# stdout, as SGLang would answer: /health, /v1/models, /v1/chat/completions. It drops to the uid
# in argv[1] (-1: stays root) before it binds; everything it needs is imported before that.
SERVER = r"""
import encodings.idna, http.server, json, os, sys  # idna: getfqdn, at bind
uid = int(sys.argv[1])
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
MODEL = sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, body):
        self.request_body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if callable(body):
            body = body()
        seen = {"request": self.requestline, "auth": self.headers.get("Authorization")}
        print(json.dumps(seen), flush=True)
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._answer({"data": [{"id": MODEL}]} if self.path.endswith("/models") else {})
    def do_POST(self):
        self._answer(self._sum)
    def _sum(self):  # the smoke's question (programs/smoke.py QUESTION), answered right
        text = json.loads(self.request_body)["messages"][-1]["content"]
        a, b = text.removeprefix("What is ").split("?")[0].split(" + ")
        message = {"role": "assistant", "content": str(int(a) + int(b))}
        usage = {"completion_tokens": 2}
        return {"model": MODEL, "choices": [{"message": message}], "usage": usage}
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"port": server.server_address[1]}), flush=True)
server.serve_forever()
"""

HTTPX = '''"""Stand-in for httpx (tests/unit/test_listeners.py): smoke.py's calls, over urllib."""
import json as json_mod
import urllib.error
import urllib.request


class HTTPError(Exception):
    pass


class TimeoutException(HTTPError):
    pass


class Response:
    def __init__(self, status_code, text):
        self.status_code, self.text = status_code, text


class Client:
    def __init__(self, trust_env, timeout, headers):
        self.timeout, self.headers = timeout, headers
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _send(self, url, data=None):
        headers = dict(self.headers, **({"Content-Type": "application/json"} if data else {}))
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                return Response(response.status, response.read().decode())
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read().decode())
        except OSError as error:
            raise HTTPError(str(error)) from error

    def get(self, url):
        return self._send(url)

    def post(self, url, json=None):
        return self._send(url, json_mod.dumps(json).encode())
'''


class Listener:
    """The recording server, bound by `uid` (-1: root); stopped by its PID."""

    def __init__(self, uid: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(uid), MODEL],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(json.loads(self.proc.stdout.readline())["port"])

    def stop(self) -> list[dict[str, Any]]:
        """Every request it received."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def listeners() -> Iterator[Any]:
    started: list[Listener] = []

    def start(uid: int) -> Listener:
        started.append(Listener(uid))
        return started[-1]

    yield start
    for listener in started:
        if listener.proc.poll() is None:
            listener.stop()


def host(tmp_path: Path, state: str) -> dict[str, str]:
    """PATH with systemctl saying every unit is `state`, a silent journalctl, and httpx."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(
        f"#!/bin/sh\nprintf 'ActiveState={state}\\nSubState=running\\nNRestarts=0\\n'\n"
    )
    (bin_dir / "journalctl").write_text("#!/bin/sh\ntrue\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    modules = tmp_path / "modules"
    modules.mkdir(exist_ok=True)
    (modules / "httpx.py").write_text(HTTPX)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(modules)}


def run_smoke(
    tmp_path: Path, state: str, user: str, *args: str
) -> subprocess.CompletedProcess[str]:
    key_file = tmp_path / "secrets.yaml"
    key_file.write_text(f"api-key: {json.dumps(KEY)}\n")
    words = ["--model", MODEL, "--timeout", "10", "--key-file", str(key_file)]
    return subprocess.run(
        [sys.executable, str(script_path("smoke.py")), *words, "--service-user", user, *args],
        env=host(tmp_path, state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_wait(tmp_path: Path, user: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, str(script_path("wait_healthy.py")), "--timeout", "30"),
            *("--service-user", user, f"sglang@0.service={url}"),
        ],
        env=host(tmp_path, "active"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
@root_only
def test_a_port_held_by_another_user_is_sent_nothing_and_named(
    tmp_path: Path, listeners: Any
) -> None:
    squatter = listeners(NOBODY)  # bound while the rank was stopped, before it could
    base = f"http://127.0.0.1:{squatter.port}/v1"
    proc = run_smoke(tmp_path, "active", "root", "--journal", f"sglang@0.service={base}")
    received = squatter.stop()
    assert received == [], received  # not the key, not even the question
    assert proc.returncode == 1, proc
    where = f"127.0.0.1:{squatter.port}"
    assert f"{where} is held by uid 65534 (nobody), not by the service user root (uid 0)" in (
        proc.stdout
    ), proc.stdout
    assert KEY not in proc.stdout + proc.stderr


@pytest.mark.integration
@root_only
def test_the_service_users_listener_of_an_active_unit_gets_the_key(
    tmp_path: Path, listeners: Any
) -> None:
    rank = listeners(-1)  # root's: the service user of this case
    base = f"http://127.0.0.1:{rank.port}/v1"
    proc = run_smoke(tmp_path, "active", "root", "--journal", f"sglang@0.service={base}")
    received = rank.stop()
    assert proc.returncode == 0, proc
    assert [r["request"].split()[:2] for r in received] == [
        ["GET", "/v1/models"],
        ["POST", "/v1/chat/completions"],
    ]
    assert {r["auth"] for r in received} == {f"Bearer {KEY}"}


@pytest.mark.integration
@root_only
def test_a_stopped_ranks_port_is_sent_nothing_even_by_status(
    tmp_path: Path, listeners: Any
) -> None:
    # status --probe asks every configured rank: one whose unit is stopped is not asked, even
    # when the service user itself listens there.
    other = listeners(-1)
    base = f"http://127.0.0.1:{other.port}/v1"
    proc = run_smoke(
        tmp_path, "inactive", "root", "--json", "--unit", "0=sglang@0.service", f"0={base}"
    )
    assert other.stop() == []
    (line,) = [json.loads(x[6:]) for x in proc.stdout.splitlines() if x.startswith("smoke ")]
    assert line["answered"] is False
    assert line["why"] == (
        f"nothing sent (the API key stays here): sglang@0.service is inactive: whoever listens "
        f"on 127.0.0.1:{other.port} is not it"
    )


@pytest.mark.integration
@root_only
def test_through_the_router_nothing_is_sent_while_a_local_ranks_port_is_another_users(
    tmp_path: Path, listeners: Any
) -> None:
    router = listeners(-1)
    squatter = listeners(NOBODY)
    args = ["--unit", "router=sglang-router.service"]
    args += ["--router-worker", f"sglang@1.service=http://127.0.0.1:{squatter.port}/v1"]
    args += [f"router=http://127.0.0.1:{router.port}/v1*2"]
    proc = run_smoke(tmp_path, "active", "root", *args)
    assert router.stop() == [] and squatter.stop() == []
    assert proc.returncode == 1, proc
    assert (
        f"the router forwards to 127.0.0.1:{squatter.port}: 127.0.0.1:{squatter.port} is held "
        "by uid 65534 (nobody)"
    ) in proc.stdout, proc.stdout


@pytest.mark.integration
@root_only
def test_the_health_wait_takes_no_200_from_another_users_listener(
    tmp_path: Path, listeners: Any
) -> None:
    squatter = listeners(NOBODY)
    proc = run_wait(tmp_path, "root", f"http://127.0.0.1:{squatter.port}/health")
    assert squatter.stop() == []  # judged by its owner before any request
    assert proc.returncode == 1, proc
    assert "healthy after" not in proc.stdout
    assert (
        f"sglang@0.service: 127.0.0.1:{squatter.port} is held by uid 65534 (nobody), not by the "
        "service user root (uid 0): its answers are not sglang@0.service's"
    ) in proc.stdout, proc.stdout


@pytest.mark.integration
@root_only
def test_the_health_wait_takes_a_200_from_the_service_users_listener(
    tmp_path: Path, listeners: Any
) -> None:
    rank = listeners(-1)
    proc = run_wait(tmp_path, "root", f"http://127.0.0.1:{rank.port}/health")
    assert [r["request"].split()[:2] for r in rank.stop()] == [["GET", "/health"]]
    assert proc.returncode == 0 and "sglang@0.service: healthy after" in proc.stdout, proc
