"""Step 5 of the deploy: the ranks this run (re)started answer a chat request as a client sees it.

/health says a server is up; a client asks more: does it answer /v1/chat/completions for *this*
model with *this* key? After the serve step, each rank the step started or rolled gets one
request (GET /v1/models must list the served name, then one chat completion), and on the
router's host a few go through the router, all sent on the host by the shipped script
(programs/smoke.py) with the engine environment's httpx (the openai client's transport). Each asks
"What is A + B? Reply with the number only." with two 3-digit integers drawn on the host for
that request (greedy, thinking off through the chat template), and the reply must hold the sum.
A wrong answer (a wrong or missing sum, an empty or malformed body, another model's name, an
error status, no answer) fails the deploy, naming the rank, the question and the answer (masked
as journals are) with its journal tail. A run that restarted nothing asks nothing and
changes nothing. `smoke_requests: false` turns it off; the script is shipped either way, for
`python -m operations.status --probe`.

Nothing is sent to a listener that is not the service user's or whose unit is not active (the
script checks each before every request, programs/smoke.py): the step fails naming the port and its
owner.
"""

from __future__ import annotations

import shlex

from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from operations import layout
from operations.plan.host_plan import HostReport
from operations.plan.smoke_plan import ROUTER_TARGET
from operations.runtime.host_call import Commands
from operations.steps.host_files import put_planned

SMOKE_SCRIPT = layout.SMOKE_SCRIPT


@operation(is_idempotent=False)
def smoke_requests(
    python: str,
    model: str,
    timeout_s: int,
    targets: list[str],
    service_user: str,
    router_workers: list[str] | None = None,
) -> Commands:
    """
    Ask each target a chat question as a client does; fail with the rank's journal tail.

    + python: an engine environment's interpreter (it has httpx, through openai)
    + model: the served model name
    + timeout_s: each request's timeout
    + targets: NAME=URL[*COUNT] (see operations/programs/smoke.py); none: nothing to ask
    + service_user: only its listeners, of active units, are asked (and sent the key)
    + router_workers: UNIT=URL of this host's ranks the router forwards the key to
    """
    if not targets:
        host.noop("no rank or router (re)started in this run: nothing to ask")
        return
    words = [python, SMOKE_SCRIPT, "--model", model, "--timeout", str(timeout_s)]
    # The script reads the key from the file (root-only); it never passes through argv.
    words += ["--key-file", layout.SECRETS_FILE, "--service-user", service_user]
    if any(t.startswith(f"{ROUTER_TARGET}=") for t in targets):
        words += ["--unit", f"{ROUTER_TARGET}={layout.ROUTER_UNIT}"]
        for worker in router_workers or []:
            words += ["--router-worker", worker]
    words += ["--journal", *targets]
    yield shlex.join(words)


def smoke(report: HostReport) -> None:
    """Ship the script (unless the serve step shipped it for a drained batch); ask what the
    plan says this run (re)started (ServePlan.smoke)."""
    s = report.settings
    decided = report.serve
    if decided is None:
        raise OperationError("the smoke step needs the plan's ServePlan (host_plan)")
    for file in decided.smoke_files:
        put_planned(file)
    if not s.smoke_requests:
        return
    asked = decided.smoke
    smoke_requests(
        # One name on every host: pyinfra joins differing names of one operation in its output.
        name="Smoke | chat requests",
        python=asked.python,
        model=s.model_name,
        timeout_s=s.smoke_timeout_s,
        targets=asked.targets,
        service_user=s.service_user,
        router_workers=asked.ranks_behind_router,
    )
