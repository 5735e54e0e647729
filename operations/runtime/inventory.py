"""The inventory session: every command that reads an inventory loads, checks, refuses and
connects through this module, and nothing else calls pyinfra's inventory loading
(tests/unit/test_session.py checks that).

Two doors, one set of rules:

- Under pyinfra's CLI (`pyinfra INVENTORY deploy.py`, `pyinfra inventory/pve.py pve.py`),
  pyinfra has loaded the inventory and connected; `inventory_settings(state)` checks every
  host's settings once per run, and `refuse` stops a host before any change.
- The controller's own commands (`operations.plan`, `.status`, `.releases`, `.lock`) call
  `open_session(path, --data)`: the inventory loaded as pyinfra's CLI loads it (same
  connectors, @fake included), each host's settings checked, then `Session.connect()` and
  `Session.each()`, which visits every host in inventory order under pyinfra's host context
  (pyinfra caches each host's facts for the run: the plan and the status read each fact once).

One line for each mistake, never a traceback: an inventory that is not there, does not load or
names no host is an `InventoryError` (`error: inventory 'PATH' ...`, the same in every
command); a bad setting is the settings module's own line (`HOST: KEY ... accepted ...`), one
per key; a host that cannot be reached is one line naming why, with what to set when its
inventory says (operations/runtime/reach.py), and the other hosts go on where the command allows.

It imports no more than the settings need: the deploy lock is asked for before the rest of the
toolkit is imported (deploy.py), and answered meanwhile; the loading side imports pyinfra's CLI
parts only when called.

A refused host is not an operation: it is failed in pyinfra's own state while deploy.py loads,
with every reason logged. pyinfra's CLI then exits 1 at the end of the run (it exits non-zero
whenever `state.failed_hosts` is not empty, `--dry` included), the refusal is no change in its
table, and it is no host to confirm: when no host is left, the run ends here, before pyinfra's
"Press enter to execute" prompt, with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State

from operations import settings as settings_mod
from operations.runtime.host_lines import host_text
from operations.runtime.pyinfra_internals import connector_data_keys, fail_host

# -- under pyinfra's CLI: deploy.py and pve.py -----------------------------------------------

# Settings of the whole inventory, loaded once per pyinfra run (deploy.py runs once per host):
# (settings by host, problems of every host).
_inventory_settings: dict[int, tuple[list[tuple[str, settings_mod.Settings]], list[str]]] = {}


def inventory_settings(state: State) -> list[tuple[str, settings_mod.Settings]]:
    """Every host's settings, checked all at once before the first fact is gathered. Any
    problem ends the run: each is logged once, one line naming the host and the key, and the
    run exits 1 with nothing changed."""
    if id(state) not in _inventory_settings:
        loaded, problems = settings_mod.load_inventory(state.inventory, connector_data_keys())
        _inventory_settings[id(state)] = (list(loaded.items()), problems)
        if problems:
            logger.error("invalid settings, nothing was changed:")
            for problem in problems:
                logger.error(f"  {problem}")
    everyone, problems = _inventory_settings[id(state)]
    if problems:
        for host in list(state.inventory):
            fail_host(state, host)
        _stop_if_none_left(state)
    return everyone


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
    logger.error(host_text(host, f"refused: {first}"))
    for line in rest:
        logger.error(host_text(host, f"  {line}"))
    fail_host(state, host)
    _stop_if_none_left(state)


# -- the controller's commands: plan, status, releases, lock ---------------------------------


class InventoryError(Exception):
    """The inventory or the command line cannot be used: one line, said as `error: LINE`."""


def inventory_arguments(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line shared by the commands that read an inventory as pyinfra does."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("inventory", help="an inventory file, as pyinfra takes it")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help=DATA_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


# What `--data` means in every command that reads an inventory, said once.
DATA_HELP = (
    "override a setting for every host, as pyinfra's own --data does (repeatable; the value is "
    "read as JSON where it parses, else as text: --data sglang_version=0.5.19)"
)


def parse_data(items: list[str]) -> dict[str, object]:
    """`--data KEY=VALUE` values, parsed as pyinfra's CLI parses them."""
    from pyinfra_cli.util import parse_cli_arg

    data: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InventoryError(f"--data {item!r}: expected KEY=VALUE")
        data[key] = parse_cli_arg(value)
    return data


def load_state(inventory_path: str, override: dict[str, object]) -> State:
    """An initialised pyinfra State, built the way pyinfra's CLI builds it."""
    from pyinfra.api.config import Config
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not Path(inventory_path).exists():
        raise InventoryError(f"inventory {inventory_path!r}: no such file")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    state = State(check_for_changes=False)
    state.cwd = cwd
    ctx_state.set(state)
    try:
        inventory = make_inventory(inventory_path, cwd=cwd, override_data=override)
    except Exception as exc:  # the inventory is the user's file: one line, no traceback
        cause = getattr(exc, "exception", exc)
        raise InventoryError(
            f"inventory {inventory_path!r} could not be loaded: {type(cause).__name__}: "
            f"{' '.join(str(cause).split())}"
        ) from None
    if not list(inventory):
        raise InventoryError(
            f"inventory {inventory_path!r} names no hosts; accepted: a module with a list of "
            "hosts, e.g. ct200 = [('ct200', {...})] (inventory/ct200.py)"
        )
    ctx_inventory.set(inventory)
    config = Config()
    # One unreachable host must not stop the others.
    config.FAIL_PERCENT = 100
    state.init(inventory, config)
    return state


