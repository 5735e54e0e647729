"""What we rely on in pyinfra beyond its documented API, one test per use (issue 29, point 6;
issue 36, point 5).

Every such use lives in operations/runtime/pyinfra_internals.py or the inventory session
(operations/runtime/inventory.py); tests/unit/test_pyinfra_door.py keeps it so. pyinfra is pinned
to the range in pyproject.toml (`pyinfra>=3.10,<3.11`), and so are paramiko and gevent, which
two uses reach through it; a newer one that moves a use fails here by name, with the function of
ours that needs it, rather than in a deploy. Each test names the pyinfra source it copies, read
in pyinfra READ_IN (3.10.0).
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import gevent
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from pyinfra.api.command import FunctionCommand
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import State
from pyinfra.context import ctx_config, ctx_host
from pyinfra.operations import files, server

from operations.runtime import pyinfra_internals as internals
from operations.runtime.host_call import HostCall

ROOT = Path(__file__).resolve().parents[2]


def _declared(name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == name:
            return requirement
    raise AssertionError(f"pyproject.toml declares no {name}")


def _state() -> State:
    inventory = Inventory((["@local"], {}))
    return State(inventory=inventory, config=Config())


@pytest.mark.parametrize("name", ["pyinfra", "paramiko", "gevent"])
def test_the_installed_release_is_in_the_range_we_test(name: str) -> None:
    from importlib.metadata import version

    installed = Version(version(name))
    pinned = _declared(name)
    upper = [s for s in pinned.specifier if s.operator in ("<", "<=", "==", "~=")]
    assert upper, f"{name} must be bounded above to the range these tests cover"
    assert installed in pinned.specifier, (
        f"{name} {installed} is outside {pinned.specifier}: run this file's tests against it and "
        "widen the pin in pyproject.toml only when they pass"
    )


def test_the_uses_were_read_in_the_pinned_pyinfra() -> None:
    assert Version(internals.READ_IN) in _declared("pyinfra").specifier, (
        f"operations/runtime/pyinfra_internals.READ_IN ({internals.READ_IN}) is not in the "
        "pinned range: read each use again in the new pyinfra, then set READ_IN"
    )


def test_imports_of_ours_that_pyinfra_only_brings_along_are_declared() -> None:
    # operations/facts/once.py imports gevent; operations/runtime/host_call.py typing_extensions.
    for name in ("gevent", "typing-extensions"):
        _declared(name)


def test_ctx_host_get_and_use_are_how_a_greenlet_gets_the_host() -> None:
    """pyinfra_internals.current_host is `ctx_host.get()`, and at_once runs each call under
    `ctx_host.use(target)` and `ctx_config.use(config)` (pyinfra/context.py
    ContextManager.get/use; hosts are greenlet-local, LocalContextObject over gevent.local)."""
    state = _state()
    target = next(iter(state.inventory))
    config = state.config
    before = ctx_host.get()
    with ctx_host.use(target), ctx_config.use(config):
        assert ctx_host.get() is target
        assert ctx_config.get() is config
        seen_bare = gevent.spawn(ctx_host.get).get()

        def inside() -> object:
            with ctx_host.use(target):
                return ctx_host.get()

        seen_inside = gevent.spawn(inside).get()
    assert ctx_host.get() is before, "ctx_host.use no longer restores the previous host"
    # A new greenlet sees no host: why once.together wraps every call in ctx_host.use.
    assert seen_bare is None, (
        "pyinfra's host is no longer greenlet-local: pyinfra_internals.at_once can drop its "
        "ctx_host.use wrapper"
    )
    assert seen_inside is target


def test_a_refused_host_is_failed_through_the_state_sets() -> None:
    """pyinfra_internals.fail_host adds the host to `state.failed_hosts` and discards it from
    `state.active_hosts` (pyinfra/api/state.py State.__init__: both are sets of Host) rather
    than State.fail_hosts, which prompts and raises; pyinfra_cli/cli.py exits 1 when
    `state.failed_hosts` is not empty."""
    state = _state()
    assert isinstance(state.failed_hosts, set)
    assert isinstance(state.active_hosts, set)
    assert callable(getattr(state, "fail_hosts", None))
    host = next(iter(state.inventory))
    state.active_hosts.add(host)
    internals.fail_host(state, host)
    assert host in state.failed_hosts and host not in state.active_hosts
    import pyinfra_cli.cli

    assert "and state.failed_hosts:" in inspect.getsource(pyinfra_cli.cli), (
        "pyinfra's CLI no longer reads state.failed_hosts for its exit status: "
        "pyinfra_internals.fail_host must follow"
    )


def test_function_command_execute_is_what_host_call_overrides() -> None:
    """pyinfra_internals.HostCall (operations/runtime/host_call.py says why) overrides
    FunctionCommand.execute(state, host, connector_arguments) and reads .function, .args,
    .kwargs, .connector_arguments (pyinfra/api/command.py FunctionCommand)."""
    parameters = list(inspect.signature(FunctionCommand.execute).parameters)
    assert parameters == ["self", "state", "host", "connector_arguments"], (
        f"FunctionCommand.execute now takes {parameters}: pyinfra_internals.HostCall must follow"
    )

    def callback(state: object, host: object, arguments: object, word: str) -> str:
        return f"{word}:{sorted(dict(arguments))}"  # type: ignore[call-overload]

    command = HostCall(callback, ("hi",), {}, _sudo=True)
    for attribute in ("function", "args", "kwargs", "connector_arguments"):
        assert hasattr(command, attribute), f"FunctionCommand has no .{attribute} any more"
    assert command.execute(None, None, {"_timeout": 5}) == "hi:['_sudo', '_timeout']"  # type: ignore[arg-type]


def test_operations_reuse_others_through_inner() -> None:
    """operations/steps/model.py and engine.py `yield from files.rsync._inner(...)` and
    `put_file._inner(...)` (pyinfra's documented reuse), and pyinfra_internals.first_command
    runs it outside an operation: the wrapped generator pyinfra's @operation keeps
    (pyinfra/api/operation.py, `decorated_func._inner = func`)."""
    assert inspect.isgeneratorfunction(files.rsync._inner)
    assert internals.first_command(server.shell, commands=["echo hi"]) == "echo hi"


def test_operation_meta_did_change_is_a_method() -> None:
    """Gates use `_if=op.did_change`, a bound method (pyinfra/api/operation.py OperationMeta);
    passing it as a value would always be truthy (shared testbed note)."""
    assert inspect.isfunction(OperationMeta.did_change)


@pytest.mark.parametrize("name", ["ctx_host", "ctx_config"])
def test_the_context_managers_we_use_exist(name: str) -> None:
    import pyinfra.context

    manager = getattr(pyinfra.context, name)
    assert callable(manager.get) and callable(manager.use)


def test_an_ssh_hosts_transport_is_reached_through_its_connectors_paramiko_client() -> None:
    """pyinfra_internals.ssh_transport is `host.connector.client.get_transport()`
    (pyinfra/connectors/ssh.py SSHConnector: `client: SSHClient | None`, set in connect()), on
    which operations/runtime/deploy_lock.py opens its channel (paramiko's
    Transport.open_session)."""
    from paramiko import SSHClient, Transport
    from pyinfra.connectors.ssh import SSHConnector

    hints = inspect.get_annotations(SSHConnector, eval_str=False)
    assert "client" in hints and "SSHClient" in str(hints["client"]), (
        "pyinfra's SSHConnector no longer keeps its paramiko client in .client: "
        "pyinfra_internals.ssh_transport must follow"
    )
    assert callable(getattr(SSHClient, "get_transport", None))
    assert callable(getattr(Transport, "open_session", None))


def test_pyinfras_cli_turns_bytecode_writing_off_for_its_process() -> None:
    """operations/__init__.py turns it back on for our package (pyinfra_cli/main.py:
    `sys.dont_write_bytecode = True`); when pyinfra stops doing so, that line can go."""
    import pyinfra_cli.main

    assert "sys.dont_write_bytecode = True" in inspect.getsource(pyinfra_cli.main), (
        "pyinfra's CLI no longer turns bytecode writing off: operations/__init__.py's "
        "sys.dont_write_bytecode line has nothing left to undo"
    )


def test_a_fact_command_is_wrapped_for_the_hosts_sudo_settings() -> None:
    """pyinfra_internals.command_for_host: pyinfra/api/arguments.py pop_global_arguments(state,
    host, kwargs) -> (arguments, keys), CONNECTOR_ARGUMENT_KEYS, and
    pyinfra/connectors/util.py make_unix_command_for_host(state, host, command, **arguments)."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
    from pyinfra.api.command import StringCommand
    from pyinfra.connectors.util import make_unix_command_for_host

    for function, parameters in (
        (pop_global_arguments, ["state", "host", "kwargs"]),
        (make_unix_command_for_host, ["state", "host", "command", "command_arguments"]),
    ):
        found = list(inspect.signature(function).parameters)[: len(parameters)]
        assert found == parameters, (
            f"pyinfra's {function.__name__} now takes {found}: "
            "pyinfra_internals.command_for_host must follow"
        )
    assert {"_sudo", "_sudo_user", "_su_user"} <= set(CONNECTOR_ARGUMENT_KEYS)
    state = State(
        inventory=Inventory((["@local"], {"_sudo": True, "_sudo_user": "ops"})), config=Config()
    )
    host = next(iter(state.inventory))
    wrapped = internals.command_for_host(state, host, StringCommand("id", "-u"))
    assert wrapped.startswith("sudo ") and "-u ops" in wrapped and wrapped.endswith("id -u'"), (
        f"pyinfra wraps a sudo command as {wrapped!r} now: pyinfra_internals.command_for_host"
    )


def test_a_callback_is_added_once_to_the_runs_handlers() -> None:
    """pyinfra_internals.add_callback_once reads `state.callback_handlers` (pyinfra/api/state.py
    State.__init__, a list that add_callback_handler appends to)."""
    from pyinfra.api.state import BaseStateCallback

    class Handler(BaseStateCallback):
        pass

    state = _state()
    assert isinstance(state.callback_handlers, list)
    before = len(state.callback_handlers)
    internals.add_callback_once(state, Handler())
    internals.add_callback_once(state, Handler())
    assert len(state.callback_handlers) == before + 1, (
        "State.add_callback_handler no longer appends to state.callback_handlers: "
        "pyinfra_internals.add_callback_once"
    )


def test_the_connectors_data_keys_come_from_their_registry() -> None:
    """pyinfra_internals.connector_data_keys: pyinfra/api/connectors.py get_all_connectors()
    (name -> connector class) and each connector's `data_meta` (pyinfra/connectors/ssh.py
    connector_data_meta)."""
    keys = internals.connector_data_keys()
    assert {"ssh_hostname", "ssh_user", "ssh_port"} <= keys, (
        f"pyinfra's connectors declare {sorted(keys)}: pyinfra_internals.connector_data_keys"
    )


def test_the_cli_says_it_is_the_cli() -> None:
    """pyinfra_internals.under_cli reads `pyinfra.is_cli` (pyinfra/__init__.py: False;
    pyinfra_cli/main.py sets it True)."""
    import pyinfra
    import pyinfra_cli.main

    assert pyinfra.is_cli is False and internals.under_cli() is False
    assert "pyinfra.is_cli = True" in inspect.getsource(pyinfra_cli.main), (
        "pyinfra's CLI no longer sets pyinfra.is_cli: pyinfra_internals.under_cli"
    )


def test_an_upload_gets_a_temporary_name_on_the_host() -> None:
    """pyinfra_internals.temp_filename: pyinfra/api/host.py Host.get_temp_filename()."""
    state = _state()
    state.config.TEMP_DIR = "/var/tmp/deploy"  # else a fact asks the host for its own
    host = next(iter(state.inventory))
    first, second = internals.temp_filename(host), internals.temp_filename(host)
    assert first.startswith("/var/tmp/deploy/") and first != second, (
        f"Host.get_temp_filename() gave {first!r}, {second!r}: pyinfra_internals.temp_filename"
    )


def test_a_diff_is_shown_as_files_put_shows_it() -> None:
    """pyinfra_internals.color_diff: pyinfra/operations/util/files.py
    generate_color_diff(current_lines, desired_lines), a generator of lines."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in internals.color_diff(["a\n"], ["b\n"])]
    assert "- a" in lines and "+ b" in lines, (
        f"generate_color_diff now yields {lines}: pyinfra_internals.color_diff"
    )


def test_calls_at_once_see_the_host_and_return_in_order() -> None:
    """pyinfra_internals.at_once: gevent.spawn/joinall under ctx_host.use and ctx_config.use
    (pyinfra/context.py), the first exception raised in the calls' order."""
    state = _state()
    target = next(iter(state.inventory))
    with ctx_host.use(target), ctx_config.use(state.config):
        assert internals.current_host() is target
        found = internals.at_once(lambda: 1, lambda: internals.current_host(), lambda: 3)
        assert found == (1, target, 3)

        def fails() -> None:
            raise ValueError("second")

        with pytest.raises(ValueError, match="second"):
            internals.at_once(lambda: 1, fails, lambda: 3)


def test_a_connect_error_is_logged_as_the_host_and_the_error() -> None:
    """pyinfra_internals.rewrite_connect_errors reads pyinfra's line for a host it could not
    connect: `print_prefix` then the ConnectError's text (pyinfra/api/host.py Host.connect),
    which begins with one of CONNECT_ERRORS (pyinfra/connectors/ssh.py, ssh_util.py)."""
    import logging

    from pyinfra.api.host import Host
    from pyinfra.connectors import ssh, ssh_util

    connect = inspect.getsource(Host.connect)
    assert "f\"{self.print_prefix}{format_text(e.args[0], 'red')}\"" in connect, (
        "pyinfra logs a connect error differently: pyinfra_internals.rewrite_connect_errors"
    )
    texts = inspect.getsource(ssh) + inspect.getsource(ssh_util)
    for start in internals.CONNECT_ERRORS:
        assert f'"{start}' in texts, f"pyinfra no longer says {start!r}: CONNECT_ERRORS"

    internals.rewrite_connect_errors("ct9", lambda error: f"[ct9] the node: {error}")
    record = logging.LogRecord(
        "pyinfra", logging.ERROR, "", 0, "\x1b[0m[ct9] Could not connect (x)", (), None
    )
    for found in logging.getLogger("pyinfra").filters:
        assert not isinstance(found, logging.Filter) or found.filter(record)
    assert record.msg == "[ct9] the node: Could not connect (x)"


# -- the inventory session (operations/runtime/inventory.py) ---------------------------------


def test_an_inventory_is_loaded_as_pyinfras_cli_loads_it() -> None:
    """operations/runtime/inventory.load_state calls pyinfra_cli/inventory.py
    make_inventory(path, cwd=, override_data=) and parse_data pyinfra_cli/util.py
    parse_cli_arg(value) (`--data` values: true/false, ints, JSON, else the text); it builds
    State(check_for_changes=False), sets `state.cwd`, ctx_state and ctx_inventory, and
    `state.init(inventory, config)` (pyinfra_cli/cli.py does the same)."""
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import parse_cli_arg

    parameters = set(inspect.signature(make_inventory).parameters)
    assert {"inventory", "cwd", "override_data"} <= parameters, (
        f"make_inventory now takes {sorted(parameters)}: operations/runtime/inventory.load_state"
    )
    assert [parse_cli_arg(v) for v in ("true", "False", "8", '["a"]', "x")] == [
        True,
        False,
        8,
        ["a"],
        "x",
    ], "parse_cli_arg parses --data otherwise: operations/runtime/inventory.parse_data"
    assert "check_for_changes" in inspect.signature(State).parameters
    assert list(inspect.signature(State.init).parameters)[:3] == ["self", "inventory", "config"]
    for manager in (ctx_state, ctx_inventory):
        assert callable(manager.set), "operations/runtime/inventory.load_state sets the context"
    assert hasattr(Config(), "FAIL_PERCENT")


def test_a_session_connects_the_hosts_it_limits_to_and_reads_who_connected() -> None:
    """Session.connect sets `state.limit_hosts` (pyinfra/api/state.py State.is_host_in_limit)
    before pyinfra/api/connect.py connect_all(state), hears BaseStateCallback.host_connect and
    host_connect_error, and Session.each reads `state.activated_hosts` and runs each visit
    under ctx_host.use(host)."""
    from pyinfra.api.connect import connect_all
    from pyinfra.api.state import BaseStateCallback

    state = _state()
    assert hasattr(state, "limit_hosts")  # None or a list of Host
    assert isinstance(state.activated_hosts, set)
    assert "limit_hosts" in inspect.getsource(State.is_host_in_limit)
    assert "is_host_in_limit" in inspect.getsource(connect_all) or "limit_hosts" in (
        inspect.getsource(connect_all)
    ), "connect_all no longer honours state.limit_hosts: operations/runtime/inventory.Session"
    for hook, parameters in (
        ("host_connect", ["state", "host"]),
        ("host_connect_error", ["state", "host", "error"]),
    ):
        found = list(inspect.signature(getattr(BaseStateCallback, hook)).parameters)
        assert found == parameters, f"BaseStateCallback.{hook} now takes {found}"
