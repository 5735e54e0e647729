"""The inventory's settings, checked once per run, and a host refused before any change.

Shared by the deploy lock (deploy.py's first step), the gate and the Proxmox deploy. It imports
no more than the settings need: the lock is asked for before the rest of the toolkit is
imported (deploy.py), and answered meanwhile.

A refused host is not an operation: it is failed in pyinfra's own state while deploy.py loads,
with every reason logged. pyinfra's CLI then exits 1 at the end of the run (it exits non-zero
whenever `state.failed_hosts` is not empty, `--dry` included), the refusal is no change in its
table, and it is no host to confirm: when no host is left, the run ends here, before pyinfra's
"Press enter to execute" prompt, with exit status 1.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State

from operations import settings as settings_mod

# Settings of the whole inventory, loaded once per pyinfra run (deploy.py runs once per host):
# (settings by host, problems of every host).
_inventory_settings: dict[int, tuple[list[tuple[str, settings_mod.Settings]], list[str]]] = {}


def inventory_settings(state: State) -> list[tuple[str, settings_mod.Settings]]:
    """Every host's settings, checked all at once before the first fact is gathered. Any
    problem ends the run: each is logged once, one line naming the host and the key, and the
    run exits 1 with nothing changed."""
    if id(state) not in _inventory_settings:
        loaded, problems = settings_mod.load_inventory(state.inventory)
        _inventory_settings[id(state)] = (list(loaded.items()), problems)
        if problems:
            logger.error("invalid settings, nothing was changed:")
            for problem in problems:
                logger.error(f"  {problem}")
    everyone, problems = _inventory_settings[id(state)]
    if problems:
        for host in list(state.inventory):
            _fail(state, host)
        _stop_if_none_left(state)
    return everyone


def _fail(state: State, host: Host) -> None:
    """Fail `host` as pyinfra fails a host, without `State.fail_hosts`: that one prompts
    "One of more hosts failed, continue?" without -y, and raises "No hosts remaining!" (logged
    as a pyinfra error at this file's line) when the last host fails."""
    state.failed_hosts.add(host)
    state.active_hosts.discard(host)


def _stop_if_none_left(state: State) -> None:
    """End the run (exit status 1) when every host is refused: nothing is left to show, to
    confirm or to run. Raised in deploy.py's greenlet, gevent hands SystemExit to the main one,
    which exits through pyinfra's own `finally` (hosts disconnected)."""
    if not state.active_hosts:
        raise SystemExit(1)


def refuse(state: State, host: Host, summary: str) -> None:
    """Stop `host` here, before any change: every reason is logged (a first line, then one per
    line) and the host is failed; nothing is queued for it."""
    first, *rest = summary.splitlines() or [""]
    logger.error(f"{host.print_prefix}refused: {first}")
    for line in rest:
        logger.error(f"{host.print_prefix}  {line}")
    _fail(state, host)
    _stop_if_none_left(state)
