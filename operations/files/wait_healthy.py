#!/usr/bin/env python3
"""Wait until each (re)started SGLang unit answers 200 on /health, with a deadline.

Shipped to the host by operations/serve.py and run there (the servers may listen on loopback
only). Fails fast when a unit dies or systemd restarts it, and then prints that unit's journal so
the deploy's output shows why. Usage:

    wait_healthy.py --timeout SECONDS [--hint TEXT] UNIT=URL [UNIT=URL ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.error
import urllib.request

POLL_S = 1.0
JOURNAL_LINES = 40


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# The servers are this host's own: an http_proxy/https_proxy in the environment (or a
# proxy the deploy's shell inherited) must never see, or answer for, their /health.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def healthy(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def journal(unit: str) -> str:
    return subprocess.run(
        ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def fail(unit: str, why: str, hint: str) -> int:
    print(f"{unit}: {why}. Last {JOURNAL_LINES} journal lines:", flush=True)
    print(journal(unit), flush=True)
    if hint:
        print(hint, flush=True)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--hint", default="")
    parser.add_argument("checks", nargs="+", metavar="UNIT=URL")
    args = parser.parse_args()

    pending = dict(check.split("=", 1) for check in args.checks)
    restarts = {unit: unit_state(unit).get("NRestarts", "0") for unit in pending}
    start = time.monotonic()
    deadline = start + args.timeout
    while pending:
        for unit, url in list(pending.items()):
            if healthy(url):
                print(f"{unit}: healthy after {time.monotonic() - start:.0f}s", flush=True)
                del pending[unit]
                continue
            state = unit_state(unit)
            if state.get("ActiveState") == "failed" or state.get("SubState") == "auto-restart":
                return fail(
                    unit, f"{state.get('ActiveState')} ({state.get('SubState')})", args.hint
                )
            if state.get("NRestarts", "0") != restarts[unit]:
                return fail(unit, "crashed and was restarted by systemd", args.hint)
            if state.get("ActiveState") == "inactive":
                return fail(unit, "is not running", args.hint)
        if not pending:
            break
        if time.monotonic() > deadline:
            unit = next(iter(pending))
            return fail(unit, f"no 200 from {pending[unit]} within {args.timeout:.0f}s", args.hint)
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
