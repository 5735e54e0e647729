"""Staging speed against `cp -r`, in one testbed container (needs root, like the e2e tests).

A synthetic model (SHARDS x SHARD_MB of random bytes plus config.json) is written to the
container's disk; then, timed inside the container so SSH is not counted:
  cp -r SOURCE /dev/shm/...                  the baseline
  stage_model.py stage SOURCE /dev/shm ...   cold: nothing staged yet
  stage_model.py stage ... (again)           warm: converged, manifests compared only
  pyinfra -y INVENTORY deploy.py             the whole converged deploy, for reference
Both copies read a source already in the page cache (it was just written), so the ratio
compares the copies, not the disk. Prints one line per measurement; asserts nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operations.facts.model import script_text  # noqa: E402
from tests.doubles import wheels  # noqa: E402
from tests.e2e.deploying import LANE, make_indexes, run_deploy  # noqa: E402
from tests.testbed import ContainerSpec, Testbed, ensure_testbed  # noqa: E402

SHARDS = int(os.environ.get("BENCH_SHARDS", "6"))
SHARD_MB = int(os.environ.get("BENCH_SHARD_MB", "200"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SOURCE = "/srv/models/bench"
SCRIPT = "/root/stage_model.py"
RELEASE = "0.5.11"
TIMER = (
    "import subprocess, sys, time; t = time.monotonic(); "
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(time.monotonic() - t)"
)


def main() -> int:
    if os.geteuid() != 0:
        print("model_bench: needs root (systemd-nspawn testbed); skipped")
        return 0
    bed = Testbed(ensure_testbed())
    try:
        config = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
        (c,) = bed.boot(
            ContainerSpec(
                extra_files={
                    f"{SOURCE}/config.json": config,
                    SCRIPT: (script_text(), 0o755),
                }
            )
        )

        def sh(cmd: str) -> str:
            rc, out, err = c.ssh_run(cmd, timeout=600)
            if rc != 0:
                raise RuntimeError(f"{cmd}: {err}")
            return out

        def timed(*argv: str) -> float:
            return float(sh(shlex.join(["python3", "-c", TIMER, *argv])))

        for i in range(SHARDS):
            sh(f"head -c {SHARD_MB}M /dev/urandom > {SOURCE}/model-{i:05d}.safetensors")
        size_gb = SHARDS * SHARD_MB * 2**20 / 1e9
        stage = [
            "python3",
            SCRIPT,
            "stage",
            SOURCE,
            "/dev/shm",
            "bench",
            "--progress-interval",
            "0",
        ]
        cp_times, cold_times, warm_times = [], [], []
        for _ in range(ROUNDS):
            cp_times.append(timed("cp", "-r", SOURCE, "/dev/shm/cp-copy"))
            sh("rm -rf /dev/shm/cp-copy")
            cold_times.append(timed(*stage))
            warm_times.append(timed(*stage))
            sh("rm -rf /dev/shm/models")
        cp_s, cold_s, warm_s = min(cp_times), min(cold_times), min(warm_times)
        print(f"model: {SHARDS} shards x {SHARD_MB} MiB = {size_gb:.2f} GB, best of {ROUNDS}")
        print(f"cp -r:        {cp_s:.3f} s ({size_gb / cp_s:.2f} GB/s)")
        print(f"stage cold:   {cold_s:.3f} s = {cold_s / cp_s:.2f}x cp -r (goal <= 1.1x)")
        print(f"stage warm:   {warm_s:.3f} s (goal < 1 s)")

        sh(shlex.join(stage))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            built = {RELEASE: wheels.release_wheels(work / "wheels", RELEASE, LANE)}
            indexes = make_indexes(work / "index", built)
            try:
                data = {
                    **indexes.data(),
                    "sglang_version": RELEASE,
                    "model_name": "bench",
                    "model_source": SOURCE,
                    "dp_size": 1,
                    "server_host": c.address,
                    "ram_per_rank_gb": 0.25,
                }
                first = run_deploy(work, {c: data})
                if first.rc != 0:
                    raise RuntimeError(f"the first deploy failed:\n{first}")
                started = time.monotonic()
                again = run_deploy(work, {c: data})
                elapsed = time.monotonic() - started
                if again.rc != 0:
                    raise RuntimeError(f"the converged deploy failed:\n{again}")
            finally:
                for index in indexes.all():
                    index.stop()
            print(f"pyinfra converged deploy.py (gate, engine, model, serve; SSH): {elapsed:.2f} s")
    finally:
        bed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
