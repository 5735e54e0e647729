"""A test double of the router's worker API (sglang-router 0.3.2, or smg 1.13.0), for the fast
tests of the drain script (tests/unit/test_drain.py): a small HTTP server of the standard
library. Every e2e test runs the real router instead.

What it copies, and from where:
- sglang-router 0.3.2 (`settle_s=None`): `GET/POST /workers`, `DELETE /workers/{id}` answer
  401 unless `Authorization: Bearer KEY` (src/auth/middleware.rs:214-361, src/server.rs:
  634-656; the POST and DELETE are queued jobs answered 202, src/core/worker_service.rs:
  225-259); `key=None`: the router as started before, with no key (the middleware lets
  everything through, src/middleware.rs:114-148). A DELETE removes the worker at once.
- smg 1.13.0 (`settle_s`: its default drain settle), as tests/fixtures/smg/behaviour-1.13.0.json
  recorded the real binary: each worker has a `status`; DELETE lists it `draining` at once and
  removes it after its settle ("drain_default_with_requests_in_flight": 5.1 s by default;
  "drain_after_patch_settle_1s", "drain_after_post_settle_1s": 1.0 s); POST of a URL it lists is
  409 WORKER_ALREADY_EXISTS ("worker_api"), a new one is listed ready, and a POST's
  health.drain_settle_secs is listed as its `health` ("drain_after_post_settle_1s"); PATCH
  {"health": {"drain_settle_secs": N}} is 202 and a queued job: GET /workers/{id} shows
  job_status "UpdateWorker processing" until it is done, then none, and the listing never shows
  a PATCH's health ("PATCH /workers/{id}: GET /workers/{id} while the update runs"); unknown
  ids are 404. The job replaces the worker with the status it read when the PATCH came
  (smg's update_worker_properties.rs, the knowledge base's smg-job-queue): a DELETE before
  it is done is undone, the worker listed ready again, as the real race would.
"""

from __future__ import annotations

import http.server
import json
import threading

# How long the double's update job runs (the real one: 0.01-0.1 s on an idle gateway).
UPDATE_S = 0.2


class ControlPlane:
    """The double, serving on 127.0.0.1 (`url`) until stop(); `workers` by id, `calls` as
    (method, path, Authorization, body) in order."""

    def __init__(self, key: str | None, settle_s: float | None = None) -> None:
        self.workers: dict[str, dict[str, object]] = {}
        self.calls: list[tuple[str, str, str | None]] = []
        self.bodies: list[tuple[str, str, object]] = []
        self.settles: dict[str, float] = {}  # smg: a worker's own settle (POST or PATCH)
        self.jobs: dict[str, str] = {}  # smg: a worker's update job, while it runs
        self.timers: list[threading.Timer] = []
        self.key, self.settle_s = key, settle_s
        plane = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                auth = self.headers.get("Authorization")
                plane.calls.append((self.command, self.path, auth))
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw.strip() else None
                plane.bodies.append((self.command, self.path, body))
                if key is not None and auth != f"Bearer {key}":
                    self._send(401, b"Invalid authentication token")
                    return
                code, answer = plane.answer(self.command, self.path, body)
                self._send(code, json.dumps(answer).encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, body: object) -> tuple[int, object]:
        """The router's answer to one authorised call."""
        smg = self.settle_s is not None
        if method == "GET" and path == "/workers":
            return 200, {"workers": [{"id": i, **w} for i, w in self.workers.items()]}
        if method == "POST":
            assert isinstance(body, dict)
            url = body["url"]
            if smg and url in [w["url"] for w in self.workers.values()]:
                return 409, {"code": "WORKER_ALREADY_EXISTS"}
            worker: dict[str, object] = {"url": url, "is_healthy": True}
            worker_id = f"id-{len(self.calls)}"
            if smg:
                worker["status"] = "ready"
                if "health" in body:
                    worker["health"] = body["health"]
                    self.settles[worker_id] = body["health"]["drain_settle_secs"]
            self.workers[worker_id] = worker
            return 202, {"worker_id": worker_id}
        worker_id = path.rsplit("/", 1)[1]
        if not smg:
            self.workers.pop(worker_id, None)
            return 202, {}
        if worker_id not in self.workers:
            return 404, {"code": "WORKER_NOT_FOUND"}
        if method == "GET":
            job = self.jobs.get(worker_id)
            status = {"job_status": {"job_type": job, "status": "processing"}} if job else {}
            return 200, {"id": worker_id, **self.workers[worker_id], **status}
        if method == "PATCH":
            assert isinstance(body, dict)
            read = self.workers[worker_id].get("status")
            self.jobs[worker_id] = "UpdateWorker"
            settle = body["health"]["drain_settle_secs"]
            self._later(UPDATE_S, self._replace, worker_id, settle, read)
            return 202, {"worker_id": worker_id}
        self.workers[worker_id]["status"] = "draining"
        self._later(self.settles.get(worker_id, self.settle_s), self.workers.pop, worker_id, None)
        return 202, {}

    def _replace(self, worker_id: str, settle: float, status: object) -> None:
        self.settles[worker_id] = settle
        if worker_id in self.workers:
            self.workers[worker_id]["status"] = status
        self.jobs.pop(worker_id, None)

    def _later(self, seconds: float | None, then: object, *args: object) -> None:
        assert seconds is not None and callable(then)
        timer = threading.Timer(seconds, then, args)
        self.timers.append(timer)
        timer.start()

    def stop(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
