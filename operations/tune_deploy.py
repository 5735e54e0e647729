"""Tune serving hosts: `python -m operations.tune INVENTORY` runs `pyinfra -y INVENTORY
operations/tune_deploy.py --data deploy_lock_wait_s=0` (operations/cli/tune.py).

The plan is the deploy's (plan_or_refuse), under the deploy lock: a host a deploy holds is
refused at once, and a tune holds off a deploy while it runs. Then the tune's own plan
(operations/plan/tune_plan.py: the rank, why, the candidates, the estimate, whether the rank
stays behind a router) is said before anything starts, and the tune step
(operations/steps/tune.py) runs it. With pyinfra's --dry nothing runs: the plan is the preview.
The budget, the latency bounds and --fresh come from the command (SGLANG_TUNE_BUDGET_S,
SGLANG_TUNE_MAX_TTFT_MS, SGLANG_TUNE_MAX_ITL_MS, SGLANG_TUNE_FRESH, set and checked by
operations/cli/tune.py).
"""

import os

from pyinfra import logger
from pyinfra.context import host, state

from operations.runtime import deploy_lock

lock = deploy_lock.ask(state, host)

from operations import kb as kbmod  # noqa: E402
from operations.plan import resolver  # noqa: E402
from operations.plan.serve_plan import file_digests  # noqa: E402
from operations.plan.tune_plan import DEFAULT_BUDGET_S, touched, tune_plan  # noqa: E402
from operations.runtime.host_lines import host_text  # noqa: E402
from operations.runtime.inventory import refuse  # noqa: E402
from operations.runtime.plan_step import plan_or_refuse  # noqa: E402
from operations.steps.tune import tune  # noqa: E402

report = plan_or_refuse(state, host) if lock.taken() else None
serving = report.serving if report is not None else None
if (
    report is not None
    and report.serve is not None
    and report.resolver_facts is not None
    and serving is not None
):
    facts = report.resolver_facts
    knowledge = kbmod.load()
    budget = int(os.environ.get("SGLANG_TUNE_BUDGET_S") or DEFAULT_BUDGET_S)
    ttft, itl = (os.environ.get(f"SGLANG_TUNE_MAX_{k}_MS") for k in ("TTFT", "ITL"))
    serve = report.serve
    decided = tune_plan(
        report.settings,
        report.plan.ranks,
        serving,
        {r.rank for r in touched(serve.roll)} | set(serve.roll.pending) | set(serve.roll.remove),
        serve.router_restart,
        report.drain is not None,
        kbmod.load_throughput().tune,
        lambda s: resolver.resolve(s, facts, knowledge),
        file_digests(serving),
        budget,
        (float(ttft) if ttft else None, float(itl) if itl else None),
        os.environ.get("SGLANG_TUNE_FRESH") == "1",
    )
    if decided.errors:
        refuse(state, host, "\n".join(decided.errors))
    else:
        said = [
            f"tune: {decided.why_rank}",
            f"tune: {decided.service}",
            f"tune: {decided.estimate}",
            *(
                f"tune: candidate {c.name}"
                + (f" (FAILS: {c.refused})" if c.refused else "")
                + ("" if c.unit is not None or c.refused else " (as it serves, the baseline)")
                for c in decided.candidates
            ),
        ]
        for line in said:
            logger.info(host_text(host, line))
        tune(report, decided)
