"""The converged full deploy against a trivial deploy, and 1 host against 4, in testbed
containers (needs root, like the e2e tests). Prints a table; asserts nothing.

Four containers (8 x RTX PRO 6000 doubles each) are brought to serving once with the real
`pyinfra -y INVENTORY deploy.py`: engine from the double wheels on loopback indexes, a tiny
model staged, 8 ranks of the SGLang server double (dp_size 8) on each host's own 127.0.0.N.
Then, ROUNDS times, paired (each round's runs are neighbours in time, and the order turns each
round so a drift hits every side alike: tests/e2e/benching.paired):
  trivial 1 host   a one-operation deploy (files.directory of a directory that exists) against
                   the first host: pyinfra's start, SSH connect and one fact, the floor
  full 1 host      the converged full deploy against the first host
  full 4 hosts     the converged full deploy against all four
Goals: full / trivial at most 1.10x (issue 29; issue 22 asked 1.25x); 4 hosts within 1.5x of
one (issue 6). The ratio judged is the median of the per-round ratios.

The roll behind the router is bench/roll_bench.py's.

Where the converged deploy's time goes: TIMED_RUNS runs of the real deploy.py through a wrapper
(TIMED_DEPLOY) that marks each phase as deploy.py reaches it (pyinfra's own start and connect,
the lock's request, the toolkit's imports, the facts, the plan, its panel and the operation
calls), the medians printed beside the trivial deploy's whole run.

BENCH_ROUNDS (default 5) sets the rounds; BENCH_PROFILE=1 adds one `--debug` run of the
converged full deploy against the first host, prints its facts and commands by count and
keeps its output in a temporary file.

BENCH_TRICKS=1 measures instead what each of the converged deploy's speed tricks saves (issue
36, point 9), on one host (BENCH_TRICKS=NAME,NAME: only those tricks of WITHOUT): paired rounds
of the converged deploy as it is and, for each trick, deploy.py's own text with that trick undone
first (WITHOUT), the median of per-round differences in wall time and in the controller's CPU
time. A trick is kept when it saves 50 ms or more (bench/README.md, which records the tricks
measured and removed).
"""

from __future__ import annotations

import ast
import collections
import functools
import os
import re
import resource
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.benching import (  # noqa: E402
    bench_main,
    host_data,
    pair_ratio,
    paired,
    pyinfra,
    spread,
)
from tests.e2e.deploying import Indexes  # noqa: E402
from tests.testbed import Container, inventory_file  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PROFILE = os.environ.get("BENCH_PROFILE", "") not in ("", "0")
HOSTS = 4
TRIVIAL_DEPLOY = """\
from pyinfra.operations import files

files.directory(name="Bench: /tmp exists", path="/tmp")
"""


TIMED_RUNS = 5
# deploy.py as pyinfra runs it, with a mark at each phase: the functions it calls are wrapped
# before it imports them, then its own text runs (compiled under its own name).
TIMED_DEPLOY = """\
import os, time
from pathlib import Path

DEPLOY, MARKS = {deploy!r}, {marks!r}
_stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
_uptime = float(Path("/proc/uptime").read_text().split()[0])
# The process's start, on perf_counter's clock: pyinfra's own start and connect come first.
_zero = time.perf_counter() - (_uptime - int(_stat[19]) / os.sysconf("SC_CLK_TCK"))
_marks = [("pyinfra start and connect", time.perf_counter())]

import operations.runtime.deploy_lock as _lock  # deploy.py's first import


def _marked(owner, name, before, after, then=None):
    real = getattr(owner, name)

    def call(*args, **kwargs):
        if before:
            _marks.append((before, time.perf_counter()))
        try:
            return real(*args, **kwargs)
        finally:
            _marks.append((after, time.perf_counter()))
            if then is not None:
                then()

    setattr(owner, name, call)


def _imported():
    # deploy.py has imported the toolkit by now: the plan's own calls are wrapped in place.
    import operations.runtime.plan_step as gate, operations.runtime.gather as plan

    _marked(plan, "gather", "knowledge loaded", "facts answered")
    _marked(gate, "plan_for_host", "", "plan decided")


_marked(_lock, "ask", "", "lock asked")
_marked(_lock.Request, "taken", "toolkit imported", "lock taken", then=_imported)
_code = compile(Path(DEPLOY).read_text(), DEPLOY, "exec")
exec(_code, {{"__file__": DEPLOY, "__name__": "deploy"}})
_marks.append(("panel shown, operations called", time.perf_counter()))
with open(MARKS, "a") as out:
    out.write(repr([(n, t - _zero) for n, t in _marks]) + "\\n")
"""


