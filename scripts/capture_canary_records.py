"""The failed canary verdicts of tests/facts/canary.CanaryState/, as the real program writes them:
failed.json (the rollback has not run yet: a run killed after the verdict) and
failed-rolled-back.json (the rollback ran and passed).

    sudo .venv/bin/python scripts/capture_canary_records.py

Runs operations/programs/canary_compare.py, bundled as the host gets it, as root (as the deploy
runs it; the fact trusts only root's record), against two SGLang server doubles of 0.5.11 and the
router's /metrics double (tests/doubles/rank_doubles.py, as tests/unit/test_canary_compare.py
runs it): the canary sglang@0.service generating BASELINE_RATE * CANARY_SHARE tokens/s a
request against the baseline sglang@1.service's BASELINE_RATE, so its speed row fails at the
default max_slowdown (0.10) and the other rows pass; --meta, --target and --soak as the plan
writes them for the fixtures' host (rank 0 the canary on 0.5.12-cu128-1a2b3c4d, rank 1 the
baseline). failed.json's run has no --rollback; failed-rolled-back.json's has steps that pass.

Each fixture's `output` is CanaryState's own command (its record and backup paths pointed at the
run's directory) run here on the record the program wrote; the `backup` lines stay the
fixture's (the deploy's unit backup, not the program's). Its `fact` is that record read by hand
(`pass` is VerdictRow.passed), not by the parser under test. Both runs take --soak seconds, at
once. Review the diff and commit the fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operations.facts.canary import CanaryState  # noqa: E402
from operations.render.host_scripts import script_text  # noqa: E402
from tests.doubles.rank_doubles import RankDoubles, RouterPage, engine_env  # noqa: E402

FIXTURES = ROOT / "tests" / "facts" / "canary.CanaryState"
# The case the simulated CT200 after a failed canary shows (operations/simulated/converged.py).
SIMULATED = "failed-rolled-back"
SIMULATED_STATE = ROOT / "operations" / "simulated" / "captured" / "ct200" / "canary-state.txt"
SIMULATED_TABLE = SIMULATED_STATE.parent / "verdict-table.txt"
KEY = "sk-canary-fixture-5d0c"
BASELINE_RATE = 40  # tokens/s a request alone (the doubles' scheduler: rank_doubles.py)
CANARY_SHARE = 0.5  # well past max_slowdown's 0.10 (measured x0.8 at 0.73): speed fails
CANARY, BASELINE = "sglang@0.service", "sglang@1.service"
META = {
    "release": "0.5.12",
    "engine": "0.5.12-cu128-1a2b3c4d",
    "canary_ranks": [0],
    "baseline_rank": 1,
}
TARGET = "a" * 64
SOAK_S = "60"  # settings rollout.soak_s's default
ROLLED_BACK = [["drain", ["true"]], ["restore", ["true"]], ["restart", ["true"]]]
CASES = {
    "failed": (
        None,
        "the comparison failed on speed and the rollback has not run yet (a run killed after "
        "the verdict): rank 0's old unit is there to restore",
    ),
    "failed-rolled-back": (
        ROLLED_BACK,
        "the comparison failed on speed and rank 0 is back on its old unit: the record stays, "
        "so a re-run with nothing changed is refused",
    ),
}
MADE_BY = (
    "; the record is the real program's (canary_compare.py against the server doubles), made "
    "by scripts/capture_canary_records.py: run it again rather than editing the rows"
)


def run_case(work: Path, env: Path, roots: tuple[str, str], router: str, rollback: object) -> Path:
    """The program's run for one fixture: the record it kept."""
    canary, baseline = roots
    (work / "state").mkdir(mode=0o755, parents=True)
    (work / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    script = work / "canary_compare.py"
    script.write_text(script_text("canary_compare.py"))
    flags = {
        "--canary": f"{CANARY}={canary}/v1",
        "--baseline": f"{BASELINE}={baseline}/v1",
        "--model": "m",
        "--key-file": str(work / "secrets.yaml"),
        "--service-user": "root",
        "--max-slowdown": "0.1",
        "--soak": SOAK_S,
        "--record": str(work / "state" / "canary.json"),
        "--target": TARGET,
        "--meta": json.dumps(META),
        "--router-metrics": router,
        "--input-len": "32",
        "--output-len": "32",
        "--start": "8",
        "--most": "128",
        "--ramp-timeout": "30",
        "--rounds": "3",
        "--window": "2",
        "--timeout": "120",
    }
    words = [w for k, v in flags.items() for w in (k, v)]
    words += ["--worker", f"{CANARY}={canary}", "--worker", f"{BASELINE}={baseline}"]
    if rollback is not None:
        words += ["--rollback", json.dumps(rollback)]
    done = subprocess.run(
        [sys.executable, str(script), *words], capture_output=True, text=True, timeout=600
    )
    print(done.stdout, end="")
    (work / "stdout.txt").write_text(done.stdout)
    if done.returncode != 1 or done.stderr or "canary: FAILED (speed)" not in done.stdout:
        sys.exit(f"expected a verdict failed on speed alone, got exit {done.returncode}: {done}")
    return work / "state" / "canary.json"


def fact_lines(record: Path) -> list[str]:
    """CanaryState's command on the record as it lies: its record lines."""
    command = CanaryState().command(str(record), str(record.parent / "no-backups"))
    done = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def expected(record: dict[str, Any], backups: dict[str, str]) -> dict[str, Any]:
    rows = [
        {**{k: r[k] for k in ("check", "baseline", "canary", "threshold")}, "passed": r["pass"]}
        for r in record["rows"]
    ]
    read = {k: record[k] for k in ("target", "release", "engine", "canary_ranks")}
    read.update({k: record[k] for k in ("baseline_rank", "at", "ok", "paused")})
    read.update(rows=rows, rolled_back=record["rolled_back"])
    return {"record": read, "problem": None, "backups": backups, "ignored": {}}


def main() -> int:
    if os.geteuid() != 0:
        sys.exit(
            "run as root: the program runs as root on a host, and the fact trusts only "
            "root's record"
        )
    with tempfile.TemporaryDirectory(prefix="canary-records-") as tmp:
        work = Path(tmp)
        env = engine_env(work / "engine")
        with RankDoubles(env, work / "model", KEY) as ranks:
            roots = {name: ranks.start(str(BASELINE_RATE)) for name in CASES}
            slow = {name: ranks.start(str(int(BASELINE_RATE * CANARY_SHARE))) for name in CASES}
            pages = {n: RouterPage([slow[n], roots[n]], failing=[]) for n in CASES}
            try:
                with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
                    made = {
                        name: pool.submit(
                            run_case,
                            work / name,
                            env,
                            (slow[name], roots[name]),
                            pages[name].url,
                            rollback,
                        )
                        for name, (rollback, _) in CASES.items()
                    }
                    records = {name: future.result() for name, future in made.items()}
            finally:
                for router_page in pages.values():
                    router_page.stop()
        for name, (_, comment) in CASES.items():
            path = FIXTURES / f"{name}.json"
            fixture = json.loads(path.read_text())
            kept = [line for line in fixture["output"] if line.startswith(("backups ", "backup "))]
            lines = [line for line in fact_lines(records[name]) if line != "end"]
            record = json.loads(records[name].read_text())
            fixture["_comment"] = comment + MADE_BY
            fixture["output"] = [*lines, *kept, "end"]
            fixture["fact"] = expected(record, fixture["fact"]["backups"])
            path.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + "\n")
            print(f"wrote {path.relative_to(ROOT)}")
            if name == SIMULATED:
                # The simulated CT200 after a failed canary (inventory/demo_measured.py): the
                # same lines, the fact's answer there.
                SIMULATED_STATE.write_text("\n".join(fixture["output"]) + "\n")
                print(f"wrote {SIMULATED_STATE.relative_to(ROOT)}")
                # Its verdict table and last line, as the program printed them.
                said = (work / name / "stdout.txt").read_text().splitlines()
                start = next(i for i, line in enumerate(said) if line.startswith("check "))
                # As the deploy logs it (steps/canary.py leaves the rollback's steps out).
                table = [x for x in said[start:] if not x.startswith(("roll batch", "drained"))]
                SIMULATED_TABLE.write_text("\n".join(table) + "\n")
                print(f"wrote {SIMULATED_TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
