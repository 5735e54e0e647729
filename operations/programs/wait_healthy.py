#!/usr/bin/env python3
"""Wait until each (re)started SGLang unit answers 200 on /health, with a deadline.

Shipped to the host by operations/steps/serve.py and run there (the servers may listen on loopback
only). Fails fast when a unit dies or systemd restarts it, and then prints that unit's journal so
the deploy's output shows why. Usage:

    wait_healthy.py --timeout SECONDS --service-user USER [--hint TEXT] UNIT=URL [UNIT=URL ...]

A 200 counts only from a listener of USER (its uid in /proc/net/tcp or tcp6) while the unit is
active: another user who holds the port (bound while the rank was stopped or restarting) would
otherwise pass for the rank. Such a listener fails the wait at once, naming the port and its
owner (docs/security.md, "Who is sent the API key").

Progress: a line per unit as it answers ("sglang@3.service: healthy after 95s, 5 of 8"), and
every PROGRESS_S seconds the units still waited for with their state. On the deadline, every
unit still waited for is named and the journal of the first of them (in the order given: the
slowest rank) is printed. pyinfra shows these lines as they come with -vvv, and always when the
wait fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from operations.programs.hostsafe import JOURNAL_LINES, journal, listening, owner_problem
from operations.programs.polling import backoff

# Polls back off: a rank that loads in seconds (a test double, a small model) is seen within
# a few ms of its first 200, one that loads for minutes is asked twenty times a second (a poll
# is a read of /proc/net/tcp and, once something listens, one local GET: cheap). systemd is
# asked (a `systemctl show`, a process) at most every STATE_POLL_S, and again before a 200
# counts. With /health asked every 0.25 s, as before, a rank ready at 3.05 s was seen at
# 3.25 s on average: bench/roll_bench.py's health wait against the bare restarts' 10 ms poll.
FIRST_POLL_S = 0.01
POLL_GROWTH = 1.25
MAX_POLL_S = 0.05
STATE_POLL_S = 0.25
PROGRESS_S = 30.0


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


def fail(unit: str, why: str, hint: str) -> int:
    print(f"{unit}: {why}. Last {JOURNAL_LINES} journal lines:", flush=True)
    print(journal(unit), flush=True)
    if hint:
        print(hint, flush=True)
    return 1


def _said(state: dict[str, str]) -> str:
    return f"{state.get('ActiveState', '?')} ({state.get('SubState', '?')}), no 200 yet"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--hint", default="")
    parser.add_argument("checks", nargs="+", metavar="UNIT=URL")
    args = parser.parse_args()

    pending = dict(check.split("=", 1) for check in args.checks)
    total = len(pending)
    # The first reading is the first poll's too.
    states: dict[str, dict[str, str]] = {unit: unit_state(unit) for unit in pending}
    restarts = {unit: state.get("NRestarts", "0") for unit, state in states.items()}
    start = time.monotonic()
    deadline = start + args.timeout
    next_progress = start + PROGRESS_S
    sleeps = backoff(FIRST_POLL_S, POLL_GROWTH, MAX_POLL_S)
    next_state = start + STATE_POLL_S
    while pending:
        asked = time.monotonic() >= next_state
        if asked:
            next_state = time.monotonic() + STATE_POLL_S
        for unit, url in list(pending.items()):
            if asked or unit not in states:
                states[unit] = unit_state(unit)
            state = states[unit]
            where, reaching = listening(url)
            if reaching:
                # Someone listens: it must be the service user, or it is not the rank.
                why = owner_problem(where, reaching, args.service_user)
                if why is not None:
                    return fail(unit, f"{why}: its answers are not {unit}'s", args.hint)
                if state.get("ActiveState") == "active" and healthy(url):
                    # The 200 counts while the unit is active, never restarted, as systemd
                    # says after it came.
                    state = states[unit] = unit_state(unit)
                    if state.get("ActiveState") == "active" and (
                        state.get("NRestarts", "0") == restarts[unit]
                    ):
                        del pending[unit]
                        print(
                            f"{unit}: healthy after {time.monotonic() - start:.2f}s, "
                            f"{total - len(pending)} of {total}",
                            flush=True,
                        )
                        continue
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
        now = time.monotonic()
        if now > deadline:
            unit = next(iter(pending))
            waited = ", ".join(pending)
            return fail(
                unit,
                f"no 200 from {pending[unit]} within {args.timeout:.0f}s (still waiting for "
                f"{len(pending)} of {total}: {waited})",
                args.hint,
            )
        if now >= next_progress:
            next_progress = now + PROGRESS_S
            print(
                f"waiting {now - start:.0f}s of {args.timeout:.0f}s for {len(pending)} of "
                f"{total}: " + ", ".join(f"{u} ({_said(states.get(u, {}))})" for u in pending),
                flush=True,
            )
        time.sleep(next(sleeps))  # polling, with the deadline above
    return 0


if __name__ == "__main__":
    sys.exit(main())
