"""A roll of 8 ranks under load against the same ranks' bare restarts, in one testbed container
behind the real sglang-router (needs root, like the e2e tests). Prints a table; asserts nothing.

One container (8 x RTX PRO 6000 doubles) is brought to serving with the real
`pyinfra -y INVENTORY deploy.py` behind sglang-router (its pinned wheels, as
tests/e2e/test_roll_under_load.py has them); each rank's chat request takes GENERATE_S and its
load LOAD_S (a runtime drop-in the double reads). Then, ROUNDS times, paired (A B, then B A),
both sides under CLIENTS clients sending chat requests through the router (tests/e2e/load.py):
  roll   the deploy after a setting change (mem_fraction_static, which every rank's unit
         names): each batch of restart_batch_size (1) ranks drained out of the router,
         restarted, health-gated, asked a chat request and put back, as a user's deploy does
  bare   the same ranks' bare restarts in the same batches: one host command that, batch by
         batch, runs `systemctl restart` and polls the batch's /health until 200 (no drain, no
         smoke, no router calls, no SSH round trip between batches): the floor
Goal (issue 31): roll / bare at most 1.2x (median of the per-round ratios), 0 failed requests
during the rolls (the bare restarts' failures are shown: they are what a drain saves).

Where the roll's time goes comes from the roll's own lines (pyinfra -vvv): per batch, the host
command's phases (drain, restart, health wait, smoke, readmit) and the SSH round trips (the
commands pyinfra ran for that batch); the rest is pyinfra's own (start, facts, the converged
steps), shown beside a converged deploy's time measured in each round. The bare side prints
each batch's restart and health seconds (a line after each batch; its work is the same), so
the two restarts and the two health waits are shown side by side.

BENCH_ROUNDS (default 5) sets the rounds. BENCH_KEEP=1 keeps each roll's output in a
temporary file (its path printed).
"""

from __future__ import annotations

import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.benching import (  # noqa: E402
    bench_main,
    host_data,
    pair_ratio,
    paired,
    pyinfra,
    router_wheels,
    slow_ranks,
    spread,
)
from tests.e2e.deploying import Indexes  # noqa: E402
from tests.e2e.index import wait_for  # noqa: E402
from tests.e2e.load import CLIENTS, Load  # noqa: E402
from tests.e2e.serving import ROUTER_PORT, http  # noqa: E402
from tests.testbed import Container, inventory_file  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
KEEP = os.environ.get("BENCH_KEEP", "") not in ("", "0")
GENERATE_S, LOAD_S = 0.3, 3
RANKS, BATCH = 8, 1
BASE_PORT = 30000
GOAL = 1.2

# The bare side, run on the host as one command: each batch restarted, then its /health polled
# every 10 ms until 200 (a tighter poll than any deploy makes: the floor).
BARE = """\
import subprocess, sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def up(url):
    try:
        with opener.open(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
for batch in sys.argv[1:]:
    units = [u.split("=", 1) for u in batch.split(",")]
    began = time.monotonic()
    subprocess.run(["systemctl", "restart", *[u for u, _ in units]], check=True)
    restarted = time.monotonic()
    deadline = restarted + 120
    for _, url in units:
        while not up(url):
            if time.monotonic() > deadline:
                sys.exit(f"{url}: no 200 within 120 s")
            time.sleep(0.01)
    done = time.monotonic()
    print(f"bare batch: restart {restarted - began:.3f} s, health {done - restarted:.3f} s")
"""
_BARE = re.compile(r"^bare batch: restart ([0-9.]+) s, health ([0-9.]+) s$", re.M)

# The roll's own lines (operations/programs/roll_batch.py, shown by -vvv).
_PHASES = re.compile(r"roll batch (?P<units>\S+): (?P<phases>(?:\w+ [0-9.]+ s,? ?)+)")
_PHASE = re.compile(r"(\w+) ([0-9.]+) s")
_STARTING = re.compile(r"^--> Starting operation: Serve \| (?P<op>.+?)\s*$", re.M)
_BATCH_OP = re.compile(r"^restart batch (\d+)")
_COMMAND = re.compile(r"^\s*\[[^\]]+\] >>> ", re.M)


@dataclass
class Breakdown:
    """Where one roll's seconds went, from its -vvv output."""

    phases: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    commands: int = 0  # SSH commands pyinfra ran for the batches' operations


def breakdown(output: str) -> Breakdown:
    found = Breakdown()
    for match in _PHASES.finditer(output):
        for name, seconds in _PHASE.findall(match.group("phases")):
            found.phases[name] = found.phases.get(name, 0.0) + float(seconds)
    # The output of each operation runs from its "Starting operation" line to the next.
    starts = list(_STARTING.finditer(output))
    numbers = set()
    for here, after in zip(starts, [*starts[1:], None], strict=True):
        if batch := _BATCH_OP.match(here.group("op")):
            numbers.add(batch.group(1))
            end = after.start() if after is not None else len(output)
            found.commands += len(_COMMAND.findall(output, here.end(), end))
    found.batches = len(numbers)
    return found


def router_healthy(c: Container) -> bool:
    """The router lists every rank, healthy (its worker API wants the control-plane key)."""
    _, key, _ = c.ssh_run("cat /etc/sglang/router-control-plane.key")
    status, body = http(f"http://{c.address}:{ROUTER_PORT}/workers", key=key.strip())
    if status != 200:
        return False
    workers = {w["url"]: w["is_healthy"] for w in body["workers"]}
    return len(workers) == RANKS and all(workers.values())


