"""What the host's NVIDIA driver reports: one nvidia-smi round trip for all GPUs."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout
from operations.render import host_scripts

QUERY_FIELDS = ("index", "name", "compute_cap", "memory.total", "driver_version", "uuid")
RC_MARKER = "@@nvidia-smi-rc="
_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9.]+|N/A|Not Found)")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str
    memory_total_mib: int
    uuid: str


@dataclass(frozen=True)
class NvidiaSmi:
    """`ok` False means nvidia-smi did not answer; `error` then holds what it printed."""

    ok: bool
    error: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    # The highest CUDA version the driver supports, from the banner; None when it says N/A.
    cuda_version: str | None = None


def parse_nvidia_smi(lines: list[str]) -> NvidiaSmi:
    rc = None
    csv_lines: list[str] = []
    banner: list[str] = []
    for line in lines:
        if line.startswith(RC_MARKER):
            rc = int(line[len(RC_MARKER) :].strip() or "1")
        elif rc is None:
            csv_lines.append(line)
        else:
            banner.append(line)

    if rc != 0:
        text = " ".join(s.strip() for s in csv_lines if s.strip()) or f"exit status {rc}"
        return NvidiaSmi(ok=False, error=text)

    gpus: list[Gpu] = []
    drivers: set[str] = set()
    for line in csv_lines:
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS) or not cells[0].isdigit():
            return NvidiaSmi(ok=False, error=f"unexpected nvidia-smi output: {line.strip()!r}")
        index, name, cap, memory, driver, uuid = cells
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                compute_cap=cap,
                memory_total_mib=int(memory) if memory.isdigit() else 0,
                uuid=uuid,
            )
        )
        drivers.add(driver)

    cuda = None
    for line in banner:
        match = _CUDA_RE.search(line)
        if match:
            cuda = match.group(1) if match.group(1)[0].isdigit() else None
            break

    return NvidiaSmi(
        ok=True,
        gpus=gpus,
        # One driver serves every GPU; more than one would be a broken host, shown as such.
        driver_version=", ".join(sorted(drivers)) or None,
        cuda_version=cuda,
    )


class NvidiaGpus(FactBase[NvidiaSmi]):
    """
    Returns the GPUs, the driver version and the CUDA version the driver supports, or what
    nvidia-smi said when it could not answer (``ok`` False).

    .. code:: python

        NvidiaSmi(ok=True, gpus=[Gpu(index=0, name="NVIDIA RTX PRO 6000 Blackwell ...",
                  compute_cap="12.0", memory_total_mib=97887, uuid="GPU-...")],
                  driver_version="570.172.08", cuda_version="12.8")
    """

    # Both queries in one round trip; the exit status travels as a marker line so that a
    # failing nvidia-smi is a fact to report, not a failed fact gathering.
    def command(self) -> str:
        return f"{self.query_command()}; {self.banner_command()}"

    @staticmethod
    def query_command() -> str:
        """The GPU table and, after it, the exit status's marker line."""
        fields = ",".join(QUERY_FIELDS)
        return (
            f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1; "
            f'echo "{RC_MARKER}$?"'
        )

    @staticmethod
    def banner_command() -> str:
        """The banner's CUDA line (the driver's CUDA version: no --query-gpu field holds it).
        Independent of the query: PreflightFacts runs the two at once, each nvidia-smi
        initialising NVML for every GPU on its own."""
        return "nvidia-smi 2>/dev/null | grep -m1 'CUDA Version' || true"

    @staticmethod
    def default() -> NvidiaSmi:
        return NvidiaSmi(ok=False, error="nvidia-smi printed nothing")

    def process(self, output: list[str]) -> NvidiaSmi:
        return parse_nvidia_smi(output)


# -- who can open the GPUs ------------------------------------------------------------------
# The ranks run as the service user, in their unit's sandbox: a node that root opens proves
# nothing about them. GpuAccess reads each node's owner and mode and, in one transient unit
# with a rank's own sandbox (operations/render/units.py rank_sandbox, rank 0's DeviceAllow=), opens
# every node read-write as the service user (`nobody` while that user does not exist yet):
# EACCES is the node's mode, EPERM a device filter that holds (a node outside DeviceAllow=),
# exit status 226 a sandbox this container cannot set up (systemd.exec(5) EXIT_NAMESPACE).

PROBE_UNIT = "sglang-deploy-gpu-probe"
# What the probe unit runs (its text holds no `%` or `$`: systemd would expand them there).
PROBE_SCRIPT = "gpu_open.py"


@dataclass(frozen=True)
class NodeAccess:
    path: str
    uid: int
    gid: int
    mode: int
    # What opening it read-write in the probe unit gave: "ok", "EACCES", "EPERM", ...; None
    # when the probe did not run or did not reach it.
    opened: str | None = None


@dataclass(frozen=True)
class GpuAccess:
    """`user_ids` (uid, gid, groups) of the service user; None while it does not exist.
    `probe_rc`: the probe unit's exit status (None: not run); `probe_error` what
    systemd-run said when it failed."""

    user_ids: tuple[int, int, tuple[int, ...]] | None = None
    nodes: dict[str, NodeAccess] = field(default_factory=dict)
    probe_rc: int | None = None
    probe_error: str | None = None

    @property
    def asked(self) -> bool:
        return bool(self.nodes) or self.probe_rc is not None


