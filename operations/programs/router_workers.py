#!/usr/bin/env python3
"""Take ranks out of sglang-router and wait until they drained, or put them back.

Shipped to each rank's host by operations/steps/serve.py and run there, around each restart the
serve step makes behind a router (operations/plan/drain.py decides it; the worker API's calls come
from the knowledge base's `routers` entry for the pinned release, as `METHOD /path`):

    router_workers.py --router URL --list 'GET /workers' --remove 'DELETE /workers/{id}' \\
        --add 'POST /workers' --key-file PATH [--router-metrics URL --breaker-timeout S] \\
        --timeout S out UNIT=WORKER_URL=METRICS_URL ...
    router_workers.py ... [--worker-key-file PATH --worker-key-field FIELD] --timeout S \\
        in UNIT=WORKER_URL ...

--key-file: the router's control-plane key (root only); each call sends it as
`Authorization: Bearer KEY` (sglang-router 0.3.2, src/auth/middleware.rs:214-361; smg 1.13.0
the same, 401 without it: tests/fixtures/smg/behaviour-1.13.0.json "auth"). A missing file
sends none (a router from before the key, started without one); a router that refuses the call
(401, 403) fails the step, naming the file, never the key.

--worker-key-file PATH --worker-key-field FIELD (smg, ranks with an API key): the ranks' key,
read here from SGLang's --config file (layout.SECRETS_FILE, api_key_file.py), goes in each
re-add's POST body as FIELD (`api_key`): smg calls a worker added without one unauthenticated,
and the rank answers 401 (the knowledge base's routers."1.13.0".worker_api_key). Each host's
drain sends its own ranks' key, which also carries a rotated key: a rank re-added after its
restart gets the key it now asks for.

--draining STATE (smg): the state the router lists a removed worker in while it settles
(`draining`: no new request reaches it; smg removes it after drain_settle_secs, 5 s, whether
or not requests are still in flight there: the knowledge base's routers."1.13.0".drain).

--settle S --update 'PATCH /workers/{id}' --applied 'GET /workers/{id}' (smg): the worker's
own drain_settle_secs, set to S before its removal ({"health": {"drain_settle_secs": S}}),
unless the router lists it with that settle already (the POST that added it carried it), and
carried by the re-add's POST. The update is a queued job (202) that replaces the worker: the
removal waits until --applied shows no job of the worker's pending or processing (smg's
`job_status`; a DELETE before then may drain on the old settle, or be overtaken by the replace,
which would list the worker routable again: tests/fixtures/smg/behaviour-1.13.0.json
"PATCH /workers/{id}: GET /workers/{id} while the update runs").

--router-metrics URL --breaker-timeout S (out; smg): the router's Prometheus server
(--prometheus-port, read as URL/metrics) and its --cb-timeout-duration-secs, for the peer
guard below.

Routable, for the guard, is what smg's placement takes: smg 1.13.0 draws a request's worker from
those whose `is_available()` holds: status Ready, no liveness veto (`stall_reason`), no overload
veto, and a circuit breaker that is not open (model_gateway/src/worker/worker.rs:2879-2887;
routers/common/placement.rs:250-262); with none, the client gets 503 "All workers are
unavailable (circuit breaker open or unhealthy)" (routers/http/router.rs:590-610). Only a pool
whose every worker is vetoed by overload or liveness falls back to one that is ready with its
breaker letting requests through (routers/common/overload.rs:94-146). What a client of smg can
read of it: GET /workers gives `status` and `is_healthy` (both the status Ready) and `stalled`
(the liveness veto's reason, absent when there is none), nothing of the breaker or the overload
veto (crates/protocols/src/worker.rs:976-1030, worker/worker.rs:3307-3330); the breaker's state
is only on the Prometheus listener, `smg_worker_cb_state{worker=URL}` (BREAKER_GAUGE). So a
peer counts when it is listed ready, not stalled, and its breaker is not open. The gauge moves
when the breaker does, and an open breaker moves to half_open (which takes requests) only when
smg next looks at it after its timeout (worker/circuit_breaker.rs:171-204): a breaker seen open
for --breaker-timeout seconds counts as half_open. The overload veto is left out: without
--worker-overload-shed (the deploy sets none) an all-overloaded pool still places a request.
Without the gauge (no --router-metrics, a page that cannot be read, sglang-router 0.3.2) the
guard says so and takes the listing's `ready` alone.

out: once another worker is routable (PEER_WAIT_S at most: a router that marked the others
     unhealthy, or opened their breakers, a moment ago, as after a saturating check, has them
     back; after that the drain goes on, naming each peer and why it is not routable), each
     worker the router lists is removed (DELETE; the router sends it nothing new; what it
     already sent finishes); a worker is out once the router no longer lists it or lists it
     --draining. Then each rank's own /metrics is read (rank_metrics.py) until
     sglang:num_running_reqs plus sglang:num_queue_reqs is 0, for at most --timeout seconds
     (after that the restart goes on, and says how many requests it cuts): smg's drain is a
     timer, the rank's gauges say when its requests are done. A router that does not answer is
     reported: nothing can be drained through it, and no client reaches the ranks through it
     either.
in:  each worker the router does not list is added; one it still lists draining is waited for
     until it has left the list, then added (smg refuses a POST of a listed URL with 409,
     WORKER_ALREADY_EXISTS: a 409 is waited out the same way). The router must list it healthy
     (smg: status `ready`) within --timeout seconds; otherwise the rank stays out and this
     fails (exit 1).
Prints one line per rank: `drained UNIT in S s (N finished)` / `readmitted UNIT in S s`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any, TypedDict

from operations.programs.api_key_file import read_api_key
from operations.programs.polling import backoff
from operations.programs.rank_metrics import requests_in_flight, series

# Polls back off (programs/polling.py): a removal the router makes at once, a rank whose last
# request ends in a few ms, a worker listed healthy soon after it is added: each seen within
# milliseconds; what takes longer is asked every MAX_POLL_S.
FIRST_POLL_S = 0.01
POLL_GROWTH = 1.5
MAX_POLL_S = 0.25
REQUEST_TIMEOUT_S = 10
# The router answers a removal with 202 and a queued job; its removal job gives up after 30 s
# (sglang-router 0.3.2, src/core/job_queue.rs: RemoveWorker's timeout_duration).
REMOVAL_TIMEOUT_S = 40
# How long a drain waits for another worker to be routable before it takes its own out: a
# router that marked the others unhealthy a moment ago (a saturating throughput check or
# canary comparison, a rank's restart) has them back after its health checks pass again
# (router.health_check_interval_s x health_success_threshold: 10 s at the deploy's settings).
PEER_WAIT_S = 30
# smg's circuit breaker state per worker on its Prometheus listener (--prometheus-port): a gauge
# labelled `worker` with the worker's URL, 0 closed, 1 open, 2 half_open (smg 1.13.0,
# model_gateway/src/observability/metrics.rs:2559-2566, worker/builder.rs:382-385,
# worker/circuit_breaker.rs:35-38 and 62-76; tests/fixtures/smg/behaviour-1.13.0.json
# "circuit_breaker_open"). GET /workers does not carry it (crates/protocols/src/worker.rs:976-1030).
BREAKER_GAUGE = "smg_worker_cb_state"
BREAKER_OPEN = 1.0

# The router and the ranks are this deployment's own: no proxy may see or answer them.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class RouterError(Exception):
    """A call that failed; `status`: the router's HTTP status, when it answered one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RouterRefused(RouterError):
    """The router answered, and refused the control-plane key (or its absence)."""


