"""One deploy per host at a time: a host-wide lock held for the whole pyinfra run.

pyinfra gathers facts while it loads deploy.py (so the plan is made then) and runs the
operations afterwards, over one SSH connection per host. The lock is taken first, while
deploy.py loads, before any fact of the plan is read: two runs never plan from the same state
and never interleave their changes. deploy.py asks for it (`ask`) before it imports the rest of
the toolkit and reads the answer (`Request.taken`) after: the host takes the lock meanwhile.

How it is held: a small Python process on the host (root; under sudo when the inventory says
`_sudo`) opens /run/sglang-deploy.lock (root's tmpfs: no other user can create or replace it;
never followed if it is a link) and takes an exclusive flock, then waits on its stdin, which is
a channel of the deploy's own SSH connection. The lock goes when that process exits:

- at the end of the run (pyinfra disconnects the host: the channel is closed);
- when the run dies in any way (Ctrl-C, kill -9): the SSH connection closes, sshd closes the
  process's stdin and the kernel drops the flock as the process exits;
- when the host's SSH session goes (sshd killed or restarted): the same, from the host's side;
- when the controller vanishes without closing the connection (a power cut, a lost network):
  the holder writes a byte every BEAT_S, so the host's TCP has data it cannot deliver and
  gives up on the connection (tcp_retries2: about 15 minutes by default, see the holder,
  operations/programs/deploy_lock_holder.py), and sshd ends the session as above. A controller
  that is alive but waiting (pyinfra's prompt) keeps it.

A second deploy that finds the lock held prints who holds it (user, controller, pid, since
when) and waits for it up to `deploy_lock_wait_s` (default 1800 s, beyond the 15 minutes),
then refuses the host with that message; it changes nothing meanwhile. When the lock comes
free while it waits, it names the run that let it go. Read-only commands (operations.plan,
operations.status) take no lock. Connectors other than SSH and @local (such as @fake of
`make demo`) hold no lock.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import subprocess
import time
from typing import Any

from pyinfra import logger
from pyinfra.api.command import StringCommand
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector

from operations.render.host_scripts import script_text
from operations.runtime.host_lines import host_text
from operations.runtime.inventory import inventory_settings, refuse
from operations.runtime.pyinfra_internals import add_callback_once, command_for_host, ssh_transport

LOCK_PATH = "/run/sglang-deploy.lock"
BEAT_S = 15

# The holder: operations/programs/deploy_lock_holder.py, run with the host's python3 (the
# staging script needs it anyway) as one `python3 -c` argument, bundled as every host program.
HOLDER = "deploy_lock_holder.py"
# (id(state), host name) -> the open channel or process that holds the lock.
_held: dict[tuple[int, str], Any] = {}


class _ReleaseOnDisconnect(BaseStateCallback):
    @staticmethod
    def host_disconnect(state: State, host: Host) -> None:
        release(state, host)


def release(state: State, host: Host) -> None:
    """Let the lock go now (the holder sees its stdin close and exits)."""
    handle = _held.pop((id(state), host.name), None)
    if handle is None:
        return
    if isinstance(handle, subprocess.Popen):
        if handle.stdin is not None:
            handle.stdin.close()
        handle.wait(timeout=30)
    else:
        handle.shutdown_write()
        handle.close()


def who() -> str:
    return f"deploy by {getpass.getuser()}@{socket.gethostname()} (pyinfra pid {os.getpid()})"


def holder_command(state: State, host: Host, wait_s: int) -> str:
    """The holder's command line, wrapped for the host's sudo/su settings like any fact."""
    command = StringCommand(
        "exec python3 -c",
        shlex.quote(script_text(HOLDER)),
        LOCK_PATH,
        shlex.quote(who()),
        str(wait_s),
        str(BEAT_S),
    )
    return command_for_host(state, host, command)


def _start(state: State, host: Host, command: str) -> tuple[Any, Any] | None:
    """(handle, line reader) of the holder process, or None for a connector without one."""
    if isinstance(host.connector, SSHConnector):
        transport = ssh_transport(host)
        assert transport is not None  # pyinfra connects every host before deploy.py loads
        channel = transport.open_session()
        channel.exec_command(command)
        return channel, channel.makefile("r")
    if isinstance(host.connector, LocalConnector):
        proc = subprocess.Popen(
            ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return proc, proc.stdout
    return None


class Request:
    """This host's lock, asked for (`ask`): the holder runs on the host while the controller
    goes on; `answer` waits for its verdict."""

    def __init__(self, state: State, host: Host, wait_s: int) -> None:
        self.state, self.host, self.wait_s = state, host, wait_s
        self.began = time.monotonic()
        self.started: tuple[Any, Any] | None = None
        if (id(state), host.name) not in _held:
            self.started = _start(state, host, holder_command(state, host, wait_s))
            if self.started is None and type(host.connector).__name__ != "FakeConnector":
                logger.warning(host_text(host, "no deploy lock with this connector"))

    def answer(self) -> str | None:
        """None once held (or when the connector holds none); otherwise why not, in one line,
        for the host's refusal."""
        if self.started is None:
            return None
        handle, lines = self.started
        self.started = None
        state, host, wait_s = self.state, self.host, self.wait_s
        add_callback_once(state, _ReleaseOnDisconnect())
        waited = False
        for raw in lines:
            line = raw.strip()
            if line == "locked":
                _held[(id(state), host.name)] = handle
                if time.monotonic() - self.began > 1 and not waited:
                    logger.info(host_text(host, f"deploy lock taken after {_since(self.began)}"))
                return None
            word, _, rest = line.partition(" ")
            if word == "released":
                # The holder it waited for let go: its run ended, or its connection did.
                logger.warning(
                    host_text(
                        host,
                        f"deploy lock taken after {_since(self.began)}: released by {rest} "
                        "(that run ended, or its connection to the host did)",
                    )
                )
                waited = True
            elif word == "busy":
                logger.warning(
                    host_text(
                        host,
                        f"another deploy holds this host ({rest}); waiting up to {wait_s}s for it "
                        "(deploy_lock_wait_s), nothing changed meanwhile",
                    )
                )
            elif word == "timeout":
                _close(handle)
                return (
                    f"another deploy still holds this host after {wait_s}s ({rest}); nothing "
                    f"was changed. Run again when it has finished, or raise deploy_lock_wait_s"
                )
            elif word == "foreign":
                _close(handle)
                return f"the deploy lock {rest}: refusing to use it; remove it and run again"
        _close(handle)
        return f"could not take the deploy lock {LOCK_PATH} (python3 missing on the host?)"

    def taken(self) -> bool:
        """True once held; otherwise the host is refused (one line: who holds it) and False."""
        why = self.answer()
        if why is None:
            return True
        refuse(self.state, self.host, why)
        return False


def _since(began: float) -> str:
    return f"{time.monotonic() - began:.0f}s"


def _close(handle: Any) -> None:
    if isinstance(handle, subprocess.Popen):
        if handle.stdin is not None:
            handle.stdin.close()
        handle.wait(timeout=30)
    else:
        handle.close()


def ask(state: State, host: Host) -> Request:
    """deploy.py's first step: the lock asked for, its answer read by `Request.taken()`.
    Settings are checked first, as in the gate (an invalid inventory takes no lock)."""
    settings = dict(inventory_settings(state))[host.name]
    return Request(state, host, settings.deploy_lock_wait_s)
