"""Bring a GPU host from bare to serving: `pyinfra INVENTORY deploy.py [--dry]`.

Steps, in order, each converging (a converged host reports no change):
  1. gate (operations/runtime/plan_step.py): settings checked for every host, facts gathered,
     preflight and the resolved plan printed; a host that fails gets no change at all.
  2. engine (operations/steps/engine.py): the pinned SGLang for the host's CUDA lane.
  3. model (operations/steps/model.py): the weights staged in /dev/shm.
  4. serve (operations/steps/serve.py): one systemd unit per rank, health-gated; the router.
  5. smoke (operations/steps/smoke.py): each rank this run (re)started, and the router, answers
     a chat request as a client sends it (API key, served model name); off with
     smoke_requests: false.
  6. throughput (operations/steps/throughput.py): after a run that (re)started ranks, SGLang's
     own benchmark client measures the host, a record is kept and a slower run fails the
     deploy; throughput_check: after_change | always | off.
  7. record (operations/steps/record.py): the toolkit version that deployed the host, written
     only when every step before it succeeded (/etc/sglang/toolkit.json).
"""

import sys

from pyinfra.context import host, state

from operations.runtime import deploy_lock

# The simulated CT200 (inventory/demo.py) answers facts only: a real run is refused up front.
if host.data.get("_demo") and "--dry" not in sys.argv:
    from operations.runtime.inventory import refuse

    refuse(
        state,
        host,
        f"{host.data.get('_demo')} is simulated: nothing can be installed on it; preview the "
        "deploy with --dry (`.venv/bin/pyinfra inventory/demo.py deploy.py --dry`)",
    )

# One deploy per host at a time: the lock is asked for before the plan's first fact, and the
# host takes it while the controller imports the rest of the toolkit
# (operations/runtime/deploy_lock.py).
lock = deploy_lock.ask(state, host)

from operations.runtime.plan_step import plan_or_refuse  # noqa: E402
from operations.steps.engine import install_engine  # noqa: E402
from operations.steps.model import stage_model  # noqa: E402
from operations.steps.record import record_version  # noqa: E402
from operations.steps.serve import serve  # noqa: E402
from operations.steps.smoke import smoke  # noqa: E402
from operations.steps.throughput import throughput  # noqa: E402

report = plan_or_refuse(state, host) if lock.taken() else None
if report is not None:
    install_engine(report)
    stage_model(report)
    # A rank restarts when its unit changed: the unit names its engine and model copy by path.
    serve(report)
    # Healthy is not yet serving: a client's request must get this model's answer.
    smoke(report)
    # Serving is not yet serving fast: the engine's own client measures it.
    throughput(report)
    # Last: the toolkit version, recorded only when every step before it succeeded.
    record_version(report)