def measure(work: Path, indexes: Indexes, hosts: list[Container]) -> int:
    (c,) = hosts
    indexes.main.add(*router_wheels())
    slow_ranks(c, GENERATE_S, LOAD_S)
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address}
    deploy_py = ROOT / "deploy.py"

    def inventory(fraction: float) -> Path:
        data = host_data(
            c, indexes, router=router, mem_fraction_static=fraction, restart_batch_size=BATCH
        )
        return inventory_file(work, {c: data}, filename=f"roll-{fraction}.py")

    fractions = [0.9, 0.85]
    first, _ = pyinfra(inventory(0.9), deploy_py)
    print(f"roll_bench: brought to serving behind the router in {first:.1f} s", flush=True)
    pyinfra(inventory(0.85), deploy_py)  # every rank rolled once: the drop-in is read
    url = f"http://{c.address}:{ROUTER_PORT}"
    batches = [
        ",".join(
            f"sglang@{r}.service=http://{c.address}:{BASE_PORT + r}/health"
            for r in range(start, min(start + BATCH, RANKS))
        )
        for start in range(0, RANKS, BATCH)
    ]
    bare_command = "python3 -c " + shlex.join([BARE, *batches])
    state = {"rolls": 0}
    converged: list[float] = []
    details: list[Breakdown] = []
    # Each bare run's [restart, health, restart, health, ...] seconds, batch by batch.
    bare_phases: list[list[float]] = []
    sent = failed = bare_sent = bare_failed = 0
    kept: list[Path] = []

    def roll() -> float:
        nonlocal sent, failed
        state["rolls"] += 1
        fraction = fractions[(state["rolls"] - 1) % 2]
        wait_for(lambda: router_healthy(c), timeout=120, what="every rank in the router")
        with Load(url) as load:
            seconds, output = pyinfra(inventory(fraction), deploy_py, "-vvv")
        sent, failed = sent + load.sent, failed + load.failed
        if load.failed:
            print(load.report("roll"), flush=True)
        details.append(breakdown(output))
        if KEEP:
            kept.append(Path(tempfile.mkstemp(prefix="roll-bench-", suffix=".log")[1]))
            kept[-1].write_text(output)
        # The same deploy again changes nothing: the part of a roll that is not its batches.
        converged.append(pyinfra(inventory(fraction), deploy_py)[0])
        return seconds

    def bare() -> float:
        nonlocal bare_sent, bare_failed
        wait_for(lambda: router_healthy(c), timeout=120, what="every rank in the router")
        with Load(url) as load:
            started = time.monotonic()
            rc, out, err = c.ssh_run(bare_command, timeout=600)
            seconds = time.monotonic() - started
        if rc != 0:
            raise RuntimeError(f"the bare restarts failed: {err}")
        bare_phases.append([float(x) for pair in _BARE.findall(out) for x in pair])
        bare_sent, bare_failed = bare_sent + load.sent, bare_failed + load.failed
        return seconds

    runs = paired([("roll", roll), ("bare", bare)], ROUNDS)
    ratios = [r / b for r, b in zip(runs["roll"], runs["bare"], strict=True)]
    ratio = pair_ratio(runs, "roll", "bare")
    print(f"roll_bench: {RANKS} ranks in batches of {BATCH} under load, {ROUNDS} paired rounds")
    print(f"  {'run':<6} {'median s':>9}   all rounds (s)")
    for name, times in runs.items():
        print(
            f"  {name:<6} {statistics.median(times):9.2f}   " + " ".join(f"{t:.2f}" for t in times)
        )
    verdict = "met" if ratio <= GOAL and failed == 0 else "NOT met"
    print(
        f"  roll / bare restarts {ratio:5.2f}x median of per-round ratios (rounds: "
        f"{spread(ratios)}; goal <= {GOAL}x with 0 failed, issue 31: {verdict})"
    )
    print(f"  requests during the rolls: {sent} sent by {CLIENTS} clients, {failed} failed")
    print(f"  requests during the bare restarts: {bare_sent} sent, {bare_failed} failed")
    roll_s = statistics.median(runs["roll"])
    fixed = statistics.median(converged)
    print("  where a roll's time goes (medians over the rolls):")
    print(f"    {'converged deploy (pyinfra, facts, steps)':<44} {fixed:6.2f} s")
    names = sorted({n for d in details for n in d.phases})
    for name in names:
        value = statistics.median(d.phases.get(name, 0.0) for d in details)
        print(f"    {name + ', all batches':<44} {value:6.2f} s")
    phased = statistics.median(sum(d.phases.values()) for d in details)
    print(
        f"    {'the rest (SSH round trips, pyinfra per op)':<44} {roll_s - fixed - phased:6.2f} s"
    )
    print("  where the bare restarts' time goes (medians over the runs):")
    for index, name in enumerate(("restart", "health")):
        value = statistics.median(sum(run[index::2]) for run in bare_phases)
        print(f"    {name + ', all batches':<44} {value:6.2f} s")
    per_batch = statistics.median(d.commands / max(1, d.batches) for d in details)
    seen = statistics.median(d.batches for d in details)
    print(f"    SSH round trips per batch: {per_batch:.1f} ({seen:.0f} batches seen)")
    for path in kept:
        print(f"  a roll's output: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main("roll_bench", 1, measure))
