"""Capture how the real smg (Shepherd Model Gateway) behaves: tests/fixtures/smg/behaviour-V.json.

    python scripts/capture_smg_behaviour.py [--version 1.13.0] [--smg-python PATH]

Starts the released smg, installed from operations/kb/pins/smg-V-pyX.Y.txt
(`--require-hashes --only-binary :all:`) into a throwaway virtualenv outside the repository
(~/.cache/sglang-deploy/smg-capture/, or `--smg-python` names an interpreter that has it), on
127.0.0.1 in front of two tiny HTTP workers of the standard library (they answer what smg reads
from an SGLang rank: /health, /v1/models, /server_info, /model_info, /metrics, and
/v1/chat/completions slowly enough to be in flight). smg is started the way the deploy starts a
router: operations/programs/router_launch.py with the control-plane key in a systemd-style
credential directory, so the key reaches smg's own parser in-process, never an argv.

Records, with the key closed:
- the worker API's status codes: GET /workers without a key, with a wrong one, with the key;
  POST of a new and of a listed URL; PATCH; DELETE of an unknown id;
- the per-worker drain settle: carried by a POST (health.drain_settle_secs 1), set by PATCH
  (1, and 0), and what GET /workers/{id} says (`job_status`) while the PATCH's job runs;
- the `status` of each worker in GET /workers before, during and after a DELETE with requests
  in flight, how long the DELETE takes to remove it, whether requests sent while it drains
  reach it, and how the requests in flight at the removal end;
- a worker whose /health fails, then answers again (static workers: does it come back?);
- SIGTERM with nothing in flight: does it still serve, what /readiness says, how long it takes
  to exit (what a router restart costs clients);
- smg started with CONTROL_PLANE_API_KEYS in its environment and no option: is the control
  plane closed (does the Python launcher read that variable the Rust binary declares)?
- a worker whose requests fail until its circuit breaker opens: what GET /workers, GET
  /workers/{id} and the smg_worker_cb_state / smg_worker_health gauges say of it, what a client
  gets once the other worker is drained, and whether the gauge moves when the breaker's timeout
  passes with no request (smg moves an open breaker to half_open on its next look).

Timings are rounded to 0.1 s; ids and ports, which change every run, are left out. No GPU, no
engine, no network beyond PyPI for the install. Review the diff and commit the fixture.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "smg"
LAUNCHER = REPO / "operations" / "programs" / "router_launch.py"
KEY = "capture-key-not-a-secret"
# Requests in flight across the drain: longer than smg's default drain_settle_secs (5).
SLOW_S = 8.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def log(message: str) -> None:
    print(f"[capture_smg] {message}", file=sys.stderr, flush=True)


# -- the tiny workers -------------------------------------------------------------------------


class Rank:
    """One stand-in SGLang rank: counts what it serves and what it has in flight."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True
        self.failing = False  # every chat request answered 500 (an engine in trouble)
        self.in_flight = 0
        self.served = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        rank = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, kind: str = "application/json") -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                """The request's body: smg sends it chunked, without a Content-Length."""
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = b""
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()  # the empty line after the last chunk
                return data

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/health":
                    self._send(200 if rank.healthy else 503, {})
                elif path == "/v1/models":
                    model = {"id": "tiny", "object": "model", "owned_by": "sglang"}
                    self._send(200, {"object": "list", "data": [model]})
                elif path in ("/server_info", "/get_server_info"):
                    self._send(200, {"model_path": "tiny", "dp_size": 1, "version": "0.5.17"})
                elif path in ("/model_info", "/get_model_info"):
                    self._send(200, {"model_path": "tiny", "is_generation": True})
                elif path == "/metrics":
                    with rank.lock:
                        running = rank.in_flight
                    text = (
                        f'sglang:num_running_reqs{{model_name="tiny"}} {running}.0\n'
                        'sglang:num_queue_reqs{model_name="tiny"} 0.0\n'
                        'sglang:token_usage{model_name="tiny"} 0.0\n'
                    )
                    self._send(200, text, "text/plain; version=0.0.4")
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = self._body().decode(errors="replace")
                if self.path.split("?")[0] != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                if "fail:500" in body or rank.failing:  # an engine error: the router counts it
                    self._send(500, {"error": "asked to fail"})
                    return
                with rank.lock:
                    rank.in_flight += 1
                try:
                    # The message says how long to take, `sleep:S` (smg re-encodes the
                    # request: its text is all that is sure to come through).
                    asked = re.search(r"sleep:([0-9.]+)", body)
                    time.sleep(float(asked.group(1)) if asked else 0)
                finally:
                    with rank.lock:
                        rank.in_flight -= 1
                        rank.served += 1
                message = {"role": "assistant", "content": rank.name}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": "tiny",
                        "choices": [choice],
                        "usage": usage,
                    },
                )

        return Handler


