"""What the deploy's smoke requests cost: a deploy that starts 8 ranks with `smoke_requests`
on against the same deploy with it off, in one testbed container (needs root, like the e2e
tests). Prints a table and the ratio of the medians; asserts nothing.

One container (8 x RTX PRO 6000 doubles) is brought to serving once with the real
`pyinfra -y INVENTORY deploy.py` (engine from the double wheels and the real OpenAI client on
loopback indexes, a tiny model, 8 ranks of the SGLang server double). Then, ROUNDS times, in an
order that alternates each round so noise hits both sides, every rank is stopped and the deploy
starts all 8 again (start, /health wait), with:
  smoke off   smoke_requests: false
  smoke on    smoke_requests: true (one chat request per started rank, sent on the host)
Goal (issue 13): on / off at most 1.10. Medians are compared. BENCH_ROUNDS (default 5).

The SGLang double loads in SGLANG_DOUBLE_LOAD_SECONDS (2 s); a real rank loads for minutes,
so against a real start the smoke's share is far smaller than here.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.deploying import (  # noqa: E402
    BENCH_MODEL_DIR,
    BENCH_RELEASE,
    Indexes,
    bench_hosts,
)
from tests.testbed import Container, inventory_file  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RELEASE, MODEL_DIR = BENCH_RELEASE, BENCH_MODEL_DIR
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY_TIMEOUT_S = 900
GOAL = 1.10


def pyinfra(inventory: Path) -> tuple[float, str]:
    """One deploy to the end: its wall time and output. Fails loudly when it fails."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(PYINFRA), "-y", str(inventory), str(ROOT / "deploy.py")],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEPLOY_TIMEOUT_S,
        check=False,
    )
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"deploy failed (rc {proc.returncode}):\n{output[-4000:]}")
    return elapsed, output


def host_data(container: Container, indexes: Indexes, smoke: bool) -> dict[str, Any]:
    return {
        **indexes.data(),
        "sglang_version": RELEASE,
        "model_source": MODEL_DIR,
        "dp_size": 8,
        "server_host": container.address,
        "health_timeout_s": 120,
        "ram_per_rank_gb": 0.25,
        "smoke_requests": smoke,
    }


def stop_ranks(c: Container) -> None:
    rc, _, err = c.ssh_run("systemctl stop 'sglang@*.service'")
    if rc != 0:
        raise RuntimeError(f"could not stop the ranks: {err}")


def main() -> int:
    if os.geteuid() != 0:
        print("smoke_bench: needs root (systemd-nspawn testbed); skipped")
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="smoke-bench-") as tmp,
        bench_hosts(Path(tmp), 1) as (indexes, (c,)),
    ):
        work = Path(tmp)
        inventories = {
            side: inventory_file(
                work, {c: host_data(c, indexes, side == "smoke on")}, filename=f"{i}.py"
            )
            for i, side in enumerate(("smoke off", "smoke on"))
        }
        first, _ = pyinfra(inventories["smoke on"])
        print(f"smoke_bench: brought to serving in {first:.1f} s", flush=True)

        runs: dict[str, list[float]] = {"smoke off": [], "smoke on": []}
        for number in range(ROUNDS):
            order = ["smoke off", "smoke on"]
            for side in order if number % 2 == 0 else order[::-1]:
                stop_ranks(c)
                seconds, output = pyinfra(inventories[side])
                asked = "Smoke | chat requests" in output
                if asked != (side == "smoke on"):
                    raise RuntimeError(f"{side}: the smoke requests were not as set")
                runs[side].append(seconds)

        medians = {side: statistics.median(times) for side, times in runs.items()}
        print(f"smoke_bench: deploy starting 8 ranks, median of {ROUNDS} rounds")
        print(f"  {'run':<10} {'median s':>9}   all rounds (s)")
        for side, value in medians.items():
            rounds = " ".join(f"{t:.2f}" for t in runs[side])
            print(f"  {side:<10} {value:9.2f}   {rounds}")
        ratio = medians["smoke on"] / medians["smoke off"]
        verdict = "met" if ratio <= GOAL else "NOT met"
        print(f"  smoke on / smoke off {ratio:5.3f}x  (goal <= {GOAL}x: {verdict})")
        return 0


if __name__ == "__main__":
    sys.exit(main())
