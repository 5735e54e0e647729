"""A roll batch's steps run in order (programs/roll_batch.py's docstring says how each kind of
step runs, and why): shared by the roll batch and the canary's rollback
(programs/canary_compare.py), which runs the rollback's steps in its own process.

Not run on its own: inlined into each program by operations/render/host_scripts.py. A step of
another interpreter starts the running script itself with --wait (`__file__`: the program this
part is inlined into), so each program that runs steps hands --wait to roll_waiting.wait_for_go
first thing in its main.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import time
import traceback

from operations.programs.roll_waiting import GO

WRITE = "write"
# A step's other interpreter runs this script as its waiting interpreter (roll_waiting.py).
WAIT = "--wait"

Step = tuple[str, list[str], list[str]]  # NAME, ARGV, PRELOAD


def steps_of(raw: object) -> list[Step]:
    """STEPS_JSON, parsed: [NAME, ARGV] or [NAME, ARGV, PRELOAD] entries, each word a str."""
    if not isinstance(raw, list) or not all(
        isinstance(step, list) and len(step) in (2, 3) and isinstance(step[1], list) for step in raw
    ):
        raise ValueError("not a JSON list of [NAME, ARGV] or [NAME, ARGV, PRELOAD] entries")
    return [
        (str(step[0]), [str(word) for word in step[1]], [str(m) for m in step[2:3] and step[2]])
        for step in raw
    ]


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


def run(batch: str, steps: list[Step], writes: list[str], failed: list[int] | None = None) -> int:
    """Each step in order, the first that fails stopping the rest: its exit status (0: all
    passed); `failed` gets the index of the step that failed."""
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
                if failed is not None:
                    failed.append(index)
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
