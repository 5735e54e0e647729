"""The Proxmox side's pure plan: a container's GPUs, memory and driver, decided from its
Proxmox node's facts (operations/facts/pve.py). Settings and facts in, a PvePlan out: which
config entries the container needs and why, and every reason to refuse; the operations in
operations/steps/pve.py carry it out and decide nothing themselves.

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
import textwrap
from dataclasses import dataclass, field

from packaging.version import Version

from operations import layout
from operations.facts.pve import (
    CtConfig,
    DevEntry,
    GuestState,
    NodeUnitState,
    NvidiaDevices,
    PveVersions,
)
from operations.kb import Knowledge, version
from operations.plan import capacity, preflight
from operations.redact import redact
from operations.render import units
from operations.settings import Settings

MIB = 1024**2
# pve-container defaults when the key is absent (Config.pm: memory default 512, swap default 512).
DEFAULT_MEMORY_MIB = 512
DEFAULT_SWAP_MIB = 512
# The first pve-container with devN entries (debian/changelog: 5.0.7, 2023-11-21).
DEV_ENTRIES_SINCE = "5.0.7"
MAX_DEVICES = 256
# The mode every NVIDIA devN entry gives its node in the container. Without mode=,
# pve-container makes the node 0660 owned by the container's root (src/PVE/LXC.pm,
# create_passthrough_device_node), which the service user cannot open; 0666 is the mode
# NVIDIA's own nvidia-modprobe gives the nodes on a node (NVIDIA/nvidia-modprobe,
# modprobe-utils/nvidia-modprobe-utils.c, NV_DEVICE_FILE_MODE). docs/how-it-works/security-gpus.md,
# "GPU device nodes on the Proxmox node", says why this and not a gid=.
DEVICE_MODE = "0666"
UVM_UNIT_TEMPLATE = "nvidia-uvm-nodes.service.j2"
CONFIG_FILE = "/etc/pve/lxc/{ctid}.conf"


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
    """What pve.py does to one container, and why: every reason to refuse collected first (the
    node and the container), then each part decided in turn."""
    result = PvePlan(ctid=settings.pve_ctid)
    if not _node_problems(host_name, settings, facts, result):
        return result
    if not _devices(host_name, settings, facts, result):
        return result
    _boot_unit(facts, result)
    _nesting(settings, facts, result)
    if not _memory(host_name, settings, kb, facts, result):
        return result
    _restart(settings, facts, result)
    _driver(host_name, settings, facts, result)
    return result


def _node_problems(host_name: str, s: Settings, facts: PveFacts, result: PvePlan) -> bool:
    """The node and the container as pve.py needs them; False: refused (result.errors)."""
    err = result.errors.append
    ctid = s.pve_ctid
    if ctid is None:
        err(
            f"{host_name}: pve_ctid is not set (in no inventory, group_data file or --data); "
            "accepted: the container's id on its Proxmox node, e.g. pve_ctid = 200"
        )
        return False
    where = f"pve_ctid = {ctid} (set in {s.origin('pve_ctid')})"

    if facts.versions.manager is None:
        err(
            f"{host_name}: this host is not a Proxmox VE node ('pveversion -v' printed no "
            "pve-manager); accepted: the Proxmox node that runs the container, as root"
        )
        return False
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
    return result.ok


def _devices(host_name: str, s: Settings, facts: PveFacts, result: PvePlan) -> bool:
    """The device nodes, in the form this pve-container understands; False: refused."""
    err, note, ctid = result.errors.append, result.notes.append, s.pve_ctid
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
            return False
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

    return True


def _boot_unit(facts: PveFacts, result: PvePlan) -> None:
    note = result.notes.append
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


def _nesting(s: Settings, facts: PveFacts, result: PvePlan) -> None:
    note = result.notes.append
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


def _memory(host_name: str, s: Settings, kb: Knowledge, facts: PveFacts, result: PvePlan) -> bool:
    """Memory and swap: the rule preflight checks inside the container; False: refused."""
    err, note = result.errors.append, result.notes.append
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
        f"the node's measure of its real blocks {capacity.gib(measured)}, the knowledge "
        f"base's {capacity.gib(known_bytes)} and the node's MemTotal {capacity.gib(node_mem)}"
    )
    if size is None:
        err(
            f"{host_name}: cannot size the container's memory: model_name {s.model_name!r} "
            f"(set in {s.origin('model_name')}) is not in the knowledge base and model_source "
            "could not be measured (the container is stopped, or the source is not a directory "
            "in it); accepted: a known model_name, or start the container with the model mounted"
        )
        return False
    need = preflight.memory_needed(s, size)
    need_mib = math.ceil(need / MIB)
    if (low := preflight.ram_per_rank_warning(s)) is not None:
        result.warnings.append(low)
    current = _int(facts.config.get("memory"), DEFAULT_MEMORY_MIB)
    rule = (
        f"the model's {size / 1024**3:.1f} GiB in tmpfs + {s.dp_size} ranks x "
        f"{s.ram_per_rank_gb:g} GiB of ram_per_rank_gb + pve-container's memory.high margin; "
        f"the model's size is the least of {sources}"
    )
    if node_mem is not None and need > node_mem:
        err(
            f"{host_name}: the container would need {need_mib} MiB = {rule}: more than the "
            f"node's MemTotal of {node_mem // MIB} MiB; accepted: fewer ranks (dp_size), less "
            "ram_per_rank_gb, or a node with more memory"
        )
        return False
    if current < need_mib:
        result.options.append(("memory", str(need_mib)))
        note(f"memory: {current} -> {need_mib} MiB = {rule}")
    else:
        note(f"memory: {current} MiB is enough for {need_mib} MiB = {rule}")
    swap = _int(facts.config.get("swap"), DEFAULT_SWAP_MIB)
    if swap != 0:
        result.options.append(("swap", "0"))
        note(f"swap: {swap} -> 0 MiB (tmpfs pages of the staged model must stay in memory)")

    return True


def _restart(s: Settings, facts: PveFacts, result: PvePlan) -> None:
    note = result.notes.append
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


def _driver(host_name: str, s: Settings, facts: PveFacts, result: PvePlan) -> None:
    """The container's NVIDIA user space: the node module's exact version."""
    err, note = result.errors.append, result.notes.append
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
            return
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


def _int(text: str | None, default: int) -> int:
    return int(text) if text is not None and text.strip().isdigit() else default


def summary(host_name: str, result: PvePlan, width: int = 80) -> str:
    """The plan as printed before any change, each line within `width` columns: a sentence
    wraps under its label, the `pct set` command comes one option a line (a shell line
    continued with a backslash, so it can be copied), each lxc.* line on its own."""
    title = f"{host_name}: container {result.ctid}: " + ("ready" if result.ok else "refused")
    lines = [title]
    lines += _wrapped([f"  {n}" for n in result.notes], width)
    if result.options:
        lines.append(f"  change: pct set {result.ctid} \\")
        options = [f"--{k} {shlex.quote(v)}" for k, v in result.options]
        lines += [f"      {o} \\" for o in options[:-1]] + [f"      {options[-1]}"]
    if result.raw_remove:
        lines.append(f"  change: remove from {CONFIG_FILE.format(ctid=result.ctid)}:")
        lines += _wrapped([f"      {ln}" for ln in result.raw_remove], width)
    if result.raw_lines:
        lines.append(f"  change: add to {CONFIG_FILE.format(ctid=result.ctid)}:")
        lines += _wrapped([f"      {ln}" for ln in result.raw_lines], width)
    if result.unit_steps:
        steps = ", ".join(result.unit_steps)
        lines.append(f"  change: {steps} {layout.NODE_UVM_UNIT} on the node")
    lines += _wrapped([f"  warning: {w}" for w in result.warnings], width)
    if result.ok and not result.config_changes:
        lines.append("  config: nothing to change")
    lines += _wrapped([f"  refused: {e}" for e in result.errors], width)
    return "\n".join(lines)


def _wrapped(lines: list[str], width: int) -> list[str]:
    """Each line wrapped at spaces within `width`, its continuation indented past its
    label ("  memory: "); a word longer than the width stays whole (a path, a URL)."""
    out: list[str] = []
    for line in lines:
        label = re.match(r"\s*(?:[a-z]+: )?", line)
        indent = " " * (len(label.group(0)) if label else 0)
        out += textwrap.wrap(
            line,
            width=max(width, 40),
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [line]
    return out
