"""deploy.py's gate and model step only: the e2e tests of staging run the production code path
without the engine step, which needs a package index the testbed does not have."""

from pyinfra.context import host, state

from operations.deploy_lock import lock_or_refuse
from operations.gate import plan_or_refuse
from operations.model import stage_model

report = plan_or_refuse(state, host) if lock_or_refuse(state, host) else None
if report is not None:
    stage_model(report)