# -- smg ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smg_python(version: str, given: str | None) -> str:
    """An interpreter with smg==version, from the pinned requirements, outside the repo."""
    if given:
        return given
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = REPO / "operations" / "kb" / "pins" / f"smg-{version}-py{python}.txt"
    if not pins.is_file():
        raise SystemExit(f"no {pins.relative_to(REPO)}: run scripts/pin_installs.py")
    base = Path(os.environ.get("SGLANG_DEPLOY_CACHE") or Path.home() / ".cache" / "sglang-deploy")
    venv = base / "smg-capture" / f"smg-{version}-py{python}"
    interpreter = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(interpreter), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
        pip += ["--require-hashes", "--only-binary", ":all:", "-r", str(pins)]
        subprocess.run(pip, check=True)
        (venv / ".installed").write_text(pins.read_text())
    return str(interpreter)


@contextlib.contextmanager
def running_smg(
    python: str,
    workers: list[str],
    port: int,
    extra_env: dict[str, str],
    with_key: bool,
    metrics_port: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[tuple[list[str], subprocess.Popen[str]]]:
    """smg on 127.0.0.1:port (its Prometheus listener on metrics_port, else any free one;
    extra_args after the capture's own); yields its log lines (filled while it runs) and its
    process."""
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as creds:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SGLANG"))}
        env.update(extra_env)
        if with_key:
            (Path(creds) / "control-plane-key").write_text(KEY + "\n")
            env["CREDENTIALS_DIRECTORY"] = creds
            # The launcher imports its siblings as operations.programs.* (as on a host).
            env["PYTHONPATH"] = str(REPO)
            cmd = [python, str(LAUNCHER), "smg.launch_router"]
        else:
            cmd = [python, "-m", "smg.launch_router"]
        cmd += ["--worker-urls", *workers, "--policy", "round_robin"]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        metrics = metrics_port or free_port()
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
        cmd += ["--health-check-interval-secs", "1", "--health-failure-threshold", "2"]
        cmd += ["--health-success-threshold", "1", "--health-check-timeout-secs", "1"]
        cmd += ["--retry-max-retries", "1", "--worker-startup-timeout-secs", "60"]
        cmd += list(extra_args)
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=lambda: lines.extend(out), daemon=True).start()
        try:
            wait_for(lambda: http("GET", port, "/health", key=KEY)[0] == 200, 60, "smg /health")
            yield lines, proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def http(
    method: str, port: int, path: str, body: Any = None, key: str | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with _DIRECT.open(request, timeout=30) as response:
            raw = response.read()
            code = response.status
    except urllib.error.HTTPError as error:
        raw, code = error.read(), error.code
    except OSError:
        return 0, None
    try:
        return code, json.loads(raw) if raw else None
    except ValueError:
        return code, raw.decode(errors="replace")[:200]


def wait_for(check: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout} s waiting for {what}")


def workers(port: int) -> dict[str, dict[str, Any]]:
    code, body = http("GET", port, "/workers", key=KEY)
    assert code == 200, (code, body)
    return {w["url"]: w for w in body["workers"]}


def statuses(port: int, names: dict[str, str]) -> dict[str, str]:
    return {names[u]: str(w.get("status")) for u, w in workers(port).items() if u in names}


CHAT_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "sleep:0"}]}


def chat(port: int, sleep: float, results: list[dict[str, Any]]) -> None:
    start = time.monotonic()
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"sleep:{sleep}"}]}
    code, answer = http("POST", port, "/v1/chat/completions", body)
    served = None
    if isinstance(answer, dict) and answer.get("choices"):
        served = answer["choices"][0]["message"]["content"]
    results.append({"status": code, "served_by": served, "ended_s": time.monotonic() - start})


