"""How often the throughput guard and the canary decide right, on this noisy 2-core machine.

Not a speed ratio: a decision's error rate, counted over repeated trials against a baseline
measured in the same run (issue 49, "Done when"). Each trial starts the SGLang server doubles
afresh, so each rank draws its speed again within +-SPEED_JITTER (cards and starts differ by a
few percent), while CLIENTS threads keep sending chat requests to the ranks in turn, as clients
do through the gateway's round robin (the double decodes them in the same batches as the
check's requests: tests/doubles/packages/sglang/_generate_double.py). The programs run as the
host runs them (the bundled scripts), at the defaults (max_slowdown 0.10), with short windows:

- guard: a first check keeps a record; then each trial restarts the ranks at the same speed and
  checks again: every one must pass (a failure is a false alarm);
- canary, as fast: one canary rank and two baselines at the same speed: every trial must pass;
- canary, 25% slower: the canary at 0.75 of the speed: every trial must fail on speed.

    python bench/decisions_bench.py [TRIALS]   (default 8 each)

Prints each trial's verdict and the noise it was decided against, then the counts.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operations.render.host_scripts import script_text  # noqa: E402
from tests.doubles.rank_doubles import RankDoubles, engine_env  # noqa: E402

RATE, COST, RUNNING = 20.0, 0.02, 48
SPEED_JITTER = 0.05
CLIENTS = 4
KEY = "sk-bench-decisions"
ME = pwd.getpwuid(os.getuid()).pw_name
LOAD = [
    "--input-len", "8", "--output-len", "32", "--start", "8", "--most", "512",
    "--ramp-timeout", "60", "--rounds", "3", "--window", "2", "--timeout", "240", "--model", "m",
]  # fmt: skip


def start(ranks: RankDoubles, rates: list[float]) -> list[str]:
    """The doubles at `rates`, each drawing its speed within +-SPEED_JITTER: their roots."""
    knobs = {
        "SGLANG_DOUBLE_BATCH_COST": str(COST),
        "SGLANG_DOUBLE_MAX_RUNNING": str(RUNNING),
        "SGLANG_DOUBLE_SPEED_JITTER": str(SPEED_JITTER),
    }
    return [ranks.start(str(rate), **knobs) for rate in rates]


class Clients:
    """CLIENTS threads sending chats to the ranks in turn until stopped (bounded in time)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.stop, self.sent, self.failed = urls, threading.Event(), 0, 0
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(CLIENTS)]

    def run(self, first: int) -> None:
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
        ).encode()
        turn = first
        deadline = time.monotonic() + 1800
        while not self.stop.is_set() and time.monotonic() < deadline:
            url = self.urls[turn % len(self.urls)] + "/v1/chat/completions"
            turn += 1
            request = urllib.request.Request(
                url,
                data=body,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    resp.read()
                self.sent += 1
            except OSError:
                self.failed += 1
                self.stop.wait(0.1)

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=70)


def check(tmp: Path, urls: list[str]) -> tuple[int, dict[str, object], str]:
    program = tmp / "throughput.py"
    program.write_text(script_text("throughput.py"))
    meta = {
        "release": "0.5.11",
        "engine": "e",
        "model_digest": "d",
        "flags_digest": "f",
        "server_args": [],
        "workload": {"input_len": 8, "output_len": 32, "model": "m", "model_digest": "d"}
        | {"ranks": len(urls)},
    }
    words = [sys.executable, str(program), *LOAD]
    words += [w for i, u in enumerate(urls) for w in ("--rank", f"r{i}={u}")]
    words += ["--key-file", str(tmp / "secrets.yaml"), "--service-user", ME]
    words += ["--records", str(tmp / "records.jsonl"), "--meta", json.dumps(meta)]
    words += ["--max-slowdown", "0.1", "--guard", "fail"]
    out = subprocess.run(words, capture_output=True, text=True, timeout=600).stdout.splitlines()
    record = json.loads(out[0].removeprefix("throughput ")) if out else {}
    return (0 if record.get("verdict", {}).get("ok") else 1), record, out[-1] if out else ""


def canary(tmp: Path, urls: list[str]) -> tuple[bool, str]:
    program = tmp / "canary_compare.py"
    program.write_text(script_text("canary_compare.py"))
    (tmp / "state").mkdir(exist_ok=True)
    meta = {"release": "0.5.11", "engine": "e", "canary_ranks": [0], "baseline_rank": 1}
    words = [sys.executable, str(program), "--canary", f"c={urls[0]}/v1"]
    words += [w for i, u in enumerate(urls[1:]) for w in ("--baseline", f"b{i}={u}/v1")]
    words += ["--key-file", str(tmp / "secrets.yaml"), "--service-user", ME]
    words += ["--max-slowdown", "0.1", "--soak", "0", "--record", str(tmp / "state" / "c.json")]
    words += ["--target", "ab" * 32, "--meta", json.dumps(meta), *LOAD]
    out = subprocess.run(words, capture_output=True, text=True, timeout=600).stdout.splitlines()
    kept = json.loads((tmp / "state" / "c.json").read_text())
    row = next(r for r in kept["rows"] if r["check"] == "speed")
    return bool(row["pass"]), f"{out[-1] if out else ''} | {row['canary']} | {row['threshold']}"


def main(trials: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="decisions-"))
    (work / "secrets.yaml").write_text(f'api-key: "{KEY}"\n')
    ranks = RankDoubles(engine_env(work / "engine"), work / "model", KEY)
    counts: dict[str, list[bool]] = {"guard": [], "canary as fast": [], "canary 25% slower": []}
    try:
        urls = start(ranks, [RATE, RATE])
        with Clients(urls):
            code, record, line = check(work, urls)
        ranks.stop()
        print(f"guard's first record: {record.get('output_tok_s')} tok/s; {line}", flush=True)
        for i in range(trials):
            urls = start(ranks, [RATE, RATE])
            with Clients(urls) as load:
                code, record, line = check(work, urls)
            ranks.stop()
            counts["guard"].append(code == 0)
            print(f"guard {i + 1}: {'pass' if code == 0 else 'FAIL'} ({load.failed} client "
                  f"failures) {line}", flush=True)  # fmt: skip
        for name, factor, want in (
            ("canary as fast", 1.0, True),
            ("canary 25% slower", 0.75, False),
        ):
            for i in range(trials):
                urls = start(ranks, [RATE * factor, RATE, RATE])
                with Clients(urls):
                    passed, said = canary(work, urls)
                ranks.stop()
                counts[name].append(passed == want)
                print(f"{name} {i + 1}: {'pass' if passed else 'FAIL'}: {said}", flush=True)
    finally:
        ranks.stop()
    for name, right in counts.items():
        print(f"{name}: {sum(right)} of {len(right)} decided right")
    return 0 if all(all(r) for r in counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