# The control-plane key, read once from --key-file (None: the file is absent).
KEY: str | None = None
# (FIELD, the ranks' API key) for each re-add's body, read once from --worker-key-file; None:
# no key to send (none configured, or a router that takes none).
WORKER_KEY: tuple[str, str] | None = None


def read_key(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RouterError(f"control-plane key {path}: {error.strerror}") from None
    return key or None


def worker_key(path: str, field: str) -> tuple[str, str] | None:
    """(field, the ranks' key) from `path` (SGLang's --config file); None without a path, a
    field or a key. An unreadable file fails the step, naming the file, never the key."""
    if not path or not field:
        return None
    try:
        key = read_api_key(path)
    except OSError as error:
        raise RouterError(f"the ranks' API key file {path}: {error.strerror}") from None
    return (field, key) if key is not None else None


def call(base: str, spec: str, body: Any = None, **ids: str) -> Any:
    """One worker API call, `METHOD /path` with {id} filled in; the decoded JSON answer."""
    method, _, path = spec.partition(" ")
    url = base.rstrip("/") + path.format(**ids)
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if KEY is not None:
        request.add_header("Authorization", f"Bearer {KEY}")
    try:
        with _DIRECT.open(request, timeout=REQUEST_TIMEOUT_S) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        if error.code in (401, 403):
            sent = "the key in --key-file" if KEY is not None else "no key (--key-file absent)"
            raise RouterRefused(
                f"{method} {url}: {error.code} {detail.strip()}: the router refused {sent}; "
                "its control-plane key and this host's must be the same "
                "(router.control_plane_key_file, docs/how-it-works/security.md)"
            ) from error
        raise RouterError(f"{method} {url}: {error.code} {detail}", error.code) from error
    except (urllib.error.URLError, OSError) as error:
        raise RouterError(f"{method} {url}: {error}") from error
    return json.loads(raw) if raw.strip() else None


class Health(TypedDict, total=False):
    """smg: a worker's own health settings as its POST gave them (not its PATCHes)."""

    drain_settle_secs: int


class Job(TypedDict, total=False):
    """smg: the worker's control-plane job (GET /workers/{id}), absent once it succeeded."""

    job_type: str
    status: str  # pending, processing, failed


class Worker(TypedDict, total=False):
    """One of the router's workers as its list answers it ({"workers": [...]}): the keys read
    here, as the real routers answer them (sglang-router 0.3.2: the e2e crash test reads its
    list, tests/e2e/test_crash.py; smg 1.13.0 adds `status`: the capture's "get_workers").
    Decoded JSON, not checked: the router's own answer."""

    id: str  # what a removal names (the remove call's {id})
    url: str
    is_healthy: bool
    status: str  # smg: pending, ready, not_ready, failed, draining
    stalled: str  # smg: its liveness veto (unreachable, wedged), if any
    health: Health  # smg
    job_status: Job  # smg, GET /workers/{id} only


def draining(worker: Worker | None, state: str) -> bool:
    return worker is not None and bool(state) and worker.get("status") == state


def ready(worker: Worker | None) -> bool:
    """Listed healthy; with smg, in status `ready` (the only one it routes to)."""
    if worker is None or not worker.get("is_healthy"):
        return False
    return worker.get("status", "ready") == "ready"


def listed(args: argparse.Namespace) -> dict[str, Worker]:
    """The router's workers by URL."""
    answer = call(args.router, args.list)
    return {w["url"].rstrip("/"): w for w in answer.get("workers", [])}


def in_flight(metrics_url: str) -> float | None:
    """Running plus queued requests from the rank's /metrics (rank_metrics.py); None
    when it cannot be read."""
    try:
        with _DIRECT.open(metrics_url, timeout=REQUEST_TIMEOUT_S) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return requests_in_flight(text)


def breaker_states(text: str) -> dict[str, float] | None:
    """Each worker's circuit breaker state by URL on smg's /metrics page (BREAKER_GAUGE: 0
    closed, 1 open, 2 half_open); None when the page has no sample of it (a router that does
    not export it, as sglang-router 0.3.2 names none such)."""
    found = {
        labels["worker"].rstrip("/"): value
        for name, labels, value in series(text)
        if name == BREAKER_GAUGE and "worker" in labels
    }
    return found or None


def unplaceable(
    worker: Worker | None, open_for: float | None, breaker_timeout_s: float | None
) -> str | None:
    """Why smg would not place a request on this worker, or None when it would (smg 1.13.0's
    Worker::is_available, model_gateway/src/worker/worker.rs:2879-2887: status Ready, no
    liveness veto, circuit breaker not open; the module docstring). `open_for`: how long its
    breaker has been seen open (None: not seen open, or its state unknown); one open for
    at least `breaker_timeout_s` (the router's --cb-timeout-duration-secs) counts as half_open,
    which lets requests through: smg moves it there on its next look
    (worker/circuit_breaker.rs:171-204), and its gauge only then."""
    if not ready(worker):
        status = worker.get("status", "unhealthy") if worker is not None else "absent"
        return f"listed {status}"
    assert worker is not None
    if worker.get("stalled"):
        return f"stalled ({worker['stalled']})"
    if open_for is not None and (breaker_timeout_s is None or open_for < breaker_timeout_s):
        return "circuit breaker open"
    return None


def router_breakers(args: argparse.Namespace) -> dict[str, float] | None:
    """The router's breaker states (breaker_states) from --router-metrics; None without the
    argument, or when the page cannot be read or has none."""
    if not args.router_metrics:
        return None
    url = args.router_metrics.rstrip("/") + "/metrics"
    try:
        with _DIRECT.open(url, timeout=REQUEST_TIMEOUT_S) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return breaker_states(text)


def peer_routable(
    args: argparse.Namespace, targets: list[tuple[str, str, str]], workers: dict[str, Worker]
) -> dict[str, Worker]:
    """The router's list once a worker that is not leaving is one smg would place a request
    on (`unplaceable` is None: listed ready, not stalled, its circuit breaker not open, read
    from --router-metrics), or after PEER_WAIT_S, said: taking out the last placeable worker
    turns every client away (smg: 503 "All workers are unavailable") until the others are
    back. Without the breaker's state (no --router-metrics, a page that cannot be read or has
    no BREAKER_GAUGE) a worker listed ready and not stalled counts, said once. A router that
    lists no other worker is not waited for."""
    leaving = {url for _, url, _ in targets}
    deadline = time.monotonic() + PEER_WAIT_S
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    open_since: dict[str, float] = {}
    said = False
    while True:
        others = {url: w for url, w in workers.items() if url not in leaving}
        if not others:
            return workers
        breakers = router_breakers(args)
        now = time.monotonic()
        if breakers is None and not said:
            where = args.router_metrics or "no --router-metrics"
            print(
                f"the router's circuit breakers are unknown ({where}: no {BREAKER_GAUGE}): "
                "another worker counts as routable when the router lists it ready",
                flush=True,
            )
            said = True
        for url in others:
            if breakers is not None and breakers.get(url) == BREAKER_OPEN:
                open_since.setdefault(url, now)
            else:
                open_since.pop(url, None)
        why = {
            url: unplaceable(
                w, now - open_since[url] if url in open_since else None, args.breaker_timeout
            )
            for url, w in others.items()
        }
        if any(reason is None for reason in why.values()):
            return workers
        if now >= deadline:
            reasons = ", ".join(f"{url} {reason}" for url, reason in why.items())
            print(
                f"no other worker is routable after {PEER_WAIT_S} s ({reasons}): draining anyway",
                flush=True,
            )
            return workers
        time.sleep(next(sleeps))  # polling the router's list, not synchronisation
        workers = listed(args)


def take_out(args: argparse.Namespace, targets: list[tuple[str, str, str]]) -> int:
    start = time.monotonic()
    try:
        workers = listed(args)
    except RouterRefused:
        raise
    except RouterError as error:
        print(f"router does not answer ({error}): the ranks restart undrained", flush=True)
        return 0
    workers = peer_routable(args, targets, workers)
    leaving: list[Worker] = []
    for unit, url, _ in targets:
        worker = workers.get(url)
        if worker is None:
            print(f"{unit}: {url} is not in the router", flush=True)
        elif not draining(worker, args.draining):  # else an earlier run's removal, settling
            leaving.append(worker)
    if args.settle is not None:
        set_settle(args, leaving)
    for worker in leaving:
        try:
            call(args.router, args.remove, id=worker["id"])
        except RouterRefused:
            raise
        except RouterError as error:
            if error.status != 404:  # else gone between the list and the removal
                raise
    deadline = time.monotonic() + REMOVAL_TIMEOUT_S
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)

    def still_routed() -> list[str]:
        return [
            unit
            for unit, url, _ in targets
            if url in workers and not draining(workers[url], args.draining)
        ]

    while still_routed():
        if time.monotonic() > deadline:
            left = still_routed()
            print(f"the router still routes to {', '.join(left)} after {REMOVAL_TIMEOUT_S}s")
            return 1
        time.sleep(next(sleeps))  # polling the router's list, with a deadline
        workers = listed(args)
    removed = time.monotonic()
    deadline = removed + args.timeout
    pending = {unit: metrics for unit, _, metrics in targets}
    first = {unit: in_flight(metrics) for unit, metrics in pending.items()}
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    while pending:
        for unit, metrics in list(pending.items()):
            now = in_flight(metrics)
            if now is None:
                print(f"{unit}: no request gauges on {metrics}: in-flight requests unknown")
                del pending[unit]
            elif now == 0:
                began = first[unit] or 0
                print(
                    f"drained {unit} in {time.monotonic() - start:.2f} s ({began:.0f} finished)",
                    flush=True,
                )
                del pending[unit]
        if not pending:
            break
        if time.monotonic() > deadline:
            for unit, metrics in pending.items():
                print(
                    f"{unit}: {in_flight(metrics)} requests still running after "
                    f"{args.timeout:.0f}s (drain_timeout_s): restarting anyway",
                    flush=True,
                )
            break
        time.sleep(next(sleeps))  # polling the ranks' gauges, with a deadline
    return 0


