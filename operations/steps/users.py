"""The servers' system user, made by the engine step (before its check on the GPUs, which runs
as that user) when this run builds the engine, else by the model step (the staged copy is
readable by its group only): whichever runs first, the plan says which (engine_plan.py,
model_plan.py)."""

from __future__ import annotations

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from operations import layout
from operations.runtime.host_call import Commands


@operation()
def service_user(user: str, make: bool) -> Commands:
    """
    A system user and group for the servers: no login, no root, a home for caches.

    + user: the name
    + make: the plan's word: it does not exist yet (the ServingState fact read it)
    """
    if not make:
        host.noop(f"user {user} exists")
        return
    # `id -u` first: useradd fails on a user that exists, and one may be made (by hand)
    # between the fact and this command.
    yield StringCommand(
        *("id", "-u", QuoteString(user), ">/dev/null", "2>&1", "||"),
        "useradd",
        "--system",
        "--user-group",
        "--create-home",
        "--home-dir",
        QuoteString(layout.service_home(user)),
        "--shell",
        "/usr/sbin/nologin",
        QuoteString(user),
    )
