"""Measure how fast each host serves, now: each rank's capacity, with the toolkit's load client.

    python -m operations.bench INVENTORY [--data KEY=VALUE ...]

Runs the deploy's throughput step alone on every host of the inventory (the deploy file
operations/bench_deploy.py, through pyinfra as the deploy runs: `throughput_check` is `always`
here), under the deploy lock: a host another deploy holds is refused at once
(deploy_lock_wait_s 0), never measured mid-change. Each
host runs SGLang's client from its serving engine (docs/how-to/read-throughput-and-verdicts.md
"Throughput"), keeps the
record and compares it with the last one of the same workload; a slower run exits 1 as a deploy
does (throughput_guard: warn passes). Exit status: pyinfra's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from operations import layout

ROOT = Path(__file__).resolve().parents[2]


def pyinfra_words(inventory: str, data: list[str]) -> list[str]:
    """The pyinfra command line: the user's --data first, the bench's own last (they win)."""
    words = [
        str(Path(sys.executable).parent / "pyinfra"),
        "-y",
        inventory,
        str(ROOT / "operations" / "bench_deploy.py"),
    ]
    for item in data:
        words += ["--data", item]
    return [*words, "--data", "throughput_check=always", "--data", "deploy_lock_wait_s=0"]


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import inventory_arguments

    parser = inventory_arguments(layout.command("bench"), __doc__)
    args = parser.parse_args(argv)
    if args.json:
        print(
            "bench: --json is not supported (the records are JSON: status --json)", file=sys.stderr
        )
        return 2
    return subprocess.run(
        pyinfra_words(args.inventory, args.data), cwd=ROOT, check=False
    ).returncode
