"""The Proxmox side: a container's GPUs, memory and driver, converged from its Proxmox node.

`plan` is pure (settings + the node's facts in, a plan out): it decides which config entries the
container needs and why, and collects every reason to refuse. The operations below carry the plan
out and decide nothing themselves.

What Proxmox accepts, from its own sources (proxmox/pve-container, src/PVE/LXC/Config.pm):
- `devN: [path=]<Path>[,gid=..][,mode=..][,uid=..]` passes a device node through, N < 256; added
  in pve-container 5.0.7 ("allow passing raw device nodes through to containers",
  debian/changelog, 2023-11-21), shipped with Proxmox VE 8.1. A new devN is hot-plugged into a
  running container.
- Before that, only raw LXC keys do it: `lxc.cgroup2.devices.allow: c MAJOR:* rwm` lets the
  container open the driver's devices and `lxc.mount.entry: /dev/X dev/X none
  bind,optional,create=file` binds each node in. `pct set` cannot write lxc.* keys, so they are
  added to /etc/pve/lxc/CTID.conf under pve-container's config lock
  (/run/lock/lxc/pve-config-CTID.lock).
- `memory: <MiB>` (default 512) and `swap: <MiB>` (default 512) are plain options of `pct set`;
  memory and swap are applied to a running container at once (vmconfig_hotplug_pending).
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
import sys
from dataclasses import dataclass, field

from packaging.version import Version
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
    DevEntry,
    GuestDriver,
    GuestState,
    NodeUnitState,
    NodeUvmUnit,
    NvidiaDeviceNodes,
    NvidiaDevices,
    NvidiaModuleVersion,
    PctConfig,
    PctStatus,
    PveVersion,
    PveVersions,
)
from operations.kb import Knowledge, version
from operations.plan import preflight
from operations.redact import redact
from operations.render import units
from operations.runtime import inventory
from operations.runtime.host_call import Commands
from operations.runtime.pyinfra_internals import rewrite_connect_errors
from operations.settings import Settings
from operations.steps.host_files import put_file

MIB = 1024**2
# pve-container defaults when the key is absent (Config.pm: memory default 512, swap default 512).
DEFAULT_MEMORY_MIB = 512
DEFAULT_SWAP_MIB = 512
# The first pve-container with devN entries (debian/changelog: 5.0.7, 2023-11-21).
DEV_ENTRIES_SINCE = "5.0.7"
MAX_DEVICES = 256
CONFIG_LOCK = "/run/lock/lxc/pve-config-{ctid}.lock"
CONFIG_PATH = "/etc/pve/lxc/{ctid}.conf"
# Inside the container: a root-only directory, never /tmp.
DRIVER_CACHE = layout.PVE_DRIVER_CACHE
# The mode every NVIDIA devN entry gives its node in the container. Without mode=,
# pve-container makes the node 0660 owned by the container's root (src/PVE/LXC.pm,
# create_passthrough_device_node), which the service user cannot open; 0666 is the mode
# NVIDIA's own nvidia-modprobe gives the nodes on a node (NVIDIA/nvidia-modprobe,
# modprobe-utils/nvidia-modprobe-utils.c, NV_DEVICE_FILE_MODE). docs/security.md, "GPU device
# nodes on the Proxmox node", says why this and not a gid=.
DEVICE_MODE = "0666"
UVM_UNIT_TEMPLATE = "nvidia-uvm-nodes.service.j2"


@dataclass(frozen=True)
class PveFacts:
    versions: PveVersions
    module: str | None
    devices: NvidiaDevices
    config: CtConfig
    status: str
    guest: GuestState
    node_unit: NodeUnitState = field(default_factory=NodeUnitState)


@dataclass
class PvePlan:
    """What pve.py does to one container, and why.

    form: "dev" (devN entries) or "lxc" (raw lxc.* lines); options: `pct set` options in order;
    raw_lines: lxc.* lines to add; restart: "now" (pve_restart), "advise" (print the command),
    or "" (nothing to restart); driver_install: run the installer in the container this run.
    """

    ctid: int | None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    form: str = ""
    options: list[tuple[str, str]] = field(default_factory=list)
    raw_lines: list[str] = field(default_factory=list)
    # lxc.* lines to take out (a stale nvidia-uvm major), replaced by raw_lines.
    raw_remove: list[str] = field(default_factory=list)
    # The node's UVM boot unit: its text and what the run does to it ("write", "enable",
    # "start"; empty: it is in place).
    unit_text: str = ""
    unit_steps: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    restart: str = ""
    driver_version: str | None = None
    driver_current: list[str] = field(default_factory=list)
    driver_install: bool = False
    driver_url: str = ""
    driver_sha256: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def config_changes(self) -> bool:
        return bool(self.options or self.raw_lines or self.raw_remove)

    def restart_command(self) -> str:
        return f"pct reboot {self.ctid}"


def wanted_nodes(settings: Settings, devices: NvidiaDevices) -> list[str]:
    """The node's device nodes the container gets: the first gpu_count GPUs, then the control,
    UVM and capability nodes the node has."""
    gpus = [layout.gpu_node(i) for i in range(settings.gpu_count)]
    extra = [*layout.CUDA_NODES, *layout.CUDA_OPTIONAL_NODES]
    caps = [n for n in devices.nodes if layout.is_caps_node(n)]
    return gpus + [n for n in extra if n in devices.nodes] + caps


def uses_dev_entries(versions: PveVersions) -> bool:
    return versions.container is not None and _pkg_version(versions.container) >= version(
        DEV_ENTRIES_SINCE
    )


def _pkg_version(text: str) -> Version:
    # Debian revisions: "4.4-6" -> 4.4.6, "5.0.8" stays.
    return version(re.sub(r"[^0-9.]", ".", text).strip("."))


def usable_entry(entry: DevEntry) -> DevEntry:
    """The entry as the service user can use it: mode=DEVICE_MODE, writable (deny-write
    dropped); its uid and gid, if any, kept."""
    options = {k: v for k, v in entry.options.items() if k != "deny-write"}
    options["mode"] = DEVICE_MODE
    return DevEntry(entry.path, options)


def dev_options(config: CtConfig, nodes: list[str]) -> list[tuple[str, str]]:
    """devN options: an entry at the lowest free N for each node no devN entry passes yet, and
    the existing entry of a node rewritten where it lacks mode=DEVICE_MODE or denies writes
    (capability nodes aside: those stay as Proxmox makes them)."""
    present = config.device_entries()
    by_path = {e.path: k for k, e in present.items()}
    free = (f"dev{i}" for i in range(MAX_DEVICES) if f"dev{i}" not in present)
    out = []
    for node in nodes:
        key = by_path.get(node)
        # The capability nodes gate privileged actions (mig-config: create and destroy MIG
        # instances; NVIDIA MIG User Guide, "Device Nodes and Capabilities"): passed as Proxmox
        # makes them, never widened; a rank does not need them.
        caps = layout.is_caps_node(node)
        if key is None:
            out.append((next(free), node if caps else DevEntry(node, {"mode": DEVICE_MODE}).text()))
        elif not caps and (fixed := usable_entry(present[key])) != present[key]:
            out.append((key, fixed.text()))
    return out


def lxc_lines(devices: NvidiaDevices, nodes: list[str]) -> list[str]:
    """The raw lines that pass the nodes through on a pve-container before 5.0.7."""
    # The GPUs' major (195) is allowed minor by minor: /dev/nvidiaN is 195:N and nvidiactl
    # 195:255 (NVIDIA's nvidia-modprobe), so `c 195:* rwm` would let the container open every
    # GPU of the node, not its gpu_count. UVM and the capability nodes are not per GPU.
    gpu = devices.major("nvidia-frontend", "nvidia")
    lines = []
    if gpu is not None:
        minors = [str(i) for n in nodes if (i := layout.gpu_index(n)) is not None]
        lines += [f"lxc.cgroup2.devices.allow: c {gpu}:{m} rwm" for m in minors]
        lines.append(f"lxc.cgroup2.devices.allow: c {gpu}:255 rwm")
    majors = [devices.major("nvidia-uvm")]
    if any(layout.is_caps_node(n) for n in nodes):
        majors.append(devices.major("nvidia-caps"))
    lines += [f"lxc.cgroup2.devices.allow: c {m}:* rwm" for m in majors if m is not None]
    for node in nodes:
        if layout.is_caps_node(node):
            continue
        name = node.removeprefix("/")
        lines.append(f"lxc.mount.entry: {node} {name} none bind,optional,create=file")
    if any(layout.is_caps_node(n) for n in nodes):
        caps = layout.CAPS_DIR
        lines.append(
            f"lxc.mount.entry: {caps} {caps.removeprefix('/')} none bind,optional,create=dir"
        )
    return lines


def stale_uvm_lines(config: CtConfig, devices: NvidiaDevices) -> list[str]:
    """`lxc.cgroup2.devices.allow: c N:* rwm` lines whose major N no driver of the node holds
    now: nvidia-uvm's (dynamic) major of an earlier driver or kernel. A major another driver
    holds is left alone (it is not ours to judge)."""
    stale = []
    for value in config.values("lxc.cgroup2.devices.allow"):
        match = re.fullmatch(r"c\s+([0-9]+):\*\s+rwm", value.strip())
        if match and int(match.group(1)) not in devices.all_majors:
            stale.append(f"lxc.cgroup2.devices.allow: {value}")
    return stale


def missing_lines(config: CtConfig, lines: list[str]) -> list[str]:
    """The lines whose key and value (whitespace aside) the config does not have yet."""
    have = {(k, " ".join(v.split())) for k, v in config.entries if k.startswith("lxc.")}
    out = []
    for line in lines:
        key, _, value = line.partition(": ")
        if (key, " ".join(value.split())) not in have:
            out.append(line)
    return out


def plan(host_name: str, settings: Settings, kb: Knowledge, facts: PveFacts) -> PvePlan:
    s = settings
    result = PvePlan(ctid=s.pve_ctid)
    err = result.errors.append
    note = result.notes.append
    ctid = s.pve_ctid
    if ctid is None:
        err(
            f"{host_name}: pve_ctid is not set (in no inventory, group_data file or --data); "
            "accepted: the container's id on its Proxmox node, e.g. pve_ctid = 200"
        )
        return result
    where = f"pve_ctid = {ctid} (set in {s.origin('pve_ctid')})"

    if facts.versions.manager is None:
        err(
            f"{host_name}: this host is not a Proxmox VE node ('pveversion -v' printed no "
            "pve-manager); accepted: the Proxmox node that runs the container, as root"
        )
        return result
    if facts.config.kind == "vm":
        err(
            f"{host_name}: {where} is a virtual machine (/etc/pve/qemu-server/{ctid}.conf), not "
            "a container; accepted: the id of an LXC container on this node ('pct list')"
        )
    elif facts.config.kind != "ct":
        err(
            f"{host_name}: {where}: no container {ctid} on this node "
            f"(/etc/pve/lxc/{ctid}.conf does not exist); accepted: an id 'pct list' shows"
        )
    if facts.module is None:
        err(
            f"{host_name}: the node has no NVIDIA kernel module loaded (no /sys/module/nvidia/"
            "version, no /proc/driver/nvidia/version); accepted: a node whose driver is "
            "installed and loaded (nvidia-smi works on the node)"
        )
    missing = [n for n in wanted_nodes(s, facts.devices) if n not in facts.devices.nodes]
    gpus = facts.devices.gpus
    if facts.module is not None and missing:
        err(
            f"{host_name}: gpu_count = {s.gpu_count} (set in {s.origin('gpu_count')}) but the "
            f"node has {len(gpus)} GPU device node(s) ({', '.join(gpus) or 'none'}); missing "
            f"{', '.join(missing)}; accepted: gpu_count at most the node's GPUs"
        )
    for required in layout.CUDA_NODES:
        if facts.module is not None and required not in facts.devices.nodes:
            err(
                f"{host_name}: the node has no {required} (CUDA needs it); accepted: a node "
                "where it exists: run 'nvidia-modprobe -u -c=0' (nvidia-uvm) or nvidia-smi once"
            )
    if facts.node_unit.modprobe is None:
        err(
            f"{host_name}: the node has no nvidia-modprobe on PATH: nothing would make "
            f"the UVM device nodes at the next boot, and a container whose devN "
            "path is missing does not start; accepted: a node with nvidia-modprobe (Debian: "
            "apt install nvidia-modprobe; NVIDIA's installer ships it)"
        )
    if not result.ok:
        return result

    # Nothing else in the inventory names the container: show which one this id is.
    note(f"container: {ctid} is hostname {facts.config.get('hostname') or '(none)'} on this node")

    # Devices, in the form this pve-container understands.
    nodes = wanted_nodes(s, facts.devices)
    pve = f"Proxmox VE {facts.versions.manager} (pve-container {facts.versions.container})"
    if uses_dev_entries(facts.versions):
        result.form = "dev"
        result.options.extend(dev_options(facts.config, nodes))
        note(f"devices: {pve} has devN entries (pve-container >= {DEV_ENTRIES_SINCE})")
        present = facts.config.devices()
        fixed = [k for k, _ in result.options if k in present]
        if fixed:
            note(
                f"devices: {', '.join(fixed)} lack mode={DEVICE_MODE}: pve-container makes such a "
                "node 0660 owned by the container's root, which the service user cannot open"
            )
    else:
        result.form = "lxc"
        lines = lxc_lines(facts.devices, nodes)
        if None in (
            facts.devices.major("nvidia-frontend", "nvidia"),
            facts.devices.major("nvidia-uvm"),
        ):
            err(
                f"{host_name}: /proc/devices on the node names no major for nvidia or "
                "nvidia-uvm; accepted: a node whose NVIDIA modules are loaded"
            )
            return result
        result.raw_lines = missing_lines(facts.config, lines)
        result.raw_remove = stale_uvm_lines(facts.config, facts.devices)
        if result.raw_remove:
            note(
                f"devices: the config allows a major no driver of the node holds now (nvidia-uvm's "
                f"is {facts.devices.major('nvidia-uvm')}, /proc/devices): an earlier driver's or "
                "kernel's nvidia-uvm; replacing it"
            )
        gpu_major = facts.devices.major("nvidia-frontend", "nvidia")
        wide = [
            v for v in facts.config.values("lxc.cgroup2.devices.allow") if f"{gpu_major}:*" in v
        ]
        if wide:
            note(
                f"devices: the config allows 'c {gpu_major}:* rwm', every GPU of the node; "
                f"remove that line from /etc/pve/lxc/{ctid}.conf (the lines added here allow "
                "this container's GPUs only)"
            )
        note(
            f"devices: {pve} predates devN entries (pve-container {DEV_ENTRIES_SINCE}): "
            "lxc.cgroup2.devices.allow and lxc.mount.entry lines, majors from /proc/devices"
        )
    passed = len(nodes) - (len(result.options) if result.form == "dev" else 0)
    if result.form == "dev":
        note(
            f"devices: {len(nodes)} node(s) wanted, {passed} already passed through with "
            f"mode={DEVICE_MODE}"
        )

    # The UVM nodes at every node boot, before pve-guests.service starts the containers.
    unit = layout.NODE_UVM_UNIT
    modprobe = facts.node_unit.modprobe or ""
    result.unit_text = units.render(UVM_UNIT_TEMPLATE, modprobe=units.exec_word(modprobe))
    want = hashlib.sha256(result.unit_text.encode()).hexdigest()
    if facts.node_unit.sha256 != want:
        result.unit_steps.append("write")
    if facts.node_unit.enabled != "enabled" or "write" in result.unit_steps:
        result.unit_steps.append("enable")
    if facts.node_unit.active != "active":
        result.unit_steps.append("start")
    note(
        f"boot: {unit} runs '{modprobe} -u -c=0' before pve-guests.service at every node boot"
        + (f" ({', '.join(result.unit_steps)} now)" if result.unit_steps else " (in place)")
    )

    # Nesting, opt-in: lifts Proxmox's AppArmor mount denials (src/PVE/LXC.pm: without
    # nesting=1, deny mount -> /proc/ and /sys/).
    features = [f for f in (facts.config.get("features") or "").split(",") if f.strip()]
    nesting = any(f.strip() == "nesting=1" for f in features)
    if s.pve_nesting and not nesting:
        kept = [f for f in features if not f.strip().startswith("nesting=")]
        result.options.append(("features", ",".join([*kept, "nesting=1"])))
        note("features: nesting=1 (pve_nesting), other features kept")
    elif not nesting:
        note(
            "features: no nesting=1; if preflight says the rank sandbox fails with "
            "226/NAMESPACE, set pve_nesting = true"
        )

    # Memory: the same rule preflight checks inside the container, from a size the container
    # cannot inflate: measured by the node (real blocks), capped at the knowledge base's size
    # for model_name and at the node's MemTotal.
    measured = facts.guest.model_bytes
    size = preflight.model_bytes(s, kb, measured)
    known = kb.models.get(s.model_name)
    known_bytes = int(known.size_gb * 1e9) if known is not None and known.size_gb else None
    node_mem = facts.guest.node_mem_bytes
    caps = [c for c in (known_bytes, node_mem) if c is not None]
    if size is not None and caps and size > min(caps):
        size = min(caps)
    sources = (
        f"measured by the node {_gib(measured)} (real blocks), knowledge base "
        f"{_gib(known_bytes)}, node MemTotal {_gib(node_mem)}"
    )
    if size is None:
        err(
            f"{host_name}: cannot size the container's memory: model_name {s.model_name!r} "
            f"(set in {s.origin('model_name')}) is not in the knowledge base and model_source "
            "could not be measured (the container is stopped, or the source is not a directory "
            "in it); accepted: a known model_name, or start the container with the model mounted"
        )
        return result
    need = preflight.memory_needed(s, size)
    need_mib = math.ceil(need / MIB)
    if (low := preflight.ram_per_rank_warning(s)) is not None:
        result.warnings.append(low)
    current = _int(facts.config.get("memory"), DEFAULT_MEMORY_MIB)
    rule = (
        f"model {size / 1024**3:.1f} GiB in tmpfs ({sources}) + {s.dp_size} ranks x "
        f"{s.ram_per_rank_gb:g} GiB (ram_per_rank_gb) + pve-container's memory.high margin "
        f"= {need_mib} MiB"
    )
    if node_mem is not None and need > node_mem:
        err(
            f"{host_name}: the container would need {need_mib} MiB ({rule}), more than the "
            f"node's MemTotal ({node_mem // MIB} MiB); accepted: fewer ranks (dp_size), less "
            "ram_per_rank_gb, or a node with more memory"
        )
        return result
    if current < need_mib:
        result.options.append(("memory", str(need_mib)))
        note(f"memory: {current} -> {need_mib} MiB ({rule})")
    else:
        note(f"memory: {current} MiB is enough ({rule})")
    swap = _int(facts.config.get("swap"), DEFAULT_SWAP_MIB)
    if swap != 0:
        result.options.append(("swap", "0"))
        note(f"swap: {swap} -> 0 MiB (tmpfs pages of the staged model must stay in memory)")

    # A restart stops serving: only with the per-run opt-in.
    if result.config_changes and facts.status == "running":
        result.restart = "now" if s.pve_restart else "advise"
        note(
            "restart: the container must restart for the new config to take full effect; "
            + (
                "pve_restart is on: restarting it"
                if s.pve_restart
                else f"run '{result.restart_command()}'"
            )
        )
    elif result.config_changes:
        note(f"restart: none needed, the container is {facts.status}; the config applies at start")

    # The user-space driver must be the node module's exact version.
    result.driver_version = facts.module
    result.driver_current = facts.guest.driver_versions
    result.driver_url = s.pve_driver_url.replace("{version}", facts.module or "")
    matches = facts.guest.driver_versions == [facts.module]
    if not facts.guest.running:
        note(
            f"driver: the container needs NVIDIA user space {facts.module} exactly (not checked: "
            "the container is stopped)"
        )
    elif matches:
        note(f"driver: the container's user space is {facts.module}, the node module's version")
    elif s.pve_install_driver:
        found = ", ".join(facts.guest.driver_versions) or "none"
        pinned = s.pve_driver_hashes.get(facts.module or "")
        if not pinned:
            err(
                f"{host_name}: pve_driver_hashes (set in {s.origin('pve_driver_hashes')}) has no "
                f"sha256 for driver {facts.module}: the installer runs as the container's root "
                f"and must be the file you checked; accepted: pve_driver_hashes = "
                f'{{"{facts.module}": "<sha256 of {result.driver_url}>"}}'
            )
            return result
        result.driver_install = True
        result.driver_sha256 = pinned
        note(
            f"driver: installing {facts.module} in the container, user space only (has {found}), "
            f"from {redact(result.driver_url)} (https only), sha256 {pinned} (pve_driver_hashes)"
        )
    else:
        found = ", ".join(facts.guest.driver_versions) or "none"
        note(
            f"driver: the container needs NVIDIA user space {facts.module} exactly, "
            f"it has {found}; "
            "set pve_install_driver = true to install it (user space only, --no-kernel-module)"
        )
    return result


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1024**3:.1f} GiB"


def _int(text: str | None, default: int) -> int:
    return int(text) if text is not None and text.strip().isdigit() else default


def summary(host_name: str, result: PvePlan) -> str:
    """The plan as printed before any change."""
    title = f"{host_name}: container {result.ctid}: " + ("ready" if result.ok else "refused")
    lines = [title]
    lines += [f"  {n}" for n in result.notes]
    if result.options:
        args = " ".join(f"--{k} {shlex.quote(v)}" for k, v in result.options)
        lines.append(f"  change: pct set {result.ctid} {args}")
    lines += [f"  change: remove '{ln}'" for ln in result.raw_remove]
    lines += [f"  change: add '{ln}'" for ln in result.raw_lines]
    if result.unit_steps:
        steps = ", ".join(result.unit_steps)
        lines.append(f"  change: {steps} {layout.NODE_UVM_UNIT} on the node")
    lines += [f"  warning: {w}" for w in result.warnings]
    if result.ok and not result.config_changes:
        lines.append("  config: nothing to change")
    lines += [f"  refused: {e}" for e in result.errors]
    return "\n".join(lines)


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
        yield from put_file._inner(src=text, dest=layout.unit_path(unit), sha256_now=None)
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
    sys.stderr.write(summary(node.name, result) + "\n")
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
        name=f"Proxmox: {layout.NODE_UVM_UNIT} (UVM nodes at every node boot)",
        text=result.unit_text,
        steps=result.unit_steps,
    )
    config = ct_config(
        name=f"Proxmox: container {ctid} config (GPUs, memory, swap)",
        ctid=ctid,
        options=result.options,
        raw_lines=result.raw_lines,
        raw_remove=result.raw_remove,
    )
    if result.driver_install and result.driver_version:
        guest_driver(
            name=f"Proxmox: NVIDIA user space {result.driver_version} in container {ctid}",
            ctid=ctid,
            version_=result.driver_version,
            url=result.driver_url,
            current=result.driver_current,
            sha256=result.driver_sha256,
        )
    if result.restart == "now":
        ct_restart(name=f"Proxmox: restart container {ctid}", ctid=ctid, _if=config.did_change)
    elif result.restart == "advise":
        advise_restart(
            name=f"Proxmox: container {ctid} needs a restart",
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
