"""Every use of pyinfra beyond its documented API, in one place (the other is the inventory
session, operations/runtime/inventory.py, which loads an inventory as pyinfra's CLI does).

pyinfra's documented API is what its docs cover: operations and facts, `pyinfra.context`'s
`host` and `state`, `host.noop`, `host.get_fact`, FactBase, @operation (and `yield from
op._inner(...)` inside an operation), StringCommand, QuoteString, the connectors by name. What
the toolkit needs beyond that is a function here, named for what it does for us; each has a test
in tests/unit/test_pyinfra_contract.py that reads the pyinfra source it relies on (READ_IN) and
fails naming the function here when pyinfra changes it. pyinfra is pinned to that range in
pyproject.toml, and so are paramiko and gevent, which two of these reach through it.

Nothing of the toolkit is imported here, and nothing heavy: deploy.py asks for the deploy lock
through this module before it imports the rest (tests/unit/test_lock_first.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

import gevent
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, ConnectorArguments, pop_global_arguments
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import make_unix_command_for_host
from pyinfra.context import ctx_config, ctx_host
from typing_extensions import override

if TYPE_CHECKING:
    from paramiko import Transport
    from pyinfra.api.host import Host
    from pyinfra.api.state import BaseStateCallback, State

# The pyinfra release whose source these uses were read in (pyproject.toml pins its minor).
READ_IN = "3.10.0"


# -- commands ---------------------------------------------------------------------------------


def command_for_host(state: State, host: Host, command: StringCommand) -> str:
    """`command` as pyinfra would run it on `host` for a fact: wrapped for the host data's
    sudo/su/doas settings (pyinfra/api/arguments.py pop_global_arguments,
    pyinfra/connectors/util.py make_unix_command_for_host)."""
    arguments, _ = pop_global_arguments(state, host, {})
    connector_args = {
        k: v
        for k, v in arguments.items()
        if k in CONNECTOR_ARGUMENT_KEYS
        and k not in ("_stdin", "_timeout", "_get_pty", "_success_exit_codes")
    }
    wrapped: str = make_unix_command_for_host(
        state, host, command, **connector_args
    ).get_raw_value()
    return wrapped


class HostCall(FunctionCommand):
    """A callback called as function(state, host, arguments, *args, **kwargs), `arguments`
    being the connector arguments the operation's StringCommands get
    (operations/runtime/host_call.py says why; pyinfra/api/command.py FunctionCommand.execute)."""

    @override
    def execute(self, state: State, host: Host, connector_arguments: ConnectorArguments) -> Any:
        arguments = ConnectorArguments(**connector_arguments)  # a copy: the callback's own
        arguments.update(self.connector_arguments)
        return self.function(state, host, arguments, *self.args, **self.kwargs)


def first_command(op: Any, **arguments: Any) -> str:
    """The first command an @operation yields for `arguments`, outside any operation: its
    wrapped generator (pyinfra/api/operation.py `decorated_func._inner = func`) run to its
    first yield."""
    return str(next(op._inner(**arguments)))


def temp_filename(host: Host) -> str:
    """A unique name in the host's temporary directory, as pyinfra's files.put makes one for
    an upload (pyinfra/api/host.py Host.get_temp_filename)."""
    name: str = host.get_temp_filename()
    return name


def color_diff(current: list[str], desired: list[str]) -> Iterator[str]:
    """The lines `--diff` shows for a file going from `current` to `desired`, as pyinfra's
    files.put shows them (pyinfra/operations/util/files.py generate_color_diff)."""
    from pyinfra.operations.util.files import generate_color_diff

    yield from generate_color_diff(current, desired)


# -- the run's state --------------------------------------------------------------------------


def fail_host(state: State, host: Host) -> None:
    """Fail `host` as pyinfra fails a host, without `State.fail_hosts`: that one prompts "One
    of more hosts failed, continue?" without -y, and raises "No hosts remaining!" when the last
    host fails (pyinfra/api/state.py: failed_hosts and active_hosts are sets of Host)."""
    state.failed_hosts.add(host)
    state.active_hosts.discard(host)


def add_callback_once(state: State, handler: BaseStateCallback) -> None:
    """`handler` added to the run's callbacks unless one of its class is there already
    (pyinfra/api/state.py State.callback_handlers)."""
    if not any(type(h) is type(handler) for h in state.callback_handlers):
        state.add_callback_handler(handler)


@cache
def connector_data_keys() -> frozenset[str]:
    """Host data keys that pyinfra's connectors read (each connector's `data_meta`, from the
    registry pyinfra/api/connectors.py get_all_connectors). Read once a process: the inventory
    session hands them to the settings check (settings.load_inventory), which judges every
    other key."""
    from pyinfra.api.connectors import get_all_connectors

    keys: set[str] = set()
    for connector in get_all_connectors().values():
        keys.update(getattr(connector, "data_meta", {}) or {})
    return frozenset(keys)


def under_cli() -> bool:
    """True inside pyinfra's CLI (`pyinfra INVENTORY deploy.py`), which sets `pyinfra.is_cli`
    (pyinfra_cli/main.py)."""
    import pyinfra

    return bool(getattr(pyinfra, "is_cli", False))


# -- a host's SSH connection ------------------------------------------------------------------


def ssh_transport(host: Host) -> Transport | None:
    """The paramiko Transport of `host`'s SSH connection; None for another connector or before
    it connects (pyinfra/connectors/ssh.py SSHConnector.client)."""
    connector = host.connector
    if not isinstance(connector, SSHConnector) or connector.client is None:
        return None
    return connector.client.get_transport()


# -- greenlets --------------------------------------------------------------------------------


def current_host() -> Host:
    """The host deploy code runs for, the object itself (pyinfra.context's `host` is a proxy,
    which cannot key a weak dictionary): pyinfra/context.py ctx_host.get()."""
    target: Host = ctx_host.get()
    return target


def at_once(*calls: Callable[[], Any]) -> tuple[Any, ...]:
    """Every call at the same time, each in a greenlet of its own under the current host and
    config (pyinfra keeps both greenlet-local: pyinfra/context.py, over gevent.local), the first
    in this one. Their answers in order; the first exception, in the calls' order, is raised
    once all have ended, as if called in turn."""
    target, config = ctx_host.get(), ctx_config.get()

    def in_context(call: Callable[[], Any]) -> Any:
        with ctx_host.use(target), ctx_config.use(config):
            return call()

    first, *rest = calls
    others = [gevent.spawn(in_context, call) for call in rest]
    try:
        one = first()
    finally:
        # Their answers or their exceptions; none left running past this call.
        gevent.joinall(others)
    return (one, *(other.get() for other in others))


# -- pyinfra's log ----------------------------------------------------------------------------

# How pyinfra's connectors begin a ConnectError's message (pyinfra/connectors/ssh.py, util.py).
CONNECT_ERRORS = ("Could not connect", "Could not resolve hostname", "SSH error", "EOF error")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class _ConnectErrors(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.rewrites: dict[str, Callable[[str], str]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = _plain(str(record.msg))
        if not any(e in message for e in CONNECT_ERRORS):
            return True
        for name, rewrite in self.rewrites.items():
            if f"[{name}]" in message:
                record.msg = rewrite(message.split(f"[{name}]", 1)[1].strip())
                record.args = ()
        return True


def rewrite_connect_errors(name: str, rewrite: Callable[[str], str]) -> None:
    """pyinfra logs a host it could not connect as "[NAME] ERROR" (pyinfra/api/host.py
    Host.connect, `print_prefix` and the ConnectError's text): for the host named `name`, that
    line becomes `rewrite(ERROR)`. Under pyinfra's CLI no callback of ours is registered before
    it connects (State.init drops them), so its log line is where to say it."""
    pyinfra_logger = logging.getLogger("pyinfra")
    found = [f for f in pyinfra_logger.filters if isinstance(f, _ConnectErrors)]
    errors = found[0] if found else _ConnectErrors()
    if not found:
        pyinfra_logger.addFilter(errors)
    errors.rewrites[name] = rewrite
