"""What preflight's GPU access probe (operations/facts/gpu.py GpuNodeAccess) adds to the
preflight round trip, in one testbed container (needs root, like the e2e tests). Prints the
medians and the median of per-pair ratios against the same round trip without it; asserts
nothing.

Measured in rounds of A B C (ROUNDS times), each one SSH exec of PreflightFacts' command:
  A  without the access part (the baseline, measured in the same round)
  B  with it, its result kept from an earlier round (a converged deploy: no unit started)
  C  with it, the kept result removed first (a first deploy, or after a node or user change:
     one transient unit with a rank's sandbox)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operations.facts.preflight import PreflightFacts  # noqa: E402
from operations.layout import PROBE_CACHE_DIR  # noqa: E402
from operations.plan import preflight  # noqa: E402
from tests.testbed import ContainerSpec, Testbed, ensure_testbed  # noqa: E402
from tests.unit.builders import make_settings  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))


def main() -> None:
    settings = make_settings()
    base = PreflightFacts().command("/dev/shm", "/opt/sglang").get_raw_value()
    probed = (
        PreflightFacts()
        .command("/dev/shm", "/opt/sglang", access=preflight.access_probe(settings))
        .get_raw_value()
    )
    bed = Testbed(ensure_testbed())
    try:
        (c,) = bed.boot(ContainerSpec(gpu_node_mode=0o666))
        c.ssh_run(probed)  # the kept result B reads

        def timed(command: str) -> float:
            start = time.monotonic()
            rc, _, err = c.ssh_run(command)
            if rc != 0:
                raise SystemExit(f"rc {rc}: {err}")
            return time.monotonic() - start

        a, b, cold = [], [], []
        for _ in range(ROUNDS):
            a.append(timed(base))
            b.append(timed(probed))
            c.ssh_run(f"rm -f {PROBE_CACHE_DIR}/gpu-probe-*")
            cold.append(timed(probed))
        for name, values in (("A without", a), ("B kept", b), ("C probed", cold)):
            ratio = statistics.median(v / w for v, w in zip(values, a, strict=True))
            print(
                f"{name:10} median {statistics.median(values) * 1000:6.0f} ms   "
                f"median per-pair ratio to A {ratio:.2f}"
            )
        c.ssh_run(probed)
    finally:
        bed.close()


if __name__ == "__main__":
    main()
