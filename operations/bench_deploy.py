"""Measure serving hosts on demand: `python -m operations.bench INVENTORY` runs `pyinfra -y
INVENTORY operations/bench_deploy.py --data throughput_check=always --data deploy_lock_wait_s=0`.

The deploy's throughput step alone (operations/steps/throughput.py), under the deploy lock: a
host a deploy holds is refused at once, and a bench holds off a deploy while it measures. The
plan is the deploy's (plan_or_refuse): a host its checks refuse is measured not at all, nor one
whose ranks or router this inventory would restart (throughput_plan.BENCH_REFUSAL: it is not
deployed yet). Nothing but the benchmark script (shipped) and the record (appended) changes on
the host.
"""

from pyinfra.context import host, state

from operations.runtime import deploy_lock

lock = deploy_lock.ask(state, host)

from operations.plan.throughput_plan import BENCH_REFUSAL  # noqa: E402
from operations.runtime.inventory import refuse  # noqa: E402
from operations.runtime.plan_step import plan_or_refuse  # noqa: E402
from operations.steps.throughput import throughput  # noqa: E402

report = plan_or_refuse(state, host) if lock.taken() else None
if report is not None and report.throughput is not None and report.throughput.serving_changes:
    refuse(state, host, BENCH_REFUSAL)
elif report is not None:
    throughput(report)
