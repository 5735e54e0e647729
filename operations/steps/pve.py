"""The Proxmox side: a container's GPUs, memory and driver, converged from its Proxmox node.

The plan (operations/plan/pve_plan.py) is pure: the node's facts in, a PvePlan out. This module
gathers those facts, prints the plan, and carries it out with the operations below, which
decide nothing themselves; what Proxmox accepts, and where that is defined, is written there.
"""

from __future__ import annotations

import shlex
import shutil
import sys

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from operations import kb as kbmod
from operations import layout
from operations.facts.pve import (
    CtConfig,
    GuestDriver,
    GuestState,
    NodeUvmUnit,
    NvidiaDeviceNodes,
    NvidiaModuleVersion,
    PctConfig,
    PctStatus,
    PveVersion,
)
from operations.plan.pve_plan import CONFIG_FILE, PveFacts, plan, summary
from operations.runtime import inventory
from operations.runtime.host_call import Commands
from operations.runtime.pyinfra_internals import rewrite_connect_errors
from operations.settings import Settings
from operations.steps.host_files import new_file

CONFIG_LOCK = "/run/lock/lxc/pve-config-{ctid}.lock"
CONFIG_PATH = CONFIG_FILE
# Inside the container: a root-only directory, never /tmp.
DRIVER_CACHE = layout.PVE_DRIVER_CACHE


# ----------------------------------------------------------------------------- operations


@operation()
def ct_config(
    ctid: int,
    options: list[tuple[str, str]],
    raw_lines: list[str],
    why: str = "",
    raw_remove: list[str] | None = None,
) -> Commands:
    """
    Give the container the planned config entries; every other line stays as it is.

    + ctid: the container id
    + options: ``pct set`` options (key, value), e.g. [("dev0", "/dev/nvidia0,mode=0666")]
    + raw_lines: lxc.* lines to add to the config's main section (pve-container before 5.0.7)
    + why: the plan's sentence, printed when nothing is to change
    + raw_remove: lxc.* lines to take out of the main section first (a stale major)
    """
    raw_remove = raw_remove or []
    if not options and not raw_lines and not raw_remove:
        host.noop(why or f"container {ctid}: config already has the GPUs, memory and swap")
        return
    if options:
        args: list[str | QuoteString] = []
        for key, value in options:
            args += [f"--{key}", QuoteString(value)]
        yield StringCommand("pct", "set", str(int(ctid)), *args)
    if raw_lines or raw_remove:
        # pve-container makes the lock directory when it loads; a fresh boot may not have it yet.
        # A line to remove is passed as "-LINE", one to add as "+LINE".
        yield StringCommand(
            "mkdir -p /run/lock/lxc &&",
            "flock",
            QuoteString(CONFIG_LOCK.format(ctid=int(ctid))),
            "perl",
            "-e",
            QuoteString(_EDIT_LINES),
            QuoteString(CONFIG_PATH.format(ctid=int(ctid))),
            *(QuoteString("-" + line) for line in raw_remove),
            *(QuoteString("+" + line) for line in raw_lines),
        )


@operation()
def node_uvm_unit(text: str, steps: list[str]) -> Commands:
    """
    Install, enable and start the node's UVM boot unit (layout.NODE_UVM_UNIT), as planned.

    + text: the unit's text
    + steps: what the plan found missing: "write", "enable", "start" (empty: in place)
    """
    unit = layout.NODE_UVM_UNIT
    if not steps:
        host.noop(f"{unit} is installed, enabled and active")
        return
    if "write" in steps:
        yield from new_file(text, layout.unit_path(unit))
        yield "systemctl daemon-reload"
    if "enable" in steps:
        # reenable: a changed [Install] section gets its links anew.
        yield f"systemctl reenable {unit}"
    if "start" in steps or "write" in steps:
        yield f"systemctl restart {unit}"


@operation(is_idempotent=False)
def ct_restart(ctid: int) -> Commands:
    """
    Restart the container (``pct reboot``): it stops serving until it is back.

    + ctid: the container id
    """
    yield f"pct reboot {int(ctid)}"


@operation()
def guest_driver(ctid: int, version_: str, url: str, current: list[str], sha256: str) -> Commands:
    """
    Install the NVIDIA driver's user space of exactly ``version_`` in the running container,
    without a kernel module (the node's module serves it).

    + ctid: the container id
    + version_: the node's kernel module version
    + url: the installer (.run) for that version
    + current: the user-space versions the container has (GuestDriver)
    + sha256: the installer's pinned sha256 (pve_driver_hashes); it runs only if it matches
    """
    if current == [version_]:
        host.noop(f"container {ctid}: NVIDIA user space is {version_}")
        return
    run = f"{DRIVER_CACHE}/NVIDIA-Linux-x86_64-{version_}.run"
    script = " && ".join(
        (
            "set -e",
            "command -v curl >/dev/null "
            "|| { echo 'curl is missing in the container' >&2; exit 1; }",
            f"mkdir -p -m 700 {shlex.quote(DRIVER_CACHE)}",
            # https only, redirects included: a redirect to http:// or file:// is refused.
            f"curl --proto =https --proto-redir =https -fsSL -o {shlex.quote(run + '.part')} "
            f"{shlex.quote(url)}",
            f"echo {shlex.quote(sha256 + '  ' + run + '.part')} | sha256sum -c --quiet -",
            f"mv {shlex.quote(run + '.part')} {shlex.quote(run)}",
            f"sh {shlex.quote(run)} --silent --no-kernel-module",
            f"rm -f {shlex.quote(run)}",
        )
    )
    yield StringCommand("pct", "exec", str(int(ctid)), "--", "sh", "-c", QuoteString(script))


