"""Whether every replica is serving, per host and rank, in one screen (docs/reference/status.md).

    python -m operations.status INVENTORY [--data KEY=VALUE ...] [--json] [--probe]

Loads the inventory as pyinfra does (operations/runtime/inventory.py), reads one fact per host
(operations/facts/serve_status.py: the deploy's own serving reading, one SSH round trip whatever
the number of ranks; with it each rank's /health and its running and queued requests from /metrics)
and prints a table per host, or one JSON document with --json. Exit status: 0 when every configured
rank of every host (and each host's router) is healthy, 1 when any is not or a host could not be
read, 2 when the command itself could not run (no such inventory, one that does not load or names
no host, bad arguments).

--probe also sends each rank (and the router) one chat request as a client does, on the host,
with the deploy's smoke script (operations/facts/smoke.py: a second round trip per host), and
adds whether it answered, its latency and its tokens; a rank that does not answer is exit 1.
A rank whose port another user holds, or whose unit is not active (a stopped rank), is asked
nothing and the API key is not sent: its row names the port and the owner.
Without it, status sends no request and changes nothing.
"""

from __future__ import annotations

import json
import sys

from operations import layout
from operations.cli.status.read import run
from operations.cli.status.rows import EXIT_ERROR, exit_status, to_json
from operations.cli.status.view import print_results


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import InventoryError, inventory_arguments, parse_data, said

    parser = inventory_arguments(layout.command("status"), __doc__)
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also send each rank and the router one chat request (answered, latency, tokens)",
    )
    args = parser.parse_args(argv)
    try:
        results = run(args.inventory, parse_data(args.data), args.probe)
    except InventoryError as exc:  # no such inventory, it does not load, no hosts: one line
        print(said(exc), file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        json.dump(to_json(results), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_results(results)
    return exit_status(results)
