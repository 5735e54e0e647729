"""Capture two throughput records of the simulated CT200, as the real check writes them, for the
docs' samples (`make samples`: `status` of inventory/demo_measured.py, and the throughput line).

    sudo .venv/bin/python scripts/capture_throughput_records.py

It takes the check's command line from the simulated host's own plan (operations/simulated/
converged.py: its release, engine, flags, GPU, driver and workload in --meta) and runs the
bundled program (programs/throughput.py, as the host runs it) twice against eight SGLang
server TEST DOUBLES on this machine (tests/doubles/rank_doubles.py: a scheduler with a running
cap, so the figures are the doubles', not a card's), the windows 2 s instead of the plan's,
the ranks' URLs, key and records file this machine's. It writes
operations/simulated/captured/ct200/throughput.jsonl (both records) and throughput-line.txt (the
second check's line, as the deploy prints it). Run as root (the load client starts as a user).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operations.render.host_scripts import script_text  # noqa: E402
from operations.simulated import converged  # noqa: E402
from tests.doubles.rank_doubles import RankDoubles, engine_env  # noqa: E402

OUT = ROOT / "operations" / "simulated" / "captured" / "ct200"
KEY = "sk-capture-throughput"
# Flags of the plan's command line that name this machine's, not the simulated host's, things.
REPLACED = ("--rank", "--key-file", "--service-user", "--records", "--pending", "--window")


def plan_argv() -> list[str]:
    report, _ = converged.bare_plan(converged.repository_settings())
    run = report.throughput.run if report.throughput is not None else None
    if run is None:
        sys.exit("capture_throughput_records: the simulated host's plan runs no check")
    words, kept, skip = run.argv[2:], [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in REPLACED:
            skip = True
            continue
        kept.append(word)
    return kept


def main() -> int:
    argv = plan_argv()
    work = Path(tempfile.mkdtemp(prefix="capture-throughput-"))
    (work / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    program = work / "throughput.py"
    program.write_text(script_text("throughput.py"))
    env = engine_env(work / "engine")
    records = work / "throughput.jsonl"
    lines = []
    with RankDoubles(env, work / "model", KEY) as ranks:
        roots = [ranks.start("20") for _ in range(8)]
        words = [sys.executable, str(program), *argv]
        for n, root in enumerate(roots):
            words += ["--rank", f"sglang@{n}.service={root}"]
        words += ["--window", "2", "--key-file", str(work / "secrets.yaml")]
        words += ["--service-user", pwd.getpwuid(os.getuid()).pw_name]
        words += ["--records", str(records)]
        for _ in range(2):
            done = subprocess.run(words, capture_output=True, text=True, timeout=900)
            if done.returncode != 0 or done.stderr:
                sys.exit(f"capture_throughput_records: the check failed: {done}")
            lines.append(done.stdout.splitlines()[-1])
    kept = records.read_text().splitlines()
    assert len(kept) == 2 and all(json.loads(line)["verdict"]["ok"] for line in kept)
    (OUT / "throughput.jsonl").write_text("\n".join(kept) + "\n")
    (OUT / "throughput-line.txt").write_text(lines[-1] + "\n")
    print(f"wrote {OUT / 'throughput.jsonl'} and {OUT / 'throughput-line.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
