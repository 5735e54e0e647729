"""Whether every replica is serving, per host and rank, in one screen (docs/status.md).

    python -m operations.status INVENTORY [--data KEY=VALUE ...] [--json] [--probe]

Loads the inventory as pyinfra does (operations/plan.py), reads one fact per host
(operations/facts/serve.py, the deploy's own serving fact: one SSH round trip whatever the
number of ranks; with it each rank's /health and its running and queued requests from /metrics)
and prints a table
per host, or one JSON document with --json. Exit status: 0 when every configured rank of every
host (and each host's router) is healthy, 1 when any is not or a host could not be read, 2 when
the command itself could not run (no such inventory, bad arguments).

--probe also sends each rank (and the router) one chat request as a client does, on the host,
with the deploy's smoke script (operations/facts/smoke.py: a second round trip per host), and
adds whether it answered, its latency and its tokens; a rank that does not answer is exit 1.
A rank whose port another user holds, or whose unit is not active (a stopped rank), is asked
nothing and the API key is not sent: its row names the port and the owner.
Without it, status sends no request and changes nothing.
"""

from operations.status.cli import main
from operations.status.read import read_hosts, run
from operations.status.rows import (
    EXIT_ERROR,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    HUB_MARKER,
    PROBE_TIMEOUT_S,
    HostResult,
    RankStatus,
    RouterStatus,
    describe_health,
    describe_unit,
    exit_status,
    fact_args,
    host_result,
    metrics_urls,
    probe_args,
    rank_rows,
    router_row,
    router_url,
    to_json,
    with_probe,
)
from operations.status.view import _duration, host_table, print_results

__all__ = [
    "EXIT_ERROR",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
    "HUB_MARKER",
    "PROBE_TIMEOUT_S",
    "HostResult",
    "RankStatus",
    "RouterStatus",
    "_duration",
    "describe_health",
    "describe_unit",
    "exit_status",
    "fact_args",
    "host_result",
    "host_table",
    "main",
    "metrics_urls",
    "print_results",
    "probe_args",
    "rank_rows",
    "read_hosts",
    "router_row",
    "router_url",
    "run",
    "to_json",
    "with_probe",
]