def set_settle(args: argparse.Namespace, leaving: list[Worker]) -> None:
    """Each worker's drain settle set to --settle (smg), and each update done, before any
    removal; a worker gone meanwhile (404) needs none."""
    updating: list[Worker] = []
    for worker in leaving:
        if worker.get("health", {}).get("drain_settle_secs") == args.settle:
            continue  # its POST carried it
        body = {"health": {"drain_settle_secs": args.settle}}
        try:
            call(args.router, args.update, body=body, id=worker["id"])
        except RouterRefused:
            raise
        except RouterError as error:
            if error.status != 404:
                raise
            continue
        updating.append(worker)
    deadline = time.monotonic() + REMOVAL_TIMEOUT_S
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    while updating := [w for w in updating if _updating(args, w)]:
        if time.monotonic() > deadline:
            urls = ", ".join(w["url"] for w in updating)
            raise RouterError(
                f"the router's update of {urls} is not done after {REMOVAL_TIMEOUT_S}s: "
                "nothing is removed"
            )
        time.sleep(next(sleeps))  # polling the router's job, with a deadline


def _updating(args: argparse.Namespace, worker: Worker) -> bool:
    """Whether the router still has a job of this worker's pending or processing; one that
    failed is done (the removal drains on whichever settle the worker has)."""
    try:
        answer: Worker = call(args.router, args.applied, id=worker["id"])
    except RouterRefused:
        raise
    except RouterError as error:
        if error.status == 404:
            return False
        raise
    job = answer.get("job_status")
    if job is not None and job.get("status") == "failed":
        print(f"{worker['url']}: the router's {job.get('job_type')} failed: default settle")
    return job is not None and job.get("status") in ("pending", "processing")