def posture(lines: list[str]) -> list[str]:
    """The surfaces smg's start-up SECURITY POSTURE warning names as open (its fields)."""
    found = [line for line in lines if "SECURITY POSTURE" in line]
    return sorted(set(re.findall(r"([a-z_]+)=\"", ANSI.sub("", found[0])))) if found else []


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def measure_stop(proc: subprocess.Popen[str], port: int) -> dict[str, Any]:
    """SIGTERM with nothing in flight: how long smg takes to exit, and whether it still serves
    (a chat request, GET /readiness) in the meantime."""
    start = time.monotonic()
    proc.terminate()
    time.sleep(0.5)
    served: list[dict[str, Any]] = []
    chat(port, 0, served)
    readiness = http("GET", port, "/readiness")[0]
    proc.wait(60)
    return {
        "exit_after_sigterm_s": r1(time.monotonic() - start),
        "0.5 s after SIGTERM: a chat request": served[0]["status"],
        "0.5 s after SIGTERM: GET /readiness": readiness,
        "exit status": proc.returncode,
    }


def r1(seconds: float) -> float:
    return round(seconds, 1)


# -- the capture -------------------------------------------------------------------------------


def removal(port: int, url: str, worker_id: str) -> dict[str, Any]:
    """DELETE the worker: the statuses it is listed in until it leaves the list, and when."""
    start = time.monotonic()
    http("DELETE", port, f"/workers/{worker_id}", key=KEY)
    seen: list[str] = []
    while (listed := workers(port).get(url)) is not None and time.monotonic() - start < 30:
        if not seen or seen[-1] != listed.get("status"):
            seen.append(str(listed.get("status")))
        time.sleep(0.01)
    return {"statuses seen until removed": seen, "removed_after_s": r1(time.monotonic() - start)}


def capture_settle(port: int, url: str) -> dict[str, Any]:
    """The per-worker drain settle, on a worker (`url`, not listed) added for it: carried by the
    POST (health.drain_settle_secs), and set by PATCH, a queued job whose status GET
    /workers/{id} shows until it is done; settle 0 (no draining state at all?)."""
    found: dict[str, Any] = {}
    health = {"health": {"drain_settle_secs": 1}}
    http("POST", port, "/workers", {"url": url, **health}, key=KEY)
    wait_for(lambda: workers(port).get(url, {}).get("status") == "ready", 60, "ready")
    listed = workers(port)[url]
    found["drain_after_post_settle_1s"] = {
        "listed health": listed.get("health"),
        **removal(port, url, listed["id"]),
    }
    http("POST", port, "/workers", {"url": url}, key=KEY)
    wait_for(lambda: workers(port).get(url, {}).get("status") == "ready", 60, "ready")
    worker_id = workers(port)[url]["id"]
    patch = http("PATCH", port, f"/workers/{worker_id}", {"health": {"drain_settle_secs": 0}}, KEY)
    jobs: list[str | None] = []
    worker_statuses: set[str] = set()
    start = time.monotonic()
    while time.monotonic() - start < 30:
        got = http("GET", port, f"/workers/{worker_id}", key=KEY)[1]
        job = got.get("job_status")
        now = None if job is None else f"{job['job_type']} {job['status']}"
        if not jobs or jobs[-1] != now:
            jobs.append(now)
        worker_statuses.add(str(got.get("status")))
        if job is None:
            break
    found["PATCH /workers/{id}: GET /workers/{id} while the update runs"] = {
        "PATCH status": patch[0],
        "job_status seen (null: done)": jobs,
        "worker statuses seen": sorted(worker_statuses),
        "listed health after the PATCH": workers(port)[url].get("health"),
    }
    found["drain_after_patch_settle_0s"] = removal(port, url, worker_id)
    return found


