#!/usr/bin/env python3
"""The status command's probe of the ranks and the router, run on their host by the ServingStatus
fact (operations/facts/serve_status.py) as one `python3 -c` argument, so the URLs are the host's
own (proxies are ignored).

    serving_probe.py TIMEOUT KEY=HEALTH_URL ... [--metrics KEY=METRICS_URL ...]
        [--phases JSON KEY=UNIT ...]

Prints "health KEY CODE" (the HTTP status) or "health KEY refused|timeout|error:WHAT" per
/health URL; per /metrics URL, read in the same pool, "metrics KEY RUNNING QUEUED", each the sum
of that gauge's series ("-" when the page has none: rank_metrics.py), or "metrics KEY ! WHY"
(an HTTP status, refused, timeout, error:WHAT). With --phases (the release's start-up regexes,
startup_phases.py), per unit "phases KEY {JSON}", its last start phase by phase as read from its
journal (StartupPhases), or "phases KEY ! error:WHAT".
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from operations.programs.rank_metrics import request_gauges
from operations.programs.startup_phases import Patterns, compile_patterns, rank_phases

PAGE_LIMIT = 1 << 22  # bytes of a page read: SGLang's is a few tens of KiB

# The ranks and the router are this deployment's own: no proxy may see or answer them.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float) -> tuple[str, str | None]:
    """(the HTTP status, the page) or (refused|timeout|error:WHAT, None)."""
    try:
        with _DIRECT.open(url, timeout=timeout) as response:
            return str(response.status), response.read(PAGE_LIMIT).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return str(error.code), None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, ConnectionRefusedError):
            return "refused", None
        if isinstance(reason, TimeoutError):
            return "timeout", None
        return "error:" + type(reason).__name__, None
    except TimeoutError:  # socket.timeout is TimeoutError (Python 3.10)
        return "timeout", None
    except Exception as error:  # any other failure is that URL's answer, not the probe's end
        return "error:" + type(error).__name__, None


def health(pair: str, timeout: float) -> tuple[str, str]:
    key, url = pair.split("=", 1)
    return key, get(url, timeout)[0]


def gauges(pair: str, timeout: float) -> tuple[str, str]:
    key, url = pair.split("=", 1)
    code, text = get(url, timeout)
    if code != "200" or text is None:
        return key, "! " + code
    read = request_gauges(text)
    return key, " ".join("-" if value is None else f"{value:g}" for value in read)


def phases(pair: str, patterns: Patterns) -> tuple[str, str]:
    key, unit = pair.split("=", 1)
    try:
        return key, json.dumps(rank_phases(unit, patterns)[0], sort_keys=True)
    except Exception as error:  # no systemctl or journalctl: that rank's answer, not the end
        return key, "! error:" + type(error).__name__


def main(argv: list[str]) -> int:
    if not argv:
        print(
            "usage: serving_probe.py TIMEOUT KEY=URL ... [--metrics KEY=URL ...] "
            "[--phases JSON KEY=UNIT ...]"
        )
        return 2
    timeout = float(argv[0])
    args = argv[1:]
    units: list[str] = []
    patterns: Patterns = {}
    if "--phases" in args:
        at = args.index("--phases")
        args, patterns, units = args[:at], compile_patterns(args[at + 1]), args[at + 2 :]
    cut = args.index("--metrics") if "--metrics" in args else len(args)
    pairs, pages = args[:cut], args[cut + 1 :]
    with ThreadPoolExecutor(max(1, len(pairs) + len(pages))) as pool:
        scraped = pool.map(lambda pair: gauges(pair, timeout), pages)
        for key, answer in pool.map(lambda pair: health(pair, timeout), pairs):
            print("health", key, answer)
        for key, answer in scraped:
            print("metrics", key, answer)
        for key, answer in pool.map(lambda pair: phases(pair, patterns), units):
            print("phases", key, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
