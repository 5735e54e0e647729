"""Where an inventory's addresses come from, and what to tell the user when a host cannot be
reached: the inventories read them from the environment (CT200_HOST, PVE_HOST, ...), so no
address lives in the repo, and a run without them tries a default name.

An inventory calls `from_environment` for each address; when that host cannot be reached,
`operations.plan` and `operations.status` add the hint to their one line, and under
pyinfra's
CLI an unset variable is logged up front.
"""

from __future__ import annotations

import os

from pyinfra import logger

from operations.runtime.pyinfra_internals import under_cli

# What to do when a host cannot be reached, by inventory host name.
_HINTS: dict[str, str] = {}


def from_environment(variable: str, default: str, what: str, host: str | None = None) -> str:
    """The value of `variable`, else `default`. `what` says what it is ("the container's address
    or SSH alias"); `host` is the inventory name of the host it reaches (the value itself when
    the address is the name)."""
    value = os.environ.get(variable)
    name = host or (value or default)
    if value is None:
        hint = (
            f"{variable} is not set, so {default!r} was tried: export {variable}=... ({what}), "
            "or make it an alias in ~/.ssh/config"
        )
        _tell_pyinfra(variable, default, what)
    else:
        hint = f"{variable}={value}: check that it is {what} and that ssh reaches it"
    _HINTS[name] = hint
    return value or default


def hint(host_name: str) -> str | None:
    """What to do when `host_name` cannot be reached; None when its inventory says nothing."""
    return _HINTS.get(host_name)


def _tell_pyinfra(variable: str, default: str, what: str) -> None:
    """Under pyinfra's CLI (the deploy, pve.py) nothing of ours runs between loading the
    inventory and connecting (pyinfra's State.init drops callback handlers added before it), so
    an unset variable is said once, up front; plan and status add the hint to their own line."""
    if under_cli():
        logger.warning(
            f"{variable} is not set: connecting to {default!r} ({what}; export {variable}=... "
            "otherwise)"
        )
