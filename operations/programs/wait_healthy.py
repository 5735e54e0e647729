#!/usr/bin/env python3
"""Wait until each (re)started SGLang unit answers 200 on /health, with a deadline.

Shipped to the host by operations/steps/serve.py and run there (the servers may listen on loopback
only). Fails fast when a unit dies or systemd restarts it, and then prints that unit's journal so
the deploy's output shows why. Usage:

    wait_healthy.py --timeout SECONDS --service-user USER [--hint TEXT]
        [--phases JSON [--silence SECONDS]] UNIT=URL [UNIT=URL ...]

A 200 counts only from a listener of USER (its uid in /proc/net/tcp or tcp6) while the unit is
active: another user who holds the port (bound while the rank was stopped or restarting) would
otherwise pass for the rank. Such a listener fails the wait at once, naming the port and its
owner (docs/how-it-works/security.md, "Who is sent the API key").

Progress: a line per unit as it answers ("sglang@3.service: healthy after 95s, 5 of 8"), and
every PROGRESS_S seconds the units still waited for with their state. On the deadline, every
unit still waited for is named and the journal of the first of them (in the order given: the
slowest rank) is printed. pyinfra shows these lines as they come with -vvv, and always when the
wait fails.

With --phases (the release's start-up lines, startup_phases.py), a rank's start is read from its
own journal: the progress lines name each unit's last phase, one line at the end gives each
unit's start phase by phase (`start-up sglang-0.service: healthy 95.2 s: weights 4.6 s, ...`),
and a start that fails (the deadline, a crash, or --silence seconds without a journal line)
is named with its last phase and the journal lines around that phase's line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from operations.programs.hostsafe import (
    JOURNAL_LINES,
    journal,
    listening,
    mask_journal,
    owner_problem,
)
from operations.programs.polling import backoff
from operations.programs.startup_phases import (
    Patterns,
    compile_patterns,
    journal_of_start,
    rank_phases,
    split_line,
    summary,
)

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


def fail(unit: str, why: str, hint: str, patterns: Patterns | None = None) -> int:
    if patterns:
        phases, lines = rank_phases(unit, patterns)
        print(
            f"{unit}: {why}; its start: {summary(phases)}. Its journal lines around the last "
            "phase:",
            flush=True,
        )
        print(mask_journal("\n".join(lines)), flush=True)
    else:
        print(f"{unit}: {why}. Last {JOURNAL_LINES} journal lines:", flush=True)
        print(journal(unit), flush=True)
    if hint:
        print(hint, flush=True)
    return 1


def last_line_at(unit: str) -> float | None:
    """When the unit's current start last wrote to the journal (its start if it never did)."""
    started, lines = journal_of_start(unit)
    stamps = [t for t in (split_line(line)[0] for line in lines[-1:]) if t is not None]
    return stamps[-1] if stamps else started


def _phase_said(unit: str, patterns: Patterns | None) -> str:
    return f", {summary(rank_phases(unit, patterns)[0])}" if patterns else ""


def _said(state: dict[str, str]) -> str:
    return f"{state.get('ActiveState', '?')} ({state.get('SubState', '?')}), no 200 yet"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--hint", default="")
    parser.add_argument("--phases", default="")
    parser.add_argument("--silence", type=float, default=0.0)
    parser.add_argument("checks", nargs="+", metavar="UNIT=URL")
    args = parser.parse_args()

    pending = dict(check.split("=", 1) for check in args.checks)
    patterns = compile_patterns(args.phases) or None
    healthy_units: list[str] = []
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
                    return fail(unit, f"{why}: its answers are not {unit}'s", args.hint, patterns)
                if state.get("ActiveState") == "active" and healthy(url):
                    # The 200 counts while the unit is active, never restarted, as systemd
                    # says after it came.
                    state = states[unit] = unit_state(unit)
                    if state.get("ActiveState") == "active" and (
                        state.get("NRestarts", "0") == restarts[unit]
                    ):
                        del pending[unit]
                        healthy_units.append(unit)
                        print(
                            f"{unit}: healthy after {time.monotonic() - start:.2f}s, "
                            f"{total - len(pending)} of {total}",
                            flush=True,
                        )
                        continue
            if state.get("ActiveState") == "failed" or state.get("SubState") == "auto-restart":
                return fail(
                    unit,
                    f"{state.get('ActiveState')} ({state.get('SubState')})",
                    args.hint,
                    patterns,
                )
            if state.get("NRestarts", "0") != restarts[unit]:
                return fail(unit, "crashed and was restarted by systemd", args.hint, patterns)
            if state.get("ActiveState") == "inactive":
                return fail(unit, "is not running", args.hint, patterns)
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
                patterns,
            )
        if now >= next_progress:
            next_progress = now + PROGRESS_S
            print(
                f"waiting {now - start:.0f}s of {args.timeout:.0f}s for {len(pending)} of "
                f"{total}: "
                + ", ".join(
                    f"{u} ({_said(states.get(u, {}))}{_phase_said(u, patterns)})" for u in pending
                ),
                flush=True,
            )
            if args.silence > 0:
                for unit in pending:
                    at = last_line_at(unit)
                    if at is not None and time.time() - at > args.silence:
                        return fail(
                            unit,
                            f"wrote nothing to its journal for {time.time() - at:.0f}s (more "
                            f"than {args.silence:.0f}s)",
                            args.hint,
                            patterns,
                        )
        time.sleep(next(sleeps))  # polling, with the deadline above
    if patterns:
        print(
            "start-up "
            + "; ".join(f"{u}: {summary(rank_phases(u, patterns)[0])}" for u in healthy_units),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