def timeline(one: Path, work: Path, deploy_py: Path, trivial_s: float) -> None:
    """The phases of TIMED_RUNS converged deploys, medians, each phase's time since the one
    before it."""
    marks = work / "marks.txt"
    timed = work / "timed_deploy.py"
    timed.write_text(TIMED_DEPLOY.format(deploy=str(deploy_py), marks=str(marks)))
    totals = [pyinfra(one, timed)[0] for _ in range(TIMED_RUNS)]
    runs = [ast.literal_eval(line) for line in marks.read_text().splitlines()]
    names = [name for name, _ in runs[0]]
    print(f"where a converged deploy's time goes (median of {TIMED_RUNS} runs, 1 host):")
    before = [0.0] * len(runs)
    for index, name in enumerate(names):
        spans = [run[index][1] - before[i] for i, run in enumerate(runs)]
        before = [run[index][1] for run in runs]
        print(f"  {name:<30} {statistics.median(spans) * 1000:6.0f} ms")
    rest = [total - run[-1][1] for total, run in zip(totals, runs, strict=True)]
    print(f"  {'pyinfra runs them, disconnects':<30} {statistics.median(rest) * 1000:6.0f} ms")
    print(f"  {'whole run':<30} {statistics.median(totals) * 1000:6.0f} ms")
    print(f"  {'the trivial deploy, whole run':<30} {trivial_s * 1000:6.0f} ms (median, above)")


_FACT = re.compile(r"(?:Getting|Loading|Running) fact:? (?P<fact>[\w.]+)")
_COMMAND = re.compile(r"Running command on \S+: \(pty=\w+\) (?P<command>.*)")


def profile(output: str) -> None:
    """Facts and remote commands of one `--debug` run, most frequent first."""
    facts = collections.Counter(m.group("fact") for m in _FACT.finditer(output))
    commands = collections.Counter(m.group("command")[:90] for m in _COMMAND.finditer(output))
    print(f"  facts gathered: {sum(facts.values())}")
    for name, count in facts.most_common(8):
        print(f"    {count:3d} x {name}")
    print(f"  remote commands: {sum(commands.values())}")
    for text, count in commands.most_common(8):
        print(f"    {count:3d} x {text}")


def table(runs: dict[str, list[float]]) -> None:
    print(f"serve_bench: converged deploy, dp_size 8 per host, {ROUNDS} paired rounds")
    print(f"  {'run':<16} {'median s':>9}   all rounds (s)")
    for name, times in runs.items():
        rounds = " ".join(f"{t:.2f}" for t in times)
        print(f"  {name:<16} {statistics.median(times):9.2f}   {rounds}")
    # (numerator, denominator, goal, the issue that set it, label)
    checks = (
        ("full 1 host", "trivial 1 host", 1.10, "issue 29", "full deploy / trivial deploy"),
        ("full 4 hosts", "full 1 host", 1.5, "issue 6", "4 hosts / 1 host"),
    )
    for top, bottom, goal, issue, label in checks:
        ratio = pair_ratio(runs, top, bottom)
        each = [t / b for t, b in zip(runs[top], runs[bottom], strict=True)]
        verdict = "met" if ratio <= goal else "NOT met"
        print(
            f"  {label:<29} {ratio:5.2f}x median of per-round ratios (rounds: {spread(each)}; "
            f"goal <= {goal}x, {issue}: {verdict})"
        )


# What undoes each trick, run before deploy.py's own text (which the variant file holds after
# it). A patch of a module deploy.py imports later is made when its lock is answered
# (`Request.taken`, after the toolkit's imports): importing it earlier would move its import
# before the lock's request, which the lock's round trip overlaps.
_WHEN_TAKEN = """\
import operations.runtime.deploy_lock as _lock

_taken = _lock.Request.taken


def _undo_then_taken(self):
{undo}
    return _taken(self)


_lock.Request.taken = _undo_then_taken
"""
WITHOUT: dict[str, str] = {
    # The package's bytecode is neither read (moved aside by the side itself) nor written.
    "bytecode flag": "import operations, sys\nsys.dont_write_bytecode = True\n",
    # The knowledge base is parsed, checked and built on every run.
    "kept knowledge build": _WHEN_TAKEN.format(
        undo="    import operations.kb.loader as _l\n"
        "    _l._remembered = lambda key: None\n"
        "    _l._remember = lambda key, knowledge: None"
    ),
}


