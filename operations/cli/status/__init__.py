"""Whether every replica is serving, per host and rank, in one screen (docs/reference/status.md).

The command and its help: operations/cli/status/cli.py (`python -m operations.status --help`).
"""

from operations.cli.status.cli import main
from operations.cli.status.read import read_hosts, run
from operations.cli.status.rows import (
    EXIT_ERROR,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
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
from operations.cli.status.view import _duration, host_table, print_results

__all__ = [
    "EXIT_ERROR",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
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
