"""The engine step against plain `pip install` of the same wheels, in one testbed container
(needs root, like the e2e tests). Prints one line per measurement and the ratios; asserts nothing.

The wheels are the test doubles of sglang 0.5.11 / cu128 (tests/doubles/wheels.py), with an
incompressible blob of BENCH_TORCH_MB in torch so that installing moves bytes as a real torch
(about 900 MB of CUDA libraries) does; plus the real uv wheel. Measured, ROUNDS times each:
  pip fresh        inside the container: python3 -m venv + pip install --no-index --no-deps of
                   the lock's exact set (the baseline; the same packages the engine installs)
  pip again        the same pip install into that venv once more (already satisfied)
  engine fresh     `pyinfra -y INVENTORY engine-only deploy` with `wheelhouse` set, a new
                   engine_root and an empty engine_lock_dir each round: gate facts, wheelhouse
                   sync over SFTP, uv bootstrap, `uv lock` (the first resolve), install with
                   uv, the checks, the switch, the lock copied back; SSH and pyinfra included
  engine from lock the same on another new engine_root with the lock that run recorded: the
                   lock is uploaded and installed as it is (what a second host of that engine
                   does, issue 10), no resolve
  engine converged the first run again on its engine_root
  engine reinstall the first run's environment deleted and the deploy run again: the lock
                   and uv's warm cache are there, so this is what rebuilding a pruned engine
                   (a rollback past engine_keep, a damaged env) costs; uv links from its cache
The pip numbers exclude SSH and pyinfra; the engine numbers include them (that is what a user
waits for), so the ratios are an upper bound on the engine's own overhead.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operations import kb as kbmod  # noqa: E402
from operations.plan.engine_spec import engine_spec  # noqa: E402
from operations.settings import Layer, load  # noqa: E402
from tests.doubles import cuda_redist, wheels  # noqa: E402
from tests.e2e.deploying import support_wheels  # noqa: E402
from tests.e2e.index import uv_wheel  # noqa: E402
from tests.testbed import ContainerSpec, Testbed, ensure_testbed, inventory_file  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
# GB-scale by default: a real cu128 torch and its CUDA libraries weigh several GB installed.
TORCH_MB = int(os.environ.get("BENCH_TORCH_MB", "1536"))
RELEASE, LANE = "0.5.11", "cu128"
MODEL_DIR = "/mnt/models/Qwen3.6-27B"
PYINFRA = Path(sys.executable).parent / "pyinfra"
TIMER = (
    "import subprocess, sys, time; t = time.monotonic(); "
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(time.monotonic() - t)"
)
# Only the gate and the engine step, so that later steps do not count.
ENGINE_DEPLOY = """\
from pyinfra.context import host, state

from operations.steps.engine import install_engine
from operations.runtime.plan_step import plan_or_refuse

report = plan_or_refuse(state, host)
if report is not None:
    install_engine(report)