def _package_bytecode_aside(run: Callable[[], float]) -> float:
    """`run` with the .pyc files of operations/ moved aside, then put back: a run as one
    without the bytecode flag makes it after a checkout or a pull (nothing of ours cached)."""
    pycs = sorted((ROOT / "operations").rglob("__pycache__/*.pyc"))
    for pyc in pycs:
        pyc.rename(pyc.with_name(pyc.name + ".aside"))
    try:
        return run()
    finally:
        for pyc in pycs:
            pyc.with_name(pyc.name + ".aside").rename(pyc)


def tricks(work: Path, indexes: Indexes, hosts: list[Container]) -> int:
    """Each trick's saving on the converged deploy of one host, paired (BENCH_TRICKS=1): the
    wall time, and the controller's CPU time (pyinfra's process: what these tricks save, and
    what a busy machine's wall time hides)."""
    one = inventory_file(work, {hosts[0]: host_data(hosts[0], indexes)}, filename="one.py")
    deploy_py = ROOT / "deploy.py"
    pyinfra(one, deploy_py)
    pyinfra(one, deploy_py)  # converged from here on
    cpu: dict[str, list[float]] = {}

    def timed(name: str, deploy_file: Path, aside: bool = False) -> Callable[[], float]:
        def side() -> float:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = functools.partial(pyinfra, one, deploy_file)
            wall = _package_bytecode_aside(lambda: run()[0]) if aside else run()[0]
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            cpu.setdefault(name, []).append(used)
            return wall

        return side

    chosen = os.environ.get("BENCH_TRICKS", "1")
    measured = {t: u for t, u in WITHOUT.items() if chosen == "1" or t in chosen.split(",")}
    sides = [("as it is", timed("as it is", deploy_py))]
    for number, (trick, undo) in enumerate(measured.items()):
        variant = work / f"without_{number}.py"
        variant.write_text(f"{undo}\n{deploy_py.read_text()}")
        sides.append((trick, timed(trick, variant, aside=trick == "bytecode flag")))
    runs = paired(sides, ROUNDS)
    base = runs["as it is"]
    print(f"serve_bench tricks: converged deploy, 1 host, {ROUNDS} paired rounds")
    print(
        f"  as it is: wall {statistics.median(base):.3f} s ({spread(base)}), controller CPU "
        f"{statistics.median(cpu['as it is']):.3f} s ({spread(cpu['as it is'])})"
    )
    for trick in measured:
        saved = [(w - b) * 1000 for w, b in zip(runs[trick], base, strict=True)]
        saved_cpu = [(w - b) * 1000 for w, b in zip(cpu[trick], cpu["as it is"], strict=True)]
        print(
            f"  without {trick:<22} wall {pair_ratio(runs, trick, 'as it is'):5.3f}x, "
            f"{statistics.median(saved):+5.0f} ms (rounds {min(saved):+.0f} to {max(saved):+.0f}); "
            f"CPU {statistics.median(saved_cpu):+5.0f} ms "
            f"(rounds {min(saved_cpu):+.0f} to {max(saved_cpu):+.0f})"
        )
    return 0


def measure(work: Path, indexes: Indexes, hosts: list[Container]) -> int:
    data = {c: host_data(c, indexes) for c in hosts}
    one = inventory_file(work, {hosts[0]: data[hosts[0]]}, filename="one.py")
    four = inventory_file(work, data, filename="four.py")
    deploy_py = ROOT / "deploy.py"
    trivial_py = work / "trivial_deploy.py"
    trivial_py.write_text(TRIVIAL_DEPLOY)

    first, _ = pyinfra(four, deploy_py)
    print(f"serve_bench: {HOSTS} hosts brought to serving in {first:.1f} s", flush=True)
    # A second run must converge; the measured runs are all like it.
    pyinfra(four, deploy_py)
    runs = paired(
        [
            ("trivial 1 host", lambda: pyinfra(one, trivial_py)[0]),
            ("full 1 host", lambda: pyinfra(one, deploy_py)[0]),
            ("full 4 hosts", lambda: pyinfra(four, deploy_py)[0]),
        ],
        ROUNDS,
    )
    table(runs)
    timeline(one, work, deploy_py, statistics.median(runs["trivial 1 host"]))

    if PROFILE:
        seconds, output = pyinfra(one, deploy_py, "--debug")
        log = Path(tempfile.mkstemp(prefix="serve-bench-", suffix=".log")[1])
        log.write_text(output)
        print(f"profile: one --debug run of the full deploy, 1 host, {seconds:.2f} s")
        print(f"  its output: {log}")
        profile(output)
    return 0


if __name__ == "__main__":
    if os.environ.get("BENCH_TRICKS", "") not in ("", "0"):
        sys.exit(bench_main("serve_bench", 1, tricks))
    sys.exit(bench_main("serve_bench", HOSTS, measure))
