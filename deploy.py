"""Bring a GPU host from bare to serving: `pyinfra INVENTORY deploy.py [--dry]`.

Steps, in order, each converging (a converged host reports no change):
  1. gate: settings checked for every host, facts gathered, preflight and plan printed;
     a host that fails gets no change at all.
"""

from pyinfra.context import host, state

from operations.gate import plan_or_refuse

report = plan_or_refuse(state, host)
