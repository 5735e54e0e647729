#!/usr/bin/env python3
"""One roll batch as one host command: its steps in order, each timed, the first that fails
stopping the rest.

Shipped to each rank's host by operations/steps/serve.py, which runs it once per batch of a roll
(one
SSH round trip a batch, where the steps were an operation each): take the batch out of the
router and drain it (router_workers.py out), write its new unit files, reload systemd, restart
it, wait for /health (wait_healthy.py), ask it a chat request (smoke.py) and put it back into
the router (router_workers.py in). Which steps, and each one's command, the serve step decides;
this script only runs them:

    roll_batch.py --batch UNITS STEPS_JSON < WRITES

STEPS_JSON: a JSON list of [NAME, ARGV] or [NAME, ARGV, PRELOAD] entries, run in order, each
one's output going to this script's own (pyinfra shows it with -vvv, and always on failure):

- ARGV `python3 /ABS/SCRIPT.py ...` (a shipped script, for the python3 that runs this one) runs
  in this process, as `python3` would run it (runpy, `__main__`, sys.argv): no interpreter
  starts, which on a busy host was a third of a second a step;
- ARGV `/ABS/bin/python /ABS/SCRIPT.py ...` (another interpreter: the smoke's, an engine
  environment's) starts when the batch starts, as this script with --wait (roll_waiting.py),
  imports PRELOAD (module names: what the script imports late, httpx for smoke.py), compiles the
  script and waits; its step only lets it go, so its start, imports and compile overlap the steps
  before it, and it exits without an interpreter's teardown once the script is done. A batch that
  stops first ends it (by its PID);
- any other ARGV runs as a process (no shell unless ARGV is one).

A step named `write` gets one line of this script's stdin as its stdin (a file's content,
base64, for host_files' writer: operations/steps/host_files.py `line_writer`), in order; every other
step reads nothing. Fewer lines than write steps: nothing runs. A step that exits non-zero
stops the batch: the steps after it do not run (a batch whose restart fails is never put back
into the router; one whose drain fails is never restarted), and this script exits with that
status.

Prints, last, one line: `roll batch UNITS: drain 0.31 s, write 0.01 s, ... ` (each step's
seconds, those that ran), which bench/roll_bench.py reads.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import time
import traceback

from operations.programs.roll_waiting import GO, wait_for_go

WRITE = "write"
# A step's other interpreter runs this script as its waiting interpreter (roll_waiting.py).
WAIT = "--wait"


def _own_script(argv: list[str]) -> bool:
    return (
        len(argv) >= 2
        and argv[0] == "python3"
        and argv[1].startswith("/")
        and (argv[1].endswith(".py"))
    )


def _other_python(argv: list[str]) -> bool:
    return (
        len(argv) >= 2
        and argv[0].startswith("/")
        and os.path.basename(argv[0]).startswith("python")
        and argv[1].startswith("/")
        and argv[1].endswith(".py")
    )


def in_process(argv: list[str]) -> int:
    """`python3 SCRIPT ARGS` in this interpreter: its exit status."""
    saved = sys.argv
    sys.argv = argv[1:]
    try:
        runpy.run_path(argv[1], run_name="__main__")
        return 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return int(done.code or 0)
        print(done.code, flush=True)
        return 1
    except Exception:  # what python3 would print, and exit 1
        traceback.print_exc(file=sys.stdout)
        return 1
    finally:
        sys.argv = saved
        sys.stdout.flush()


def start_waiting(argv: list[str], preload: list[str]) -> subprocess.Popen[bytes]:
    python, script, *rest = argv
    this = os.path.abspath(__file__)
    return subprocess.Popen(
        [python, this, WAIT, script, ",".join(preload), *rest], stdin=subprocess.PIPE
    )


def run(batch: str, steps: list[tuple[str, list[str], list[str]]], writes: list[str]) -> int:
    waiting = {
        index: start_waiting(argv, preload)
        for index, (_, argv, preload) in enumerate(steps)
        if _other_python(argv)
    }
    spent: list[tuple[str, float]] = []
    status = 0
    pending = list(writes)
    try:
        for index, (name, argv, _) in enumerate(steps):
            sys.stdout.flush()  # this script's lines before the step's own
            began = time.monotonic()
            if index in waiting:
                proc = waiting.pop(index)
                assert proc.stdin is not None
                proc.stdin.write(GO)
                proc.stdin.close()
                code = proc.wait()
            elif _own_script(argv):
                code = in_process(argv)
            elif name == WRITE:
                given = pending.pop(0).encode()
                code = subprocess.run(argv, input=given, check=False).returncode
            else:
                code = subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode
            spent.append((name, time.monotonic() - began))
            if code != 0:
                status = code
                why = f"{name} failed (exit {status}): the steps after it did not run"
                print(f"roll batch {batch}: {why}", flush=True)
                break
    finally:
        for proc in waiting.values():  # their steps never came: they end, by PID
            proc.kill()
            proc.wait()
    times = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in spent)
    print(f"roll batch {batch}: {times}", flush=True)
    return status


def main() -> int:
    if sys.argv[1:2] == [WAIT]:
        wait_for_go(sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", required=True)
    parser.add_argument("steps")
    args = parser.parse_args()
    steps = [
        (str(step[0]), [str(word) for word in step[1]], [str(m) for m in step[2:3] and step[2]])
        for step in json.loads(args.steps)
    ]
    expected = sum(1 for name, _, _ in steps if name == WRITE)
    # Exactly one line per write step: read as many, never the whole stream.
    writes = [sys.stdin.readline() for _ in range(expected)]
    if not all(line.endswith("\n") for line in writes):
        # Cut short: no step runs, so no file is written empty and nothing is restarted.
        print(f"roll batch {args.batch}: {expected} contents expected on stdin, fewer came")
        return 2
    return run(args.batch, steps, writes)


if __name__ == "__main__":
    sys.exit(main())
