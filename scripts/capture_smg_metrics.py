"""What the real smg (Shepherd Model Gateway) serves on /metrics: tests/fixtures/smg/metrics-V.json.

    python scripts/capture_smg_metrics.py [--version 1.13.0] [--smg-python PATH]

Starts the released smg as scripts/capture_smg_behaviour.py does (installed from
operations/kb/pins/smg-V-pyX.Y.txt with hashes, launched by operations/programs/router_launch.py
with the control-plane key in a credential directory) in front of that script's two stand-in
ranks, drives it through what the dashboard shows (chat requests answered, one the rank answers
500, one while no rank is ready, a rank taken out by its /health and back), then reads its
Prometheus listener (`--prometheus-port`, where the deploy's targets file points Prometheus) and
records every metric family on it: its TYPE and the names of its labels. Values, worker URLs
and ports change every run and are left out.

smg registers a metric when it first records it (the `metrics` crate), so a family the run never
touched is not in the capture: the dashboard may only name what the capture holds
(tests/unit/test_monitoring.py). Review the diff and commit the fixture.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.capture_smg_behaviour import (
    FIXTURES,
    KEY,
    REPO,
    Rank,
    chat,
    free_port,
    http,
    log,
    running_smg,
    smg_python,
    statuses,
    wait_for,
)

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# One sample line: NAME{LABELS} VALUE, or NAME VALUE.
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def families(text: str) -> dict[str, dict[str, Any]]:
    """Every family on a Prometheus text page: {name: {"type", "labels"}} (a histogram's
    _bucket/_sum/_count samples under its own name; `le` left out of its labels)."""
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            found.setdefault(name, {"type": kind, "labels": set()})["type"] = kind
            continue
        match = SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name = match.group(1)
        if name not in found:
            base = next((name[: -len(p)] for p in HISTOGRAM_PARTS if name.endswith(p)), name)
            name = base if base in found else name
        labels = set(LABEL.findall(match.group(2) or "")) - {"le", "quantile"}
        found.setdefault(name, {"type": "untyped", "labels": set()})["labels"] |= labels
    return {n: {"type": f["type"], "labels": sorted(f["labels"])} for n, f in sorted(found.items())}


def drive(port: int, a: Rank, b: Rank) -> None:
    """What the dashboard's panels show: requests served, errors, a rank out and back."""
    names = {a.url: "a", b.url: "b"}
    results: list[dict[str, Any]] = []
    for _ in range(8):
        chat(port, 0, results)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "fail:500"}]}
    results.append({"status": http("POST", port, "/v1/chat/completions", body)[0]})
    a.healthy = b.healthy = False
    wait_for(lambda: set(statuses(port, names).values()) == {"not_ready"}, 30, "none ready")
    chat(port, 0, results)  # no rank to send it to
    a.healthy = b.healthy = True
    wait_for(lambda: statuses(port, names) == {"a": "ready", "b": "ready"}, 30, "ready again")
    chat(port, 0, results)
    log(f"requests sent: {[r['status'] for r in results]}")


def capture(python: str, version: str) -> dict[str, Any]:
    a, b = Rank("a"), Rank("b")
    port, metrics_port = free_port(), free_port()
    with running_smg(python, [a.url, b.url], port, {}, True, metrics_port):
        names = {a.url: "a", b.url: "b"}
        wait_for(lambda: statuses(port, names) == {"a": "ready", "b": "ready"}, 60, "2 ready")
        drive(port, a, b)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with _DIRECT.open(url, timeout=30) as response:
            page = response.read().decode()
        assert http("GET", port, "/workers", key=KEY)[0] == 200
    for rank in (a, b):
        rank.server.shutdown()
    return {
        "smg": version,
        "launched_by": "operations/programs/router_launch.py",
        "read_from": "GET /metrics on --prometheus-port",
        "families": families(page),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="1.13.0")
    parser.add_argument("--smg-python", help="an interpreter with smg installed (else pinned)")
    args = parser.parse_args(argv)
    found = capture(smg_python(args.version, args.smg_python), args.version)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    out = FIXTURES / f"metrics-{args.version}.json"
    out.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")
    log(f"wrote {out.relative_to(REPO)}: {len(found['families'])} families")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
