#!/usr/bin/env python3
"""Wait until each (re)started SGLang unit answers 200 on /health, with a deadline.

Shipped to the host by operations/serve.py and run there (the servers may listen on loopback
only). Fails fast when a unit dies or systemd restarts it, and then prints that unit's journal so
the deploy's output shows why. Usage:

    wait_healthy.py --timeout SECONDS [--hint TEXT] UNIT=URL [UNIT=URL ...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

POLL_S = 1.0

# ---- masking: an exact copy of operations/redact.py's block (test_redact.py pins it) ----
MASK = "***"
_URL = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>[^\s'\"<>`]+)")
# USERINFO@ at the start of what follows "://". A password may hold '/' or '@' (`user:pa/ss@h`,
# `user:p@ss@h`): it runs to the '@' that a host and the end of the authority follow. Userinfo
# without ':' (a bare token) stops at the first '/', '?' or '#'; hf://org/name@rev has none.
_USERINFO = re.compile(
    r"^(?:[^/@?#:]*:.*?|[^/@?#:]*)@(?=[A-Za-z0-9.\-\[\]:]+(?:[/?#),;]|$))", re.DOTALL
)
# A token as a path segment of an http(s) URL: after /t/ (anaconda.org), or a long random
# segment (Gemfury, Cloudsmith: https://dl.cloudsmith.io/TOKEN/org/repo/python/simple/).
_PATH_TOKEN = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_~-]{20,}$")
# name=value fields (ServerArgs' repr, an environment dump) and flags, in any log line.
_SECRET_FIELD = re.compile(
    r"(?P<name>\b(?:[a-z_]*api_key|[a-z_]*hf_token|HF_TOKEN|token|password|secret)\s*[=:]\s*)"
    r"(?!None\b)(?:'[^']*'|\"[^\"]*\"|[^\s,)'\"]+)"
)
_SECRET_FLAG = re.compile(r"(?P<name>(?:--[a-z-]*api-key|--token|Bearer)[ =]+)[^\s'\",)]+")


def _mask_url(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    rest = _USERINFO.sub(MASK + "@", rest, count=1)
    if scheme.lower() not in ("http", "https"):
        return f"{scheme}://{rest}"
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    head, slash, tail = path.partition("/")
    parts = tail.split("/") if slash else []
    for i, part in enumerate(parts):
        if (i > 0 and parts[i - 1] == "t") or _PATH_TOKEN.match(part):
            parts[i] = MASK
    if question:
        pairs = query.split("&")
        query = "&".join(p.split("=", 1)[0] + "=" + MASK if "=" in p else p for p in pairs)
    return f"{scheme}://{head}{slash}{'/'.join(parts)}{question}{query}{hash_}{fragment}"


def mask_journal(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Text with every credential masked: each of `secrets` (the key itself, where it is
    known) wherever it appears, URL userinfo, query values and path tokens, fields such as
    api_key='...' (SGLang logs its ServerArgs at start) and --api-key/Bearer values."""
    for secret in secrets:
        if secret.strip():
            text = text.replace(secret.strip(), MASK)
    text = _URL.sub(_mask_url, text)
    text = _SECRET_FIELD.sub(lambda m: m.group("name") + repr(MASK), text)
    return _SECRET_FLAG.sub(lambda m: m.group("name") + MASK, text)


# ---- end of the copied block ----
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
    """The unit's last lines, masked: SGLang logs its ServerArgs, api_key included, at start."""
    return mask_journal(
        subprocess.run(
            ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )


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
