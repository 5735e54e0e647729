"""Python callbacks that run commands on the host the way the operation's own commands run.

pyinfra runs a StringCommand with the operation's connector arguments (`_sudo`, `_sudo_user`,
`_use_sudo_login`, `_sudo_password`, `_preserve_sudo_env`, `_su_user`, `_doas`, `_env`,
`_chdir`, `_timeout`, ...: the host data's and the operation's global arguments), but a
FunctionCommand's callback gets only (state, host): a `host.run_shell_command` inside it runs
as the SSH user, without sudo. Over `_sudo` that ran the model's staging and the engine check
unprivileged (issue 20, point 3).

HostCall is a FunctionCommand (pyinfra runs it, with `_timeout` and error handling, as any
other callback; the op fixtures show it as one) whose callback also receives the connector
arguments pyinfra resolved for it, and `run` passes them on:

    def _check(state: State, host: Host, arguments: ConnectorArguments, cmd: str) -> bool:
        ok, output = run(host, arguments, cmd)
        ...

    yield HostCall(_check, (cmd,), {})
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import PyinfraCommand, StringCommand
from pyinfra.connectors.util import CommandOutput

# Defined with pyinfra's other internals (it overrides FunctionCommand.execute).
from operations.runtime.pyinfra_internals import HostCall

__all__ = ["Commands", "HostCall", "run"]

if TYPE_CHECKING:
    from pyinfra.api.host import Host


# What an operation function yields for pyinfra to run: shell text or a pyinfra command (a
# StringCommand, a file upload, a FunctionCommand such as HostCall).
Commands = Generator[str | PyinfraCommand, None, None]


def run(
    host: Host,
    arguments: ConnectorArguments,
    command: str | StringCommand,
    print_output: bool = False,
    print_input: bool = False,
) -> tuple[bool, CommandOutput]:
    """host.run_shell_command with the operation's connector arguments (sudo and the rest)."""
    return host.run_shell_command(
        command, print_output=print_output, print_input=print_input, **arguments
    )