def parse_gpu_access(lines: list[str]) -> GpuAccess:
    user_ids = None
    stats: dict[str, tuple[int, int, int]] = {}
    opened: dict[str, str] = {}
    rc = None
    error: list[str] = []
    for line in lines:
        key, _, value = line.partition("=")
        if key == "svc":
            parts = value.strip().split("|")
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                groups = tuple(int(g) for g in parts[2].split(",") if g.isdigit())
                user_ids = (int(parts[0]), int(parts[1]), groups)
        elif key == "node":
            parts = value.strip().split("|")
            if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
                try:
                    stats[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3], 8))
                except ValueError:
                    continue
        elif key == "open":
            path, _, result = value.strip().rpartition("|")
            if path:
                opened[path] = result
        elif key == "cached":
            continue
        elif key == "probe_rc":
            rc = int(value) if value.strip().isdigit() else None
        elif line.strip():
            error.append(line.strip())
    nodes = {
        path: NodeAccess(path, uid, gid, mode, opened.get(path))
        for path, (uid, gid, mode) in stats.items()
    }
    return GpuAccess(
        user_ids=user_ids,
        nodes=nodes,
        probe_rc=rc,
        probe_error=" / ".join(error[-3:]) or None if rc not in (None, 0) else None,
    )


class GpuNodeAccess(FactBase[GpuAccess]):
    """
    Returns the owner and mode of each NVIDIA node and whether the service user, in a rank's
    sandbox, can open it read-write (one transient unit, removed when it ends).

    .. code:: python

        GpuAccess(user_ids=(998, 998, (998,)),
                  nodes={"/dev/nvidia0": NodeAccess("/dev/nvidia0", 0, 0, 0o660, "EACCES")},
                  probe_rc=0)

    + user: the service user (the probe runs as `nobody` while it does not exist)
    + nodes: the nodes to open (missing ones are skipped)
    + properties: the rank unit's sandbox, (key, value) pairs as `systemd-run -p` takes them
    """

    def command(
        self, user: str, nodes: list[str], properties: list[tuple[str, str]]
    ) -> StringCommand:
        probe: list[str | QuoteString] = [
            f"systemd-run --wait --pipe --collect --quiet --unit={PROBE_UNIT}-$$",
            ' -p User="$run_as"',
        ]
        for key, value in properties:
            probe += [" -p ", QuoteString(f"{key}={value}")]
        probe += [
            f" {layout.SYSTEM_PYTHON} -c ",
            QuoteString(host_scripts.script_text(PROBE_SCRIPT)),
        ]
        # What the probe is: a new sandbox or script is a new cache key.
        digest = hashlib.sha256(
            StringCommand(*probe, _separator="").get_raw_value().encode()
        ).hexdigest()
        words: list[str | QuoteString] = ["u=", QuoteString(user), "; set --"]
        for node in nodes:
            words += [" ", QuoteString(node)]
        words += [
            f"; d={layout.PROBE_CACHE_DIR}; k={digest[:16]}; ",
            _ACCESS_SCRIPT,
            " out=$(",
            *probe,
            ' "$@" 2>&1 </dev/null; echo "probe_rc=$?"); ',
            _CACHE_SAVE,
        ]
        return StringCommand(*words, _separator="")

    @staticmethod
    def default() -> GpuAccess:
        return GpuAccess()

    def process(self, output: list[str]) -> GpuAccess:
        return parse_gpu_access(output)


# $u: the service user; "$@": the nodes; $d: the cache directory; $k: the probe's digest.
# The unit name carries the shell's pid ($$), so two probes never share one; --collect removes
# it even when it failed. A probe that passed is kept under /run (gone at the next boot), named
# by a key of the boot, the user's ids, each node's owner, mode and ctime (a chmod, chown or
# setfacl changes it) and the probe itself: a converged deploy starts no unit. The directory is
# root's, 0700, never a link, or the cache is not used.
_ACCESS_SCRIPT = " ".join(
    (
        'svc=; if id -u "$u" >/dev/null 2>&1; then',
        'svc="svc=$(id -u "$u")|$(id -g "$u")|$(id -G "$u" | tr " " ,)"; echo "$svc"; run_as=$u;',
        "else run_as=nobody; fi;",
        'for n in "$@"; do [ -c "$n" ] && stat -c "node=%n|%u|%g|%a" -- "$n"; done;',
        'key=$( { cat /proc/sys/kernel/random/boot_id; echo "$svc $k";',
        'for n in "$@"; do stat -c "%n|%u|%g|%a|%Z|%t|%T" -- "$n" 2>/dev/null; done; }',
        "| sha256sum | cut -c1-32); c=$d/gpu-probe-$key;",
        'safe() { [ -d "$d" ] && [ ! -L "$d" ] && [ "$(stat -c %u:%a "$d")" = 0:700 ]; };',
        'if safe && [ -f "$c" ] && [ ! -L "$c" ]; then cat "$c"; echo cached=1;',
        "elif [ -d /run/systemd/system ] && command -v systemd-run >/dev/null; then",
    )
)
_CACHE_SAVE = " ".join(
    (
        'printf "%s\\n" "$out";',
        'case $out in *"probe_rc=0")',
        '{ [ -e "$d" ] || [ -L "$d" ] || mkdir -m 700 "$d"; } 2>/dev/null;',
        'if safe; then rm -f "$d"/gpu-probe-*;',
        'printf "%s\\n" "$out" > "$c.tmp" && mv -f "$c.tmp" "$c"; fi;; esac; fi; true',
    )
)