def gauge(metrics_port: int, family: str, names: dict[str, str]) -> dict[str, float]:
    """One per-worker gauge on smg's Prometheus listener: {rank name: value} by its `worker`
    label (the worker's URL)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with _DIRECT.open(url, timeout=10) as response:
        text = response.read().decode(errors="replace")
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{family}{{worker="([^"]*)"}} (\S+)$', line.strip())
        if match and match.group(1) in names:
            found[names[match.group(1)]] = float(match.group(2))
    return found


def capture_breaker(python: str) -> dict[str, Any]:
    """A worker listed `ready` whose circuit breaker is open (its requests answered 500), the
    other one drained: what GET /workers and the metrics say of it, what a client gets, and
    when the breaker lets requests through again (router_workers.py's peer guard)."""
    a, b = Rank("a"), Rank("b")
    names = {a.url: "a", b.url: "b"}
    port, metrics_port, timeout_s = free_port(), free_port(), 4
    flags = ("--cb-failure-threshold", "2", "--cb-timeout-duration-secs", str(timeout_s))
    found: dict[str, Any] = {"flags": " ".join(flags)}
    with running_smg(python, [a.url, b.url], port, {}, True, metrics_port, flags):
        wait_for(lambda: statuses(port, names) == {"a": "ready", "b": "ready"}, 60, "2 ready")
        found["smg_worker_cb_state before"] = gauge(metrics_port, "smg_worker_cb_state", names)
        b.failing = True
        answers: list[dict[str, Any]] = []

        def opened() -> bool:
            chat(port, 0, answers)
            return gauge(metrics_port, "smg_worker_cb_state", names).get("b") == 1

        wait_for(opened, 30, "b's breaker open")
        listed = workers(port)[b.url]
        found["b open: chat requests sent"] = len(answers)
        found["b open: GET /workers"] = {
            "status": listed.get("status"),
            "is_healthy": listed.get("is_healthy"),
            "keys": sorted(listed),
        }
        found["b open: GET /workers/{id} keys"] = sorted(
            http("GET", port, f"/workers/{listed['id']}", key=KEY)[1]
        )
        found["b open: smg_worker_cb_state"] = gauge(metrics_port, "smg_worker_cb_state", names)
        found["b open: smg_worker_health"] = gauge(metrics_port, "smg_worker_health", names)
        ida = workers(port)[a.url]["id"]
        http("DELETE", port, f"/workers/{ida}", key=KEY)
        wait_for(lambda: statuses(port, names).get("a", "draining") == "draining", 10, "a out")
        code, body = http("POST", port, "/v1/chat/completions", CHAT_BODY)
        found["a drained, b listed ready with its breaker open: a chat request"] = {
            "status": code,
            "body": json.loads(json.dumps(body).replace(b.url, "{b}").replace(a.url, "{a}")),
            "statuses": statuses(port, names),
        }
        b.failing = False
        time.sleep(timeout_s + 1)
        found[f"{timeout_s + 1} s later, no request meanwhile: smg_worker_cb_state"] = gauge(
            metrics_port, "smg_worker_cb_state", names
        )
        after: list[dict[str, Any]] = []
        chat(port, 0, after)
        found["then a chat request"] = {
            "status": after[0]["status"],
            "served_by": after[0]["served_by"],
        }
        found["then smg_worker_cb_state"] = gauge(metrics_port, "smg_worker_cb_state", names)
    for rank in (a, b):
        rank.server.shutdown()
    return found


def capture(python: str, version: str) -> dict[str, Any]:
    a, b, c = Rank("a"), Rank("b"), Rank("c")
    names = {a.url: "a", b.url: "b", c.url: "c"}
    port = free_port()
    found: dict[str, Any] = {"smg": version, "launched_by": "operations/programs/router_launch.py"}
    with running_smg(python, [a.url, b.url], port, {}, with_key=True) as (lines, proc):
        wait_for(lambda: statuses(port, names) == {"a": "ready", "b": "ready"}, 60, "2 ready")
        listed = workers(port)
        found["get_workers"] = {
            "top_level_keys": sorted(http("GET", port, "/workers", key=KEY)[1]),
            "worker_keys": sorted(listed[a.url]),
            "statuses": statuses(port, names),
        }
        ida = listed[a.url]["id"]
        found["auth"] = {
            "GET /workers without a key": http("GET", port, "/workers")[0],
            "GET /workers with a wrong key": http("GET", port, "/workers", key="wrong")[0],
            "GET /workers with the key": http("GET", port, "/workers", key=KEY)[0],
            "DELETE /workers/{id} without a key": http("DELETE", port, f"/workers/{ida}")[0],
            "GET /health without a key": http("GET", port, "/health")[0],
        }
        dup_code, dup_body = http("POST", port, "/workers", {"url": a.url}, key=KEY)
        new_code, new_body = http("POST", port, "/workers", {"url": c.url}, key=KEY)
        took = wait_for(lambda: statuses(port, names).get("c") == "ready", 60, "c ready")
        patch_body = {"health": {"drain_settle_secs": 1}}
        idc = workers(port)[c.url]["id"]
        found["worker_api"] = {
            "POST /workers a listed url": {
                "status": dup_code,
                "body": json.loads(
                    json.dumps(dup_body).replace(a.url, "{url}").replace(ida, "{id}")
                ),
            },
            "POST /workers a new url": {"status": new_code, "body_keys": sorted(new_body or {})},
            "POST /workers: seconds until the new worker is ready": r1(took),
            "PATCH /workers/{id} health.drain_settle_secs": http(
                "PATCH", port, f"/workers/{idc}", patch_body, key=KEY
            )[0],
            "DELETE /workers/{unknown id}": http(
                "DELETE", port, "/workers/00000000-0000-0000-0000-000000000000", key=KEY
            )[0],
            "DELETE /workers/{id}": None,
        }
        # The per-worker drain (1 s after the PATCH), no requests in flight.
        start = time.monotonic()
        found["worker_api"]["DELETE /workers/{id}"] = http(
            "DELETE", port, f"/workers/{idc}", key=KEY
        )[0]
        wait_for(lambda: c.url not in workers(port), 30, "c removed")
        found["drain_after_patch_settle_1s"] = {"removed_after_s": r1(time.monotonic() - start)}
        found.update(capture_settle(port, c.url))

        # The default drain (5 s) with requests in flight on the drained worker.
        results: list[dict[str, Any]] = []
        threads = [threading.Thread(target=chat, args=(port, SLOW_S, results)) for _ in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: a.in_flight + b.in_flight == 4, 10, "4 requests in flight")
        in_flight_a = a.in_flight
        timeline: list[dict[str, Any]] = []
        start = time.monotonic()
        code = http("DELETE", port, f"/workers/{ida}", key=KEY)[0]
        during: list[dict[str, Any]] = []
        served_a_before = a.served + a.in_flight
        removed_s = None
        while time.monotonic() - start < 30:
            now = statuses(port, names)
            if not timeline or timeline[-1]["statuses"] != now:
                timeline.append({"at_s": r1(time.monotonic() - start), "statuses": now})
            if "a" not in now:
                removed_s = time.monotonic() - start
                break
            if now.get("a") == "draining" and len(during) < 4:
                chat(port, 0, during)
            time.sleep(0.1)
        in_flight_at_removal = a.in_flight
        for t in threads:
            t.join()
        found["drain_default_with_requests_in_flight"] = {
            "DELETE status": code,
            "requests in flight on the drained worker at the DELETE": in_flight_a,
            "status timeline": timeline,
            "removed_after_s": None if removed_s is None else r1(removed_s),
            "requests still in flight on the worker when smg removed it": in_flight_at_removal,
            "new requests sent while it drained, served by": sorted(
                str(r["served_by"]) for r in during
            ),
            "new requests that reached the draining worker": a.served
            + a.in_flight
            - served_a_before,
            "the in-flight requests' answers": sorted(
                f"{r['status']} from {r['served_by']}" for r in results
            ),
        }
        http("POST", port, "/workers", {"url": a.url}, key=KEY)
        back = wait_for(lambda: statuses(port, names).get("a") == "ready", 60, "a back")
        found["re_add_after_drain"] = {"POST then ready after_s": r1(back)}

        # Health: b stops answering /health, then answers again.
        b.healthy = False
        start = time.monotonic()
        seen: list[str] = []

        def record() -> str:
            status = statuses(port, names).get("b", "absent")
            if not seen or seen[-1] != status:
                seen.append(status)
            return status

        out_s = wait_for(lambda: record() == "not_ready", 30, "b not_ready")
        b.healthy = True
        start = time.monotonic()
        back_s = wait_for(lambda: record() == "ready", 30, "b ready again")
        found["health"] = {
            "flags": "--health-check-interval-secs 1 --health-failure-threshold 2 "
            "--health-success-threshold 1",
            "statuses seen": seen,
            "not_ready after_s": r1(out_s),
            "ready again after_s": r1(back_s),
        }
        found["security_posture_logged_with_the_key"] = posture(lines)
        found["stop"] = measure_stop(proc, port)

    # The Rust binary's CONTROL_PLANE_API_KEYS (model_gateway/src/main.rs): does the Python
    # launcher read it?
    port = free_port()
    env = {"CONTROL_PLANE_API_KEYS": f"id:name:admin:{KEY}"}
    with running_smg(python, [a.url], port, env, with_key=False) as (lines, _):
        found["env_CONTROL_PLANE_API_KEYS_without_the_option"] = {
            "GET /workers without a key": http("GET", port, "/workers")[0],
            "security_posture_logged": posture(lines),
        }
    for rank in (a, b, c):
        rank.server.shutdown()
    found["circuit_breaker_open"] = capture_breaker(python)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="1.13.0")
    parser.add_argument("--smg-python", help="an interpreter with smg installed (else pinned)")
    args = parser.parse_args(argv)
    python = smg_python(args.version, args.smg_python)
    found = capture(python, args.version)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    out = FIXTURES / f"behaviour-{args.version}.json"
    out.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")
    log(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
