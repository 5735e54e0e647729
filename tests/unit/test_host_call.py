"""Over `_sudo`, every command a deploy runs goes through sudo, callbacks' too (issue 20,
point 3): the staging run and the hub download (model.py) and the engine check (engine.py) run
`host.run_shell_command` inside a callback, which pyinfra calls without the connector
arguments. HostCall hands them over; these tests drive the real operations through pyinfra's
own run loop (State, add_op, run_ops) against its @fake connector, recording what reaches it.

Also: pyinfra's `_sudo` transfers (the wheelhouse and the compiler's archives up, the engine's
lock down) go through a temp file in /tmp; its default name is /tmp/pyinfra-<sha1 of the
path>, which a local user can compute and create first. Each transfer names a random one.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.config import Config
from pyinfra.api.connect import connect_all
from pyinfra.api.inventory import Inventory
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import State
from pyinfra.api.util import sha1_hash
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput
from typing_extensions import override

from operations import layout
from operations.runtime.host_call import HostCall, run
from operations.steps import cuda_toolkit, engine, engine_check, model

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/operations"
SUDO: dict[str, Any] = {
    "_sudo": True,
    "_sudo_user": "root",
    "_use_sudo_login": True,
    "_sudo_password": "pw",
    "_preserve_sudo_env": True,
}


def case(name: str) -> tuple[list[Any], dict[str, Any]]:
    """An operation fixture's arguments (tests/operations/OP/CASE.json)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return list(data.get("args", [])), dict(data.get("kwargs", {}))


class Recording(FakeConnector):
    """pyinfra's @fake transport, keeping what reaches the host with the arguments it came
    with (the Host's connector_cls: injected, not patched)."""

    commands: list[tuple[str, dict[str, Any]]]
    uploads: list[tuple[str, str | None, dict[str, Any]]]
    downloads: list[tuple[str, str | None, dict[str, Any]]]

    def __init__(self, state: State, host: Any) -> None:
        super().__init__(state, host)
        self.commands, self.uploads, self.downloads = [], [], []

    @override
    def run_shell_command(
        self, command: Any, print_output: bool = False, print_input: bool = False, **arguments: Any
    ) -> tuple[bool, CommandOutput]:
        text = command if isinstance(command, str) else command.get_raw_value()
        self.commands.append((text, {k: arguments.get(k) for k in SUDO}))
        return super().run_shell_command(command, print_output, print_input)

    @override
    def put_file(  # type: ignore[override]
        self, src: Any, dest: str, remote_temp_filename: str | None = None, **arguments: Any
    ) -> bool:
        self.uploads.append((dest, remote_temp_filename, {k: arguments.get(k) for k in SUDO}))
        return True

    @override
    def get_file(  # type: ignore[override]
        self, src: str, dest: Any, remote_temp_filename: str | None = None, **arguments: Any
    ) -> bool:
        self.downloads.append((src, remote_temp_filename, {k: arguments.get(k) for k in SUDO}))
        return True


def deploy(add: Callable[[State], None], **data: Any) -> Recording:
    """The ops `add` adds, run by pyinfra on one recorded @fake host with `data` as its host
    data; what reached the host."""
    inventory = Inventory((["@fake/gpu-1"], {"fake_delay": 0, "fake_delay_jitter": 0, **data}))
    for host in inventory:
        host.connector_cls = Recording
    state = State(inventory, Config())
    connect_all(state)
    add(state)
    run_ops(state)
    (host,) = inventory
    return cast(Recording, host.connector)


def ops_of(seen: Recording, needle: str) -> list[dict[str, Any]]:
    found = [arguments for text, arguments in seen.commands if needle in text]
    assert found, f"no command with {needle!r} reached the host: {seen.commands}"
    return found


def test_the_staging_run_goes_through_sudo() -> None:
    args, kwargs = case("steps.model.staged/beside")
    seen = deploy(lambda s: add_op(s, model.staged, *args, **kwargs), **SUDO)
    assert ops_of(seen, "stage_model.py stage") == [SUDO]


def test_the_hub_download_and_the_token_removal_go_through_sudo() -> None:
    args, _ = case("steps.model.fetched_from_hub/first-download-public-repo")
    args[-1:] = [None, layout.HUB_TOKEN_FILE]  # not downloaded yet; a private repository
    seen = deploy(lambda s: add_op(s, model.fetched_from_hub, *args), **SUDO)
    # One command: the download, then `rm -f TOKEN` whatever its outcome, all as root.
    (arguments,) = ops_of(seen, f"rm -f {layout.HUB_TOKEN_FILE}")
    assert arguments == SUDO
    assert ops_of(seen, "fetch-hub") == [SUDO]


def test_the_engine_check_goes_through_sudo() -> None:
    args, kwargs = case("steps.engine_check.verify_env/fresh")
    # The fake host's answer is no probe: the check fails (and says so), after running as root.
    seen = deploy(
        lambda s: add_op(s, engine_check.verify_env, *args, _ignore_errors=True, **kwargs), **SUDO
    )
    check = [a for text, a in seen.commands if "/bin/python -c" in text]
    assert check == [SUDO], seen.commands