def put_back(args: argparse.Namespace, targets: list[tuple[str, str]]) -> int:
    start = time.monotonic()
    try:
        workers = listed(args)
    except RouterRefused:
        raise
    except RouterError as error:
        # A router that starts later reads every rank from its --worker-urls.
        print(f"router does not answer ({error}): nothing to put back into", flush=True)
        return 0
    deadline = start + args.timeout
    # Added (or listed, not draining) ranks; the others wait until the router lets them go.
    to_add = {unit: url for unit, url in targets if not _listed_routable(workers, url, args)}
    pending = dict(targets)
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    while pending:
        for unit, url in list(to_add.items()):
            if url in workers:
                continue  # still listed draining: POST would be refused (409)
            if _add(args, url):
                del to_add[unit]
        workers = listed(args)
        for unit, url in list(pending.items()):
            if unit not in to_add and ready(workers.get(url)):
                print(f"readmitted {unit} in {time.monotonic() - start:.2f} s", flush=True)
                del pending[unit]
        if not pending:
            break
        if time.monotonic() > deadline:
            print(
                f"the router does not list {', '.join(pending)} healthy after "
                f"{args.timeout:.0f}s: it stays out of the router",
                flush=True,
            )
            return 1
        time.sleep(next(sleeps))  # polling the router's list, with a deadline
    return 0


