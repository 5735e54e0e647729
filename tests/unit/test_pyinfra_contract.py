"""What we rely on in pyinfra beyond its documented API, one test per use (issue 29, point 6).

pyinfra is pinned to the range in pyproject.toml (`pyinfra>=3.10,<3.11`); a newer pyinfra that
moves one of these fails here by name, with the module of ours that needs it, rather than in a
deploy. Each test names the pyinfra source it copies (pyinfra 3.10.0).
"""

from __future__ import annotations

import inspect
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
from pyinfra.operations import files

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


def test_the_installed_pyinfra_is_in_the_range_we_test() -> None:
    from importlib.metadata import version

    installed = Version(version("pyinfra"))
    pinned = _declared("pyinfra")
    assert pinned.specifier, "pyinfra must be pinned to the range these tests cover"
    assert installed in pinned.specifier, (
        f"pyinfra {installed} is outside {pinned.specifier}: run this file's tests against it and "
        "widen the pin in pyproject.toml only when they pass"
    )


def test_imports_of_ours_that_pyinfra_only_brings_along_are_declared() -> None:
    # operations/facts/once.py imports gevent; operations/runtime/host_call.py typing_extensions.
    for name in ("gevent", "typing-extensions"):
        _declared(name)


def test_ctx_host_get_and_use_are_how_a_greenlet_gets_the_host() -> None:
    """operations/facts/once.py keys answers by `ctx_host.get()` and runs each `together` call
    under `ctx_host.use(target)` and `ctx_config.use(config)` (pyinfra/context.py
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
        "pyinfra's host is no longer greenlet-local: operations/facts/once.together can drop "
        "its ctx_host.use wrapper"
    )
    assert seen_inside is target


def test_a_refused_host_is_failed_through_the_state_sets() -> None:
    """operations/runtime/inventory._fail adds the host to `state.failed_hosts` and discards it from
    `state.active_hosts` (pyinfra/api/state.py State.__init__: both are sets of Host) rather
    than State.fail_hosts, which prompts and raises."""
    state = _state()
    assert isinstance(state.failed_hosts, set)
    assert isinstance(state.active_hosts, set)
    assert callable(getattr(state, "fail_hosts", None))


def test_function_command_execute_is_what_host_call_overrides() -> None:
    """operations/runtime/host_call.HostCall overrides FunctionCommand.execute(state, host,
    connector_arguments) and reads .function, .args, .kwargs, .connector_arguments
    (pyinfra/api/command.py FunctionCommand)."""
    parameters = list(inspect.signature(FunctionCommand.execute).parameters)
    assert parameters == ["self", "state", "host", "connector_arguments"], (
        f"FunctionCommand.execute now takes {parameters}: "
        "operations/runtime/host_call.HostCall must follow"
    )

    def callback(state: object, host: object, arguments: object, word: str) -> str:
        return f"{word}:{sorted(dict(arguments))}"  # type: ignore[call-overload]

    command = HostCall(callback, ("hi",), {}, _sudo=True)
    for attribute in ("function", "args", "kwargs", "connector_arguments"):
        assert hasattr(command, attribute), f"FunctionCommand has no .{attribute} any more"
    assert command.execute(None, None, {"_timeout": 5}) == "hi:['_sudo', '_timeout']"  # type: ignore[arg-type]


def test_operations_reuse_others_through_inner() -> None:
    """operations/steps/model.py and engine.py `yield from files.rsync._inner(...)` and
    `put_file._inner(...)`: the wrapped generator pyinfra's @operation keeps
    (pyinfra/api/operation.py, `decorated_func._inner = func`)."""
    assert inspect.isgeneratorfunction(files.rsync._inner)


def test_operation_meta_did_change_is_a_method() -> None:
    """Gates use `_if=op.did_change`, a bound method (pyinfra/api/operation.py OperationMeta);
    passing it as a value would always be truthy (shared testbed note)."""
    assert inspect.isfunction(OperationMeta.did_change)


@pytest.mark.parametrize("name", ["ctx_host", "ctx_config"])
def test_the_context_managers_we_use_exist(name: str) -> None:
    import pyinfra.context

    manager = getattr(pyinfra.context, name)
    assert callable(manager.get) and callable(manager.use)


def test_an_ssh_hosts_socket_is_reached_through_its_connectors_paramiko_client() -> None:
    """operations/runtime/connection.no_delay sets TCP_NODELAY on
    `host.connector.client.get_transport()
    .sock` (pyinfra/connectors/ssh.py SSHConnector: `client: SSHClient | None`, set in
    connect(); paramiko/transport.py Transport.__init__: `self.sock = sock`), and
    operations/runtime/deploy_lock.py opens its channel on that transport."""
    from paramiko import SSHClient, Transport
    from pyinfra.connectors.ssh import SSHConnector

    hints = inspect.get_annotations(SSHConnector, eval_str=False)
    assert "client" in hints and "SSHClient" in str(hints["client"]), (
        "pyinfra's SSHConnector no longer keeps its paramiko client in .client: "
        "operations/runtime/connection.py and operations/runtime/deploy_lock.py must follow"
    )
    assert callable(getattr(SSHClient, "get_transport", None))
    assert "self.sock = sock" in inspect.getsource(Transport.__init__), (
        "paramiko's Transport no longer keeps its socket in .sock: operations/runtime/connection.py"
    )