"""


def main() -> int:
    if os.geteuid() != 0:
        print("engine_bench: needs root (systemd-nspawn testbed); skipped")
        return 0
    work = Path(tempfile.mkdtemp(prefix="engine-bench-"))
    bed = Testbed(ensure_testbed())
    try:
        wheelhouse = work / "wheelhouse"
        built = wheels.release_wheels(wheelhouse, RELEASE, LANE, TORCH_MB * 2**20)
        for extra in [uv_wheel(), *support_wheels(work / "graph", RELEASE)]:
            shutil.copyfile(extra, wheelhouse / extra.name)
        # The lane's compiler archives (the double of NVIDIA's), offline beside the wheelhouse.
        redist = cuda_redist.build(work / "nvidia-redist", LANE)
        cuda_redist.flat(redist, work / "cuda-redist")
        config = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})
        (c,) = bed.boot(ContainerSpec(extra_files={f"{MODEL_DIR}/config.json": config}))
        # The baseline's copy of the wheels goes straight onto the container's disk.
        shutil.copytree(wheelhouse, c.root / "root/wheelhouse")
        settings = load("bench", [Layer("bench", {"model_source": MODEL_DIR})])
        spec = engine_spec(settings, kbmod.load())
        deploy_file = work / "engine_deploy.py"
        deploy_file.write_text(ENGINE_DEPLOY)

        def sh(cmd: str) -> str:
            rc, out, err = c.ssh_run(cmd, timeout=900)
            if rc != 0:
                raise RuntimeError(f"{cmd}: {err}")
            return out

        def timed_inside(cmd: str) -> float:
            return float(sh(shlex.join(["python3", "-c", TIMER, "sh", "-c", cmd])))

        def engine_run(engine_root: str, lock_dir: Path) -> float:
            data = {
                "model_source": MODEL_DIR,
                "dp_size": 1,
                "engine_root": engine_root,
                "engine_lock_dir": str(lock_dir),
                "wheelhouse": str(wheelhouse),
                "cuda_redist_manifest": str(redist.manifest),
                "sglang_version": RELEASE,
            }
            inventory = inventory_file(work, {c: data})
            start = time.monotonic()
            proc = subprocess.run(
                [str(PYINFRA), "-y", str(inventory), str(deploy_file)],
                capture_output=True,
                text=True,
                timeout=900,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=False,
            )
            elapsed = time.monotonic() - start
            if proc.returncode != 0:
                raise RuntimeError(f"engine deploy failed:\n{proc.stdout[-3000:]}{proc.stderr}")
            return elapsed

        pip_fresh, pip_again, fresh, from_lock, converged, reinstall = [], [], [], [], [], []
        for i in range(ROUNDS):
            locks = work / f"locks-{i}"
            fresh.append(engine_run(f"/opt/bench-{i}", locks))
            if not any(locks.glob("*.lock")):
                raise RuntimeError(f"the first run recorded no lock under {locks}")
            # pip installs the same set: the lock's packages, exact versions, --no-deps (pip
            # has no overrides, so sglang's own cuda-python>=13.0 would otherwise refuse the
            # CUDA 12 lane's 12.9.4; the engine's resolve is measured in `engine fresh`).
            locked = tomllib.loads(next(locks.glob("*.lock")).read_text())
            reqs = " ".join(
                shlex.quote(f"{p['name']}=={p['version']}")
                for p in locked["package"]
                if "wheels" in p
            )
            venv = f"/root/pip-bench-{i}"
            install = (
                f"{venv}/bin/pip install --disable-pip-version-check --no-index --no-deps "
                f"--find-links /root/wheelhouse {reqs}"
            )
            pip_fresh.append(timed_inside(f"python3 -m venv {venv} && {install}"))
            pip_again.append(timed_inside(install))
            from_lock.append(engine_run(f"/opt/bench-{i}-lock", locks))
            converged.append(engine_run(f"/opt/bench-{i}", locks))
            sh(f"rm -rf /opt/bench-{i}/envs/{spec.name}")
            reinstall.append(engine_run(f"/opt/bench-{i}", locks))

        size_mb = sum(p.stat().st_size for p in built.values()) / 2**20
        print(
            f"engine_bench: {len(built)} wheels of sglang {RELEASE}/{LANE}, {size_mb:.0f} MB, "
            f"median of {ROUNDS} rounds"
        )
        med = {
            k: statistics.median(v)
            for k, v in {
                "pip fresh": pip_fresh,
                "pip again": pip_again,
                "engine fresh": fresh,
                "engine from lock": from_lock,
                "engine converged": converged,
                "engine reinstall": reinstall,
            }.items()
        }
        for name, value in med.items():
            print(f"  {name:<17} {value:7.2f} s")
        for top, bottom in (
            ("engine fresh", "pip fresh"),
            ("engine from lock", "engine fresh"),
            ("engine converged", "pip fresh"),
            ("engine converged", "pip again"),
            ("engine reinstall", "pip fresh"),
        ):
            print(f"  ratio {top} / {bottom}: {med[top] / med[bottom]:.2f}")
        return 0
    finally:
        bed.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
