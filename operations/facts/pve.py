"""What a Proxmox VE node says about itself and one of its containers (pve.py's facts).

Each fact is one round trip to the node, run as root. Sources for the formats are cited where
they are parsed; tests/facts/pve.*/ pins each parser to captured or source-derived outputs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout

# ----------------------------------------------------------------------------- PVE version


@dataclass(frozen=True)
class PveVersions:
    """`manager`: the Proxmox VE release (pve-manager); `container`: pve-container, which decides
    the config syntax (devN: entries exist from pve-container 5.0.7). None: not a Proxmox node."""

    manager: str | None = None
    container: str | None = None


# bin/pveversion (proxmox/pve-manager) prints "PACKAGE: VERSION" or
# "PACKAGE: VERSION (running version: ...)" / "(running kernel: ...)" per package with -v.
_PACKAGE_LINE = re.compile(r"^(?P<pkg>[a-z0-9][a-z0-9.+-]*): (?P<version>\S+)")


def parse_pveversion(lines: list[str]) -> PveVersions:
    found: dict[str, str] = {}
    for line in lines:
        match = _PACKAGE_LINE.match(line.strip())
        if match:
            found[match.group("pkg")] = match.group("version")
    return PveVersions(manager=found.get("pve-manager"), container=found.get("pve-container"))


class PveVersion(FactBase[PveVersions]):
    """
    Returns the Proxmox VE release and the pve-container version (``pveversion -v``).

    .. code:: python

        PveVersions(manager="8.1.4", container="5.0.8")
    """

    def command(self) -> str:
        # Never silent: pyinfra hands an empty output to default(), not to process().
        return "pveversion -v 2>/dev/null; true"

    @staticmethod
    def default() -> PveVersions:
        return PveVersions()

    def process(self, output: list[str]) -> PveVersions:
        return parse_pveversion(output)


# ----------------------------------------------------------------------------- kernel module

# /sys/module/nvidia/version is the bare version (NVIDIA's recommended source since the open
# modules); /proc/driver/nvidia/version's first line reads
#   "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  <date>" (proprietary) or
#   "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build ..." (open).
_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(?P<version>[0-9]+(?:\.[0-9]+)+)\s")
_BARE_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)+$")
SYS_MARKER = "@@sys="


def parse_module_version(lines: list[str]) -> str | None:
    for line in lines:
        if line.startswith(SYS_MARKER):
            bare = line[len(SYS_MARKER) :].strip()
            if _BARE_VERSION.match(bare):
                return bare
    for line in lines:
        match = _NVRM.search(line + " ")
        if match:
            return match.group("version")
    return None


class NvidiaModuleVersion(FactBase[str | None]):
    """
    Returns the version of the loaded NVIDIA kernel module, or None when none is loaded.

    .. code:: python

        "570.172.08"
    """

    def command(self) -> str:
        return (
            f'echo "{SYS_MARKER}$(cat /sys/module/nvidia/version 2>/dev/null)"; '
            "head -n1 /proc/driver/nvidia/version 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> str | None:
        return parse_module_version(output)


# ----------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class NvidiaDevices:
    """The node's NVIDIA character devices: the nodes under /dev and the majors the kernel gave
    each driver (/proc/devices; nvidia-uvm's and nvidia-caps' are dynamic, so they differ per
    host and boot)."""

    # Device nodes present on the node: /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-caps/..., sorted.
    nodes: list[str] = field(default_factory=list)
    # NVIDIA driver name from /proc/devices' "Character devices:" section -> major number.
    majors: dict[str, int] = field(default_factory=dict)
    # Every character device major /proc/devices lists, of any driver (sorted).
    all_majors: list[int] = field(default_factory=list)

    @property
    def gpus(self) -> list[str]:
        """GPU nodes /dev/nvidiaN, by N."""
        gpu = {i: n for n in self.nodes if (i := layout.gpu_index(n)) is not None}
        return [gpu[i] for i in sorted(gpu)]

    def major(self, *names: str) -> int | None:
        """The first of names that /proc/devices lists (nvidia-frontend is the newer name of
        nvidia, both 195)."""
        for name in names:
            if name in self.majors:
                return self.majors[name]
        return None


NODE_MARKER = "@@node="


def parse_devices(lines: list[str]) -> NvidiaDevices:
    nodes: list[str] = []
    majors: dict[str, int] = {}
    every: set[int] = set()
    section = None
    for line in lines:
        if line.startswith(NODE_MARKER):
            nodes.append(line[len(NODE_MARKER) :].strip())
            continue
        stripped = line.strip()
        if stripped.endswith("devices:"):
            section = stripped
            continue
        if section != "Character devices:":
            continue
        number, _, name = stripped.partition(" ")
        if number.isdigit():
            every.add(int(number))
        if number.isdigit() and name.strip().startswith("nvidia"):
            majors.setdefault(name.strip(), int(number))
    return NvidiaDevices(nodes=sorted(nodes), majors=majors, all_majors=sorted(every))


class NvidiaDeviceNodes(FactBase[NvidiaDevices]):
    """
    Returns the NVIDIA device nodes under /dev (character devices only) and the character
    device majors from /proc/devices, in one round trip.

    .. code:: python

        NvidiaDevices(nodes=["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"],
                      majors={"nvidia-frontend": 195, "nvidia-uvm": 510, ...})
    """

    def command(self) -> str:
        return (
            f"for n in {layout.GPU_NODE_GLOB} {layout.CAPS_DIR}/*; do "
            f'[ -c "$n" ] && echo "{NODE_MARKER}$n"; done; '
            "cat /proc/devices 2>/dev/null; true"
        )

    @staticmethod
    def default() -> NvidiaDevices:
        return NvidiaDevices()

    def process(self, output: list[str]) -> NvidiaDevices:
        return parse_devices(output)


# ----------------------------------------------------------------------------- the container


@dataclass(frozen=True)
class CtConfig:
    """`pct config CTID` as (key, value) pairs in its order (lxc.* entries repeat), or why there
    is none: kind "ct" (a container of this node), "vm" (the id is a virtual machine), "missing"."""

    kind: str
    entries: list[tuple[str, str]] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        for k, v in self.entries:
            if k == key:
                return v
        return None

    def values(self, key: str) -> list[str]:
        return [v for k, v in self.entries if k == key]

    def devices(self) -> dict[str, str]:
        """devN -> the device path of its entry (path is the property string's default key)."""
        return {k: e.path for k, e in self.device_entries().items()}

    def device_entries(self) -> dict[str, DevEntry]:
        """devN -> its entry, options parsed (see parse_dev_entry)."""
        return {k: parse_dev_entry(v) for k, v in self.entries if re.fullmatch(r"dev[0-9]+", k)}


@dataclass(frozen=True)
class DevEntry:
    """One devN entry: the device path and its other options, as written (mode, uid, gid,
    deny-write: proxmox/pve-container src/PVE/LXC/Config.pm, $dev_desc)."""

    path: str
    options: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        """The entry as a property string: the path first (the default key, printed bare as
        PVE::JSONSchema print_property_string does), then the options in sorted order."""
        return ",".join([self.path, *(f"{k}={self.options[k]}" for k in sorted(self.options))])


def parse_dev_entry(value: str) -> DevEntry:
    """`[path=]<Path>[,deny-write=<1|0>][,gid=<int>][,mode=<octal>][,uid=<int>]`: the value
    without a key is the path (its default_key)."""
    path = ""
    options: dict[str, str] = {}
    for part in value.split(","):
        key, eq, val = part.partition("=")
        if not eq:
            path = part.strip()
        elif key.strip() == "path":
            path = val.strip()
        else:
            options[key.strip()] = val.strip()
    return DevEntry(path, options)


KIND_MARKER = "@@kind="
# pct config prints "key: value" per option (sorted), then each lxc.* entry (PVE/CLI/pct.pm).
_CONFIG_LINE = re.compile(r"^(?P<key>[a-z][a-z0-9_.\-]*): ?(?P<value>.*)$")


def parse_ct_config(lines: list[str]) -> CtConfig:
    kind = "missing"
    entries: list[tuple[str, str]] = []
    for line in lines:
        if line.startswith(KIND_MARKER):
            kind = line[len(KIND_MARKER) :].strip()
            continue
        match = _CONFIG_LINE.match(line)
        if match:
            entries.append((match.group("key"), match.group("value")))
    return CtConfig(kind=kind, entries=entries if kind == "ct" else [])


class PctConfig(FactBase[CtConfig]):
    """
    Returns the container's configuration as ``pct config CTID`` prints it (pending changes
    applied), or whether the id belongs to a VM or to nothing on this node.

    + ctid: the container id

    .. code:: python

        CtConfig(kind="ct", entries=[("arch", "amd64"), ("memory", "2048"), ...])
    """

    def command(self, ctid: int) -> StringCommand:
        ct = QuoteString(f"/etc/pve/lxc/{int(ctid)}.conf")
        vm = QuoteString(f"/etc/pve/qemu-server/{int(ctid)}.conf")
        return StringCommand(
            "if [ -f",
            ct,
            f"]; then echo {KIND_MARKER}ct; pct config {int(ctid)}; elif [ -f",
            vm,
            f"]; then echo {KIND_MARKER}vm; else echo {KIND_MARKER}missing; fi",
        )

    @staticmethod
    def default() -> CtConfig:
        return CtConfig(kind="missing")

    def process(self, output: list[str]) -> CtConfig:
        return parse_ct_config(output)


class PctStatus(FactBase[str]):
    """
    Returns the container's state from ``pct status CTID``: "running", "stopped", or "unknown".

    + ctid: the container id
    """

    def command(self, ctid: int) -> str:
        return f"pct status {int(ctid)} 2>/dev/null || echo 'status: unknown'"

    @staticmethod
    def default() -> str:
        return "unknown"

    def process(self, output: list[str]) -> str:
        for line in output:
            if line.startswith("status:"):
                return line.partition(":")[2].strip() or "unknown"
        return "unknown"


# ----------------------------------------------------------------------------- inside the container


@dataclass(frozen=True)
class GuestState:
    """What pve.py reads about a container: the NVIDIA user-space driver version(s) found inside
    it (libcuda.so.VERSION, through `pct exec`), the model directory's size as the node measures
    it (the node's own du over /proc/PID/root: real blocks, never the apparent size a sparse
    file claims, and no binary of the container's), and the node's MemTotal in bytes."""

    running: bool
    driver_versions: list[str] = field(default_factory=list)
    model_bytes: int | None = None
    node_mem_bytes: int | None = None


GUEST_TIMEOUT_S = 120  # pct exec and the node's du: a hung container never hangs the run
_LIBCUDA = re.compile(r"libcuda\.so\.(?P<version>[0-9]+\.[0-9]+(?:\.[0-9]+)*)$")


def parse_guest(lines: list[str]) -> GuestState:
    mem = None
    for line in lines:
        if line.startswith("@@memtotal="):
            text = line.removeprefix("@@memtotal=").strip()
            mem = int(text) * 1024 if text.isdigit() else None  # /proc/meminfo says kB
    if "@@running" not in (line.strip() for line in lines):
        return GuestState(running=False, node_mem_bytes=mem)
    versions: set[str] = set()
    size = None
    for line in lines:
        if line.startswith("@@model="):
            text = line.removeprefix("@@model=").strip().split("\t")[0]
            size = int(text) if text.isdigit() else None
            continue
        match = _LIBCUDA.search(line.strip())
        if match:
            versions.add(match.group("version"))
    return GuestState(
        running=True, driver_versions=sorted(versions), model_bytes=size, node_mem_bytes=mem
    )


class GuestDriver(FactBase[GuestState]):
    """
    Returns, for a running container, the user-space driver versions (libcuda.so.VERSION under
    the library directories) and the size of a model directory, through ``pct exec``.

    + ctid: the container id
    + model_dir: a directory inside the container to measure, or None
    """

    def command(self, ctid: int, model_dir: str | None) -> StringCommand:
        ct = int(ctid)
        probe = (
            "for f in /usr/lib/x86_64-linux-gnu/libcuda.so.* /usr/lib64/libcuda.so.* "
            '/usr/lib/libcuda.so.*; do [ -f "$f" ] && [ ! -L "$f" ] && echo "$f"; done; '
        )
        # The model's size is measured by the node, not by the container (whose root could fake
        # du): the node's du over the container's root (/proc/PID/root of its init, lxc-info
        # -p), counting real blocks (-B1 without --apparent-size), so a sparse file counts what
        # it holds, not the terabytes it claims. pve.py caps it at the knowledge base's size
        # and at the node's MemTotal. `pct exec` is bounded: a container that hangs it cannot
        # hang the run.
        measure = ""
        if model_dir:
            where = shlex.quote(model_dir.rstrip("/") or "/")
            measure = (
                f"pid=$(lxc-info -n {ct} -p -H 2>/dev/null); "
                f'[ -n "$pid" ] && [ -d "/proc/$pid/root"{where} ] && echo "@@model=$(timeout '
                f'{GUEST_TIMEOUT_S} du -s -B1 "/proc/$pid/root"{where} 2>/dev/null | cut -f1)"; '
            )
        return StringCommand(
            "echo \"@@memtotal=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)\"; "
            f"if pct status {ct} 2>/dev/null | grep -qx 'status: running'; then "
            f"echo @@running; timeout {GUEST_TIMEOUT_S} pct exec {ct} -- sh -c",
            QuoteString(probe + "true"),
            f"; {measure}fi; true",
        )

    @staticmethod
    def default() -> GuestState:
        return GuestState(running=False)

    def process(self, output: list[str]) -> GuestState:
        return parse_guest(output)


# ----------------------------------------------------------------------------- the node's boot


@dataclass(frozen=True)
class NodeUnitState:
    """The node's UVM boot unit (layout.NODE_UVM_UNIT): its file's sha256 (None: absent),
    `systemctl is-enabled` / `is-active` answers, and where nvidia-modprobe is (None: not on
    PATH)."""

    sha256: str | None = None
    enabled: str = ""
    active: str = ""
    modprobe: str | None = None


def parse_node_unit(lines: list[str]) -> NodeUnitState:
    found: dict[str, str] = {}
    for line in lines:
        if line.startswith("@@") and "=" in line:
            key, _, value = line[2:].partition("=")
            found[key] = value.strip()
    digest = found.get("sha256", "")
    return NodeUnitState(
        sha256=digest if re.fullmatch(r"[0-9a-f]{64}", digest) else None,
        enabled=found.get("enabled", ""),
        active=found.get("active", ""),
        modprobe=found.get("modprobe") or None,
    )


class NodeUvmUnit(FactBase[NodeUnitState]):
    """
    Returns the state of the node's UVM boot unit and the path of nvidia-modprobe.

    .. code:: python

        NodeUnitState(sha256="ab...", enabled="enabled", active="active",
                      modprobe="/usr/bin/nvidia-modprobe")
    """

    def command(self) -> str:
        unit = layout.NODE_UVM_UNIT
        path = shlex.quote(layout.unit_path(unit))
        return (
            f"[ -f {path} ] && echo \"@@sha256=$(sha256sum < {path} | cut -d' ' -f1)\"; "
            f'echo "@@enabled=$(systemctl is-enabled {unit} 2>/dev/null)"; '
            f'echo "@@active=$(systemctl is-active {unit} 2>/dev/null)"; '
            'echo "@@modprobe=$(command -v nvidia-modprobe)"; true'
        )

    @staticmethod
    def default() -> NodeUnitState:
        return NodeUnitState()

    def process(self, output: list[str]) -> NodeUnitState:
        return parse_node_unit(output)
