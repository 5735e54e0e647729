"""Find a host's best throughput settings, one rank at a time while the others serve.

    python -m operations.tune INVENTORY [--dry] [--fresh] [--budget-min N] [--max-ttft-ms MS]
        [--max-itl-ms MS] [--data KEY=VALUE ...]

On every host of the inventory (through pyinfra, the deploy file operations/tune_deploy.py,
under the deploy lock: a host another deploy holds is refused at once): one rank leaves the
router, is measured with its current settings (the baseline, its spread the noise) and with
each candidate (knowledge/throughput.yaml `tune`), and goes back on its own unit and into the
router. Prints a table, the best (within the latency bounds, where given) and the group_data
lines to apply; keeps it on the host (/var/lib/sglang-deploy/tune.jsonl). It changes no
setting: applying is a deploy. A tune that was cut off (killed, a lost connection) is resumed
by the next: the candidates it measured are kept, the rest measured; --fresh starts over.
--dry shows the rank, the candidates and the estimated time,
and runs nothing. docs/how-to/tune.md says more.
Exit status: pyinfra's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from operations import layout

ROOT = Path(__file__).resolve().parents[2]


def pyinfra_words(inventory: str, data: list[str], dry: bool) -> list[str]:
    """The pyinfra command line: the user's --data first, the tune's own last (they win)."""
    words = [
        str(Path(sys.executable).parent / "pyinfra"),
        "-y",
        inventory,
        str(ROOT / "operations" / "tune_deploy.py"),
    ]
    words += ["--dry"] if dry else []
    for item in data:
        words += ["--data", item]
    return [*words, "--data", "deploy_lock_wait_s=0"]


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import inventory_arguments

    parser = inventory_arguments(layout.command("tune"), __doc__)
    parser.add_argument("--dry", action="store_true", help="show the candidates and the time")
    parser.add_argument(
        "--fresh", action="store_true", help="measure every candidate again (no resume)"
    )
    parser.add_argument(
        "--budget-min",
        type=int,
        default=None,
        help="the whole tune's time budget in minutes (default: 180)",
    )
    for name, what in (("--max-ttft-ms", "time to first token"), ("--max-itl-ms", "inter-token")):
        parser.add_argument(
            name,
            type=float,
            default=None,
            help=f"the most {what} latency p50 (ms) the best may have",
        )
    args = parser.parse_args(argv)
    if args.json:
        print(
            "tune: --json is not supported (the results are JSON lines on the host)",
            file=sys.stderr,
        )
        return 2
    if args.budget_min is not None and args.budget_min <= 0:
        print(
            f"tune: --budget-min {args.budget_min}: accepted: whole minutes above 0",
            file=sys.stderr,
        )
        return 2
    for flag, value in (("--max-ttft-ms", args.max_ttft_ms), ("--max-itl-ms", args.max_itl_ms)):
        if value is not None and not value > 0:
            print(f"tune: {flag} {value:g}: accepted: milliseconds above 0", file=sys.stderr)
            return 2
    env = dict(os.environ)
    env.pop("SGLANG_TUNE_FRESH", None)
    if args.fresh:
        env["SGLANG_TUNE_FRESH"] = "1"
    if args.budget_min is not None:
        env["SGLANG_TUNE_BUDGET_S"] = str(args.budget_min * 60)
    for key, value in (("TTFT", args.max_ttft_ms), ("ITL", args.max_itl_ms)):
        if value is not None:
            env[f"SGLANG_TUNE_MAX_{key}_MS"] = f"{value:g}"
    words = pyinfra_words(args.inventory, args.data, args.dry)
    return subprocess.run(words, cwd=ROOT, env=env, check=False).returncode