def test_an_operations_own_global_arguments_win() -> None:
    """An op's `_sudo_user=` reaches its callback as it reaches its StringCommands."""
    args, kwargs = case("steps.model.staged/inplace-stops-the-ranks")
    seen = deploy(lambda s: add_op(s, model.staged, *args, _sudo_user="admin", **kwargs), **SUDO)
    stop, stage = ops_of(seen, "systemctl stop")[0], ops_of(seen, "stage_model.py stage")[0]
    assert stop == stage == {**SUDO, "_sudo_user": "admin"}


def test_without_sudo_nothing_asks_for_it() -> None:
    args, kwargs = case("steps.model.staged/beside")
    seen = deploy(lambda s: add_op(s, model.staged, *args, **kwargs))
    assert ops_of(seen, "stage_model.py stage")[0]["_sudo"] is False


def test_host_call_passes_a_copy_with_its_own_arguments_over_the_ops() -> None:
    got: list[ConnectorArguments] = []

    def callback(state: Any, host: Any, arguments: ConnectorArguments, word: str) -> bool:
        got.append(arguments)
        return word == "yes"

    passed: ConnectorArguments = {"_sudo": True, "_sudo_user": "root", "_timeout": 5}
    call = HostCall(callback, ("yes",), {}, _sudo_user="sglang")
    assert call.execute(None, None, passed) is True  # type: ignore[arg-type]
    assert got == [{"_sudo": True, "_sudo_user": "sglang", "_timeout": 5}]
    assert passed["_sudo_user"] == "root"  # the caller's dict is not changed


def test_run_hands_every_argument_to_run_shell_command() -> None:
    class Recorder:
        def run_shell_command(self, *args: Any, **kwargs: Any) -> tuple[bool, CommandOutput]:
            self.call = (args, kwargs)
            return True, CommandOutput([])

    host = Recorder()
    arguments = cast(ConnectorArguments, dict(SUDO))
    run(host, arguments, "id -u", print_output=True)  # type: ignore[arg-type]
    assert host.call == (("id -u",), {"print_output": True, "print_input": False, **SUDO})


def test_no_callback_runs_host_commands_behind_pyinfras_back() -> None:
    """host.run_shell_command (or the connector's) only in host_call.run: a new callback that
    ran one directly would run it without sudo."""
    offenders = []
    for path in sorted((ROOT / "operations").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "run_shell_command"
                and path.name != "host_call.py"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# ------------------------------------------------------------------------ temp file names


def test_sudo_uploads_use_random_temp_names(tmp_path: Path) -> None:
    for name in ("a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"wheel")
    dest = "/opt/sglang/wheelhouse"

    def add(state: State) -> None:
        names = ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]
        add_op(state, engine.sync_wheelhouse, src=str(tmp_path), dest=dest, todo=names, count=2)

    first, second = deploy(add, **SUDO).uploads, deploy(add, **SUDO).uploads
    temps = [temp for _, temp, _ in first + second]
    assert len(first) == 2 and len(temps) == 4
    assert all(t and t.startswith("/tmp/pyinfra-") for t in temps), temps
    assert len(set(temps)) == 4  # a new name per file and per run: nothing to predict
    for dest_path, temp, arguments in first:
        assert arguments == SUDO
        assert temp != f"/tmp/pyinfra-{_sha1(dest_path)}"  # pyinfra's default name


def test_sudo_archive_uploads_use_random_temp_names(tmp_path: Path) -> None:
    tools = case("steps.engine_check.verify_env/fresh")[1]["spec"]["toolkit"]
    for archive in tools["archives"]:
        (tmp_path / Path(archive["path"]).name).write_bytes(b"xz")
    kwargs = {"src": str(tmp_path), "dest": "/opt/sglang/cuda-redist", "tools": tools}
    seen = deploy(lambda s: add_op(s, cuda_toolkit.sync_archives, **kwargs), **SUDO)
    temps = [temp for _, temp, _ in seen.uploads]
    assert len(temps) == 3 and len(set(temps)) == 3, seen.uploads
    assert not {f"/tmp/pyinfra-{_sha1(dest)}" for dest, _, _ in seen.uploads} & set(temps)


def test_the_lock_download_uses_a_random_temp_name(tmp_path: Path) -> None:
    src, dest = "/opt/sglang/envs/e/sglang-deploy.lock", str(tmp_path / "locks/e.lock")
    # What the fake transport "downloads": a lock that passes the lock check (just the project).
    partial = tmp_path / "locks/e.lock._fake_gpu-1.partial"
    lock = 'version = 1\n\n[[package]]\nname = "sglang-engine"\nversion = "0"\n'
    lock += 'source = { virtual = "." }\n'

    def add(state: State) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(lock)
        add_op(state, engine.fetch_lock, src=src, dest=dest, registries=[])

    ((_, one, arguments),) = deploy(add, **SUDO).downloads
    ((_, two, _),) = deploy(add, **SUDO).downloads
    assert arguments == SUDO
    assert one and two and one != two
    assert one.startswith("/tmp/pyinfra-") and f"/tmp/pyinfra-{_sha1(dest)}" != one


def _sha1(text: str) -> str:
    return str(sha1_hash(text))