def _listed_routable(workers: dict[str, Worker], url: str, args: argparse.Namespace) -> bool:
    return url in workers and not draining(workers[url], args.draining)


def _add(args: argparse.Namespace, url: str) -> bool:
    """POST the worker; False when the router still has it (409: smg lists it until its drain
    settles), to try again once it has left the list."""
    body: dict[str, object] = {"url": url}
    if args.settle is not None:  # its next drain settles as this one did (smg)
        body["health"] = {"drain_settle_secs": args.settle}
    if WORKER_KEY is not None:  # the key the router sends the rank (smg)
        field, key = WORKER_KEY
        body[field] = key
    try:
        call(args.router, args.add, body=body)
    except RouterRefused:
        raise
    except RouterError as error:
        if error.status == 409:
            return False
        raise
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", required=True)
    parser.add_argument("--list", required=True)
    parser.add_argument("--remove", required=True)
    parser.add_argument("--add", required=True)
    parser.add_argument("--key-file", default="")
    parser.add_argument("--worker-key-file", default="")
    parser.add_argument("--worker-key-field", default="")
    parser.add_argument("--draining", default="")
    parser.add_argument("--settle", type=int)
    parser.add_argument("--update", default="")
    parser.add_argument("--applied", default="")
    parser.add_argument("--router-metrics", default="")
    parser.add_argument("--breaker-timeout", type=float)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("action", choices=("out", "in"))
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args()
    global KEY, WORKER_KEY
    try:
        KEY = read_key(args.key_file) if args.key_file else None
        WORKER_KEY = worker_key(args.worker_key_file, args.worker_key_field)
        if args.action == "out":
            out = [tuple(t.split("=", 2)) for t in args.targets]
            return take_out(args, [(u, w.rstrip("/"), m) for u, w, m in out])
        back = [tuple(t.split("=", 1)) for t in args.targets]
        return put_back(args, [(u, w.rstrip("/")) for u, w in back])
    except RouterError as error:
        print(f"router: {error}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
