#!/usr/bin/env python3
"""Take ranks out of sglang-router and wait until they drained, or put them back.

Shipped to each rank's host by operations/steps/serve.py and run there, around each restart the
serve step makes behind a router (operations/plan/drain.py decides it; the worker API's calls come
from the knowledge base's `routers` entry for the pinned release, as `METHOD /path`):

    router_workers.py --router URL --list 'GET /workers' --remove 'DELETE /workers/{id}' \\
        --add 'POST /workers' --key-file PATH --timeout S out UNIT=WORKER_URL=METRICS_URL ...
    router_workers.py ... --timeout S in UNIT=WORKER_URL ...

--key-file: the router's control-plane key (root only); each call sends it as
`Authorization: Bearer KEY` (sglang-router 0.3.2, src/auth/middleware.rs:214-361). A missing
file sends none (a router from before the key, started without one); a router that refuses
the call (401, 403) fails the step, naming the file, never the key.

out: each worker the router lists is removed (the router sends it nothing new; what it already
     sent finishes), then each rank's own /metrics is read until sglang:num_running_reqs plus
     sglang:num_queue_reqs is 0, for at most --timeout seconds (after that the restart goes on,
     and says how many requests it cuts). A router that does not answer is reported: nothing
     can be drained through it, and no client reaches the ranks through it either.
in:  each worker the router does not list is added, and the router must list it healthy within
     --timeout seconds; otherwise the rank stays out and this fails (exit 1).
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

from operations.programs.polling import backoff
from operations.programs.rank_metrics import requests_in_flight

# Polls back off (files/polling.py): a removal the router makes at once, a rank whose last
# request ends in a few ms, a worker listed healthy soon after it is added: each seen within
# milliseconds; what takes longer is asked every MAX_POLL_S.
FIRST_POLL_S = 0.01
POLL_GROWTH = 1.5
MAX_POLL_S = 0.25
REQUEST_TIMEOUT_S = 10
# The router answers a removal with 202 and a queued job; its removal job gives up after 30 s
# (sglang-router 0.3.2, src/core/job_queue.rs: RemoveWorker's timeout_duration).
REMOVAL_TIMEOUT_S = 40

# The router and the ranks are this deployment's own: no proxy may see or answer them.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class RouterError(Exception):
    pass


class RouterRefused(RouterError):
    """The router answered, and refused the control-plane key (or its absence)."""


# The control-plane key, read once from --key-file (None: the file is absent).
KEY: str | None = None


def read_key(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RouterError(f"control-plane key {path}: {error.strerror}") from None
    return key or None


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
                "(router.control_plane_key_file, docs/security.md)"
            ) from error
        raise RouterError(f"{method} {url}: {error.code} {detail}") from error
    except (urllib.error.URLError, OSError) as error:
        raise RouterError(f"{method} {url}: {error}") from error
    return json.loads(raw) if raw.strip() else None


class Worker(TypedDict, total=False):
    """One of the router's workers as its list answers it ({"workers": [...]}): the keys read
    here, as the real sglang-router answers them (the e2e roll and crash tests read its list,
    tests/e2e/test_crash.py). Decoded JSON, not checked: the router's own answer."""

    id: str  # what a removal names (the remove call's {id})
    url: str
    is_healthy: bool


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


def take_out(args: argparse.Namespace, targets: list[tuple[str, str, str]]) -> int:
    start = time.monotonic()
    try:
        workers = listed(args)
    except RouterRefused:
        raise
    except RouterError as error:
        print(f"router does not answer ({error}): the ranks restart undrained", flush=True)
        return 0
    for unit, url, _ in targets:
        worker = workers.get(url)
        if worker is None:
            print(f"{unit}: {url} is not in the router", flush=True)
            continue
        call(args.router, args.remove, id=worker["id"])
    deadline = time.monotonic() + REMOVAL_TIMEOUT_S
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    while any(url in workers for _, url, _ in targets):
        if time.monotonic() > deadline:
            left = [unit for unit, url, _ in targets if url in workers]
            print(f"the router still lists {', '.join(left)} after {REMOVAL_TIMEOUT_S}s")
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
    for _, url in targets:
        if url not in workers:
            call(args.router, args.add, body={"url": url})
    deadline = start + args.timeout
    pending = dict(targets)
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    while pending:
        workers = listed(args)
        for unit, url in list(pending.items()):
            if workers.get(url, {}).get("is_healthy"):
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", required=True)
    parser.add_argument("--list", required=True)
    parser.add_argument("--remove", required=True)
    parser.add_argument("--add", required=True)
    parser.add_argument("--key-file", default="")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("action", choices=("out", "in"))
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args()
    global KEY
    try:
        KEY = read_key(args.key_file) if args.key_file else None
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
