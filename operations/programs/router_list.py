#!/usr/bin/env python3
"""The router's worker list as a rank's host reads it, for the deploy's ServingState fact
(operations/facts/serve.py), run as one `python3 -c` argument: which of this host's ranks the
router lists, so a rank an interrupted run left out of the router is put back.

    router_list.py TIMEOUT LIST_URL KEY_FILE

LIST_URL: the router's worker list (a GET, the knowledge base's `list_workers` call). KEY_FILE:
the control-plane key (root only), sent as a bearer token when it exists, as router_workers.py
does; the key never reaches a command line. Prints "router_workers ok" and then
"worker URL STATE" per worker the router lists, or "router_workers error WHY". STATE: smg's
`status` (pending, ready, not_ready, failed, draining: smg 1.13.0's GET /workers, captured in
tests/fixtures/smg/behaviour-1.13.0.json), else sglang-router 0.3.2's is_healthy as
healthy|unhealthy. After a worker smg keeps out of routing while its status stands, "stalled
URL REASON" (smg's `stalled`: unreachable or wedged; crates/protocols/src/worker.rs:1015-1019
of the 1.13.0 sdist, absent while the worker is routable). The answer's shape is
{"workers": [{"url", "is_healthy", "status"?, "stalled"?}]} (router_workers.py `listed` reads
the same).
"""

from __future__ import annotations

import json
import sys
import urllib.request

ANSWER_LIMIT = 1 << 22  # bytes of the router's answer read

# The router is this deployment's own: no proxy may see or answer it.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read_key(path: str) -> str:
    """The control-plane key; "" when the file is absent or unreadable (none is sent)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def worker_lines(url: str, key: str, timeout: float) -> list[str]:
    """One "worker URL STATE" line per worker the router lists, and "stalled URL REASON" after
    a worker smg keeps out of routing."""
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", "Bearer " + key)
    with _DIRECT.open(request, timeout=timeout) as response:
        workers = json.loads(response.read(ANSWER_LIMIT)).get("workers", [])
    lines = []
    for worker in workers:
        where = str(worker["url"]).rstrip("/")
        lines.append(f"worker {where} {state(worker)}")
        stalled = str(worker.get("stalled") or "").strip()
        if stalled and " " not in stalled:
            lines.append(f"stalled {where} {stalled}")
    return lines


def state(worker: dict[str, object]) -> str:
    """smg's status, one word; sglang-router's is_healthy where there is none."""
    status = str(worker.get("status") or "").strip()
    if status and " " not in status:
        return status
    return "healthy" if worker.get("is_healthy") else "unhealthy"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: router_list.py TIMEOUT LIST_URL KEY_FILE")
        return 2
    timeout, url, key_file = argv
    try:
        lines = worker_lines(url, read_key(key_file), float(timeout))
    except Exception as error:  # any failure is the answer: the fact reports it, by its type
        print("router_workers error " + type(error).__name__)
    else:
        print("router_workers ok")
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