def one_line(error: BaseException | str) -> str:
    """An error's message in one line (pyinfra's connect errors span several)."""
    text = error.args[0] if isinstance(error, BaseException) and error.args else error
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(" ".join(lines).split()) or type(error).__name__


def quiet_pyinfra() -> None:
    """pyinfra logs connection and fact failures itself; the commands print one line per host
    instead (the status table reads each host's failure as its own result)."""
    pyinfra_logger = logging.getLogger("pyinfra")
    pyinfra_logger.addHandler(logging.NullHandler())
    pyinfra_logger.propagate = False


@dataclass(frozen=True)
class Visit:
    """One inventory host as a command meets it: its settings' problems (the settings
    module's lines), else why it was not reached, else its settings (and it is the current
    pyinfra host while the visit lasts)."""

    host: Host
    problems: list[str] = field(default_factory=list)
    unreachable: str | None = None
    settings: settings_mod.Settings | None = None

    @property
    def name(self) -> str:
        return self.host.name


@dataclass
class Session:
    """An inventory loaded and checked; `connect()` reaches the hosts whose settings pass."""

    path: str
    state: State
    hosts: list[Host]
    # Hosts whose settings pass, by name, in inventory order.
    settings: dict[str, settings_mod.Settings]
    # Each host's settings problems, one line per bad key, by host name.
    problems: dict[str, list[str]]
    unreachable: dict[str, str] = field(default_factory=dict)
    connected: bool = False

    @property
    def everyone(self) -> list[tuple[str, settings_mod.Settings]]:
        """Every host's settings that pass (the router's worker list is made of them)."""
        return list(self.settings.items())

    @property
    def all_problems(self) -> list[str]:
        return [p for problems in self.problems.values() for p in problems]

    def connect(self) -> None:
        """Connect every host whose settings pass (none when none does); why each one that
        could not be reached was not, in one line. Never raises for a host: pyinfra's "No
        hosts remaining!" (every host unreachable) is each host's own line."""
        from pyinfra.api.connect import connect_all
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.api.state import BaseStateCallback

        from operations.runtime import reach

        self.connected = True
        if not self.settings:
            return
        why = self.unreachable

        class OnConnect(BaseStateCallback):
            @staticmethod
            def host_connect_error(state: State, host: Host, error: BaseException) -> None:
                what = reach.hint(host.name)
                why[host.name] = one_line(error) + (f"; {what}" if what else "")

        self.state.add_callback_handler(OnConnect())
        # A host whose settings do not pass is not contacted at all.
        self.state.limit_hosts = [h for h in self.hosts if h.name in self.settings]
        # pyinfra logs each failure itself; the one line above is what is shown, once.
        pyinfra_logger = logging.getLogger("pyinfra")
        was = pyinfra_logger.disabled
        pyinfra_logger.disabled = True
        try:
            with contextlib.suppress(PyinfraError):
                connect_all(self.state)
        finally:
            pyinfra_logger.disabled = was

    def each(self) -> Iterator[Visit]:
        """Every host, in inventory order; a reached host is pyinfra's current host while the
        caller handles its visit (its facts are gathered and cached as deploy.py's are)."""
        from pyinfra.context import ctx_host

        for host in self.hosts:
            if host.name in self.problems:
                yield Visit(host, problems=self.problems[host.name])
                continue
            if self.connected and host not in self.state.activated_hosts:
                why = self.unreachable.get(host.name, "could not connect")
                yield Visit(host, unreachable=why)
                continue
            with ctx_host.use(host):
                yield Visit(host, settings=self.settings[host.name])


def open_session(inventory_path: str, override: dict[str, object]) -> Session:
    """The inventory at `inventory_path` (with --data `override`) loaded, and every host's
    settings checked before any host is contacted. InventoryError: one line."""
    state = load_state(inventory_path, override)
    hosts = list(state.inventory)
    loaded, problems = settings_mod.load_inventory(hosts, connector_data_keys())
    by_host: dict[str, list[str]] = {}
    names = sorted((h.name for h in hosts), key=len, reverse=True)
    for problem in problems:
        # Every line of the settings module starts "HOST: ".
        name = next((n for n in names if problem.startswith(f"{n}: ")), problem.split(":")[0])
        by_host.setdefault(name, []).append(problem)
    good = {name: s for name, s in loaded.items() if name not in by_host}
    return Session(inventory_path, state, hosts, good, by_host)


def said(error: InventoryError) -> str:
    """How every command prints an InventoryError."""
    return f"error: {error}"
