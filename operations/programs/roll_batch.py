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

A canary batch (operations/plan/canary_plan.py) also gets `--undo STEPS_JSON --undo-from NAME`:
when the step that fails is the first one named NAME or any after it (its unit files were
written, or it was restarted), the undo's steps run (out of the router, the saved unit files
back, restart, /health, back in) and a line names the batch and whether it is back on its
saved units; the exit status is still the failed step's, so the deploy fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from operations.programs.roll_steps import WAIT, WRITE, run, steps_of
from operations.programs.roll_waiting import wait_for_go


def main() -> int:
    if sys.argv[1:2] == [WAIT]:
        wait_for_go(sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", required=True)
    parser.add_argument("steps")
    parser.add_argument("--undo", default=None, metavar="STEPS_JSON")
    parser.add_argument("--undo-from", default=None, metavar="NAME")
    args = parser.parse_args()
    steps = steps_of(json.loads(args.steps))
    undo = steps_of(json.loads(args.undo)) if args.undo is not None else []
    expected = sum(1 for name, _, _ in steps if name == WRITE)
    # Exactly one line per write step: read as many, never the whole stream.
    writes = [sys.stdin.readline() for _ in range(expected)]
    if not all(line.endswith("\n") for line in writes):
        # Cut short: no step runs, so no file is written empty and nothing is restarted.
        print(f"roll batch {args.batch}: {expected} contents expected on stdin, fewer came")
        return 2
    failed: list[int] = []
    status = run(args.batch, steps, writes, failed)
    names = [name for name, _, _ in steps]
    if (
        not status
        or not undo
        or args.undo_from not in names
        or failed[0] < names.index(args.undo_from)
    ):
        return status
    step = names[failed[0]]
    back = run(f"{args.batch} (rollback)", undo, [])
    said = (
        "rolled back onto its saved unit file(s)"
        if back == 0
        else f"its rollback FAILED too (exit {back}): it is left as it is"
    )
    print(f"roll batch {args.batch}: the canary failed at {step}; {said}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
