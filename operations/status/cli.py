"""`python -m operations.status`: the command line (docs/status.md)."""

from __future__ import annotations

import json
import sys

from operations.status.read import run
from operations.status.rows import EXIT_ERROR, exit_status, to_json
from operations.status.view import print_results


def main(argv: list[str] | None = None) -> int:
    from operations.plan import inventory_arguments, parse_data

    parser = inventory_arguments("python -m operations.status", _doc())
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also send each rank and the router one chat request (answered, latency, tokens)",
    )
    args = parser.parse_args(argv)
    try:
        results = run(args.inventory, parse_data(args.data), args.probe)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(f"error: {exc.code}", file=sys.stderr)
            return EXIT_ERROR
        raise
    if args.json:
        json.dump(to_json(results), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_results(results)
    return exit_status(results)


def _doc() -> str | None:
    import operations.status

    return operations.status.__doc__