# Removes ("-LINE", whitespace runs compared as one space) and adds ("+LINE") lines in the main
# section of a pct config (before the first [snapshot] or [pve:pending] section), leaving every
# other byte as it was; the new text replaces the file by rename, as Proxmox's own writer does
# (PVE::Tools::file_set_contents). Perl: every Proxmox node has it.
_EDIT_LINES = (
    "my ($path, @arg) = @ARGV; my @add = map { substr($_, 1) } grep { /^\\+/ } @arg; "
    "my %del = map { my $x = substr($_, 1); $x =~ s/\\s+/ /g; ($x => 1) } grep { /^-/ } @arg; "
    "open(my $in, '<', $path) or die \"$path: $!\\n\"; "
    "my @l = <$in>; close $in; my $main = 1; my @k; for my $x (@l) { $main = 0 if $x =~ /^\\[/; "
    "my $n = $x; chomp $n; $n =~ s/\\s+/ /g; $n =~ s/ $//; push @k, $x unless $main && $del{$n} } "
    "@l = @k; my $at = scalar @l; "
    "for my $i (0 .. $#l) { if ($l[$i] =~ /^\\[/) { $at = $i; last } } "
    "$at-- while $at > 0 && $l[$at - 1] !~ /\\S/; "
    '$l[$at - 1] .= "\\n" if $at > 0 && $l[$at - 1] !~ /\\n\\z/; '
    'splice(@l, $at, 0, map { "$_\\n" } @add); my $tmp = "$path.tmp.$$"; '
    "open(my $out, '>', $tmp) or die \"$tmp: $!\\n\"; print $out @l; close $out or die; "
    'rename($tmp, $path) or die "$path: $!\\n";'
)


# ----------------------------------------------------------------------------- the run

# The operations' names are short: pyinfra's table of detected changes pads every row to the
# longest, and at 40 characters or fewer a row of one host fits 80 columns.


def gather(node: Host, settings: Settings) -> PveFacts:
    """The node's facts for one container; without a CTID only the node's own."""
    ctid = settings.pve_ctid
    versions = node.get_fact(PveVersion)
    module = node.get_fact(NvidiaModuleVersion)
    devices = node.get_fact(NvidiaDeviceNodes)
    if ctid is None or versions.manager is None:
        return PveFacts(
            versions, module, devices, CtConfig("missing"), "unknown", GuestState(False)
        )
    config = node.get_fact(PctConfig, ctid=ctid)
    status = node.get_fact(PctStatus, ctid=ctid) if config.kind == "ct" else "unknown"
    guest = (
        node.get_fact(GuestDriver, ctid=ctid, model_dir=settings.source.target_dir)
        if status == "running"
        else GuestState(False)
    )
    node_unit = node.get_fact(NodeUvmUnit)
    return PveFacts(versions, module, devices, config, status, guest, node_unit)


def _advise(state: State, host: Host, command: str) -> bool:
    logger.warning(
        f"{host.print_prefix}the container's config changed; it takes full effect after a "
        f"restart, which stops serving. When it suits, run on the node: {command}"
    )
    return True


@operation(is_idempotent=False)
def advise_restart(command: str) -> Commands:
    """
    End the run with the restart command (pve_restart is off).

    + command: what to run on the node
    """
    yield FunctionCommand(_advise, (command,), {})


def converge(state: State, node: Host) -> None:
    """pve.py for one inventory host (one container through its Proxmox node)."""
    settings = dict(inventory.inventory_settings(state))[node.name]
    facts = gather(node, settings)
    result = plan(node.name, settings, kbmod.load(), facts)
    # Within the terminal's width (80 columns where it is not a terminal or COLUMNS is unset).
    width = shutil.get_terminal_size((80, 24)).columns
    sys.stderr.write(summary(node.name, result, width) + "\n")
    if not result.ok:
        inventory.refuse(
            state,
            node,
            "\n".join(
                [f"{len(result.errors)} problem(s), nothing changed:"]
                + [f"- {e}" for e in result.errors]
            ),
        )
        return
    for warning in result.warnings:
        logger.warning(f"{node.print_prefix}{warning}")
    ctid = int(result.ctid or 0)
    node_uvm_unit(
        name=f"node: {layout.NODE_UVM_UNIT}",
        text=result.unit_text,
        steps=result.unit_steps,
    )
    config = ct_config(
        name=f"CT {ctid} config (GPUs, memory, swap)",
        ctid=ctid,
        options=result.options,
        raw_lines=result.raw_lines,
        raw_remove=result.raw_remove,
    )
    if result.driver_install and result.driver_version:
        guest_driver(
            name=f"CT {ctid} NVIDIA user space {result.driver_version}",
            ctid=ctid,
            version_=result.driver_version,
            url=result.driver_url,
            current=result.driver_current,
            sha256=result.driver_sha256,
        )
    if result.restart == "now":
        ct_restart(name=f"CT {ctid} restart", ctid=ctid, _if=config.did_change)
    elif result.restart == "advise":
        advise_restart(
            name=f"CT {ctid} needs a restart",
            command=result.restart_command(),
            _if=config.did_change,
        )


# ----------------------------------------------------------------------------- the node's name


def name_the_node_on_connect_errors(name: str, address: str, check: str) -> None:
    """Called by a pve inventory for each of its hosts (inventory/pve.py). pyinfra names a host
    it could not reach by its inventory name: for pve.py that is the container's name, while
    the host it could not reach is the Proxmox node. Its line names the node, and what to check
    (operations/runtime/pyinfra_internals.py reads pyinfra's line)."""

    def node_named(error: str) -> str:
        where = f"the Proxmox node {address} (where pve.py runs pct for {name})"
        return f"[{name}] {where}: {error}; {check}"

    rewrite_connect_errors(name, node_named)
