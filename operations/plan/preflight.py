"""Preflight: is this host fit to run the plan? Pure checks over gathered facts.

Each failure says what was expected, what was found and how to fix it. A host with any
failure gets no change at all (deploy.py stops it before the first change).
"""

from __future__ import annotations

from dataclasses import dataclass

from operations import layout
from operations.facts.gpu import PROBE_UNIT, GpuAccess, NodeAccess, NvidiaSmi
from operations.facts.host import Model, PathStat, Resources
from operations.kb import Knowledge, version
from operations.render import units
from operations.settings import Settings

GIB = 1024**3
# tmpfs bookkeeping and small files beside the weights: a copy needs 2% more than its size.
STAGE_HEADROOM = 1.02
# A fresh engine environment (torch + CUDA libraries + kernels) takes about 12 GB.
ENGINE_ENV_BYTES = 15 * GIB

MISMATCH_FIX = (
    "the container's NVIDIA user-space libraries must be the exact version of the host's kernel "
    "module: on the Proxmox node run 'cat /proc/driver/nvidia/version' and install the same "
    "driver version inside the container (user space only, --no-kernel-module)"
)
NO_DRIVER_FIX = (
    "pass the GPUs into the container (lxc.cgroup2.devices.allow c 195:* rwm and bind-mount "
    f"{layout.GPU_NODE_GLOB}) and check that the node's driver is loaded (nvidia-smi on the node)"
)


NESTING_FIX = (
    "on the Proxmox node turn on nesting for the container (pct set CTID --features nesting=1, "
    "or pve.py with pve_nesting: true) and restart it: without it the AppArmor profile denies "
    "the mounts a sandboxed unit needs (pve-container make_apparmor_config)"
)


@dataclass(frozen=True)
class Failure:
    check: str
    expected: str
    found: str
    fix: str


@dataclass(frozen=True)
class StageRoom:
    """How a model copy fits the tmpfs: the plan prints it, the model step follows it.

    mode "beside": the new copy goes next to the current one, servers keep running until the
    switch; "inplace": the current copy is removed first, with the servers stopped; None: it
    does not fit either way (why says so, with the numbers).
    """

    mode: str | None
    copy_bytes: int
    why: str


def ram_per_rank(settings: Settings) -> int:
    return int(settings.ram_per_rank_gb * GIB)


def model_bytes(settings: Settings, kb: Knowledge, measured: int | None) -> int | None:
    """The model's size: as measured on the host, else the knowledge base's size_gb for
    model_name, else unknown."""
    known = kb.models.get(settings.model_name)
    if measured is None and known is not None and known.size_gb is not None:
        return int(known.size_gb * 1e9)
    return measured


# pve-container sets memory.high below the configured memory (memory.max): 128 MiB below it from
# 16 GiB up, 1016/1024 of it below 16 GiB (proxmox/pve-container src/PVE/LXC/Config.pm,
# calculate_memory_constraints). Above memory.high the container is throttled and reclaimed hard.
HIGH_MARGIN = 128 * 1024**2
HIGH_MARGIN_FROM = 16 * GIB


def memory_high(limit: int) -> int:
    """The memory.high pve-container derives from a container memory (memory.max) of limit bytes."""
    return limit - HIGH_MARGIN if limit >= HIGH_MARGIN_FROM else limit * 1016 // 1024


def memory_in_use(settings: Settings, size: int) -> int:
    """What the deploy keeps in the container's memory: the model staged in tmpfs (its pages count
    against the limit) plus dp_size ranks of ram_per_rank_gb."""
    return size + settings.dp_size * ram_per_rank(settings)


# SGLang's host memory per server beside the weights, as docs/model.md ("Host memory per rank")
# derives it: the default of ram_per_rank_gb; a value below it is warned about.
RAM_PER_RANK_FLOOR_GB = 4.0


def ram_per_rank_warning(settings: Settings) -> str | None:
    """The plan's warning when ram_per_rank_gb is below RAM_PER_RANK_FLOOR_GB (pve.py's plan and
    the container's both show it)."""
    if settings.ram_per_rank_gb >= RAM_PER_RANK_FLOOR_GB:
        return None
    return (
        f"ram_per_rank_gb = {settings.ram_per_rank_gb:g} (set in "
        f"{settings.origin('ram_per_rank_gb')}) is below {RAM_PER_RANK_FLOOR_GB:g} GiB, SGLang's "
        "host memory per server beside the weights (docs/model.md): ranks may be throttled at "
        "memory.high or OOM-killed"
    )


def memory_needed(settings: Settings, size: int) -> int:
    """The smallest container memory limit (memory.max) whose memory.high still holds
    memory_in_use: pve.py sizes the container by it, preflight judges the container by it."""
    use = memory_in_use(settings, size)
    if use + HIGH_MARGIN >= HIGH_MARGIN_FROM:
        return use + HIGH_MARGIN
    return -(-use * 1024 // 1016)


def stage_room(
    settings: Settings, resources: Resources, size: int, copy_bytes: int, current_bytes: int
) -> StageRoom:
    """The one capacity rule for staging: free tmpfs space and the memory limit, with headroom.

    size: the whole model; copy_bytes: what must be copied (unchanged files are hard links to
    the current copy); current_bytes: the current copy, freed by an in-place swap.
    """
    free = resources.stage_free_bytes
    limit = resources.memory_limit_bytes
    ranks = settings.dp_size * ram_per_rank(settings)
    need = int(copy_bytes * STAGE_HEADROOM)
    # Both copies and the ranks must fit under memory.high, as memory_needed's rule does.
    in_memory = current_bytes + copy_bytes + ranks
    if (free is None or free >= need) and (limit is None or memory_high(limit) >= in_memory):
        return StageRoom("beside", copy_bytes, f"{_gib(copy_bytes)} to copy, {_gib(free)} free")
    beside_why = (
        f"{_gib(need)} needed beside the current copy ({_gib(current_bytes)}), "
        f"{_gib(free)} free in {settings.model_stage_dir}, memory limit {_gib(limit)}"
    )
    whole = int(size * STAGE_HEADROOM)
    if current_bytes and (free is None or free + current_bytes >= whole):
        return StageRoom("inplace", size, f"{beside_why}: replacing it with the servers stopped")
    return StageRoom(
        None,
        copy_bytes,
        f"the model needs {_gib(need)} = {need} bytes in {settings.model_stage_dir}; "
        f"{_gib(free)} = {free} bytes free (current copy {_gib(current_bytes)}); "
        "nothing was copied",
    )


def root_paths(settings: Settings) -> list[tuple[str, str]]:
    """(setting, path) for every directory root writes or runs under on the host: the engine
    root (its `tools/bin/uv` runs as root while facts are read), the stage dir, the source
    cache and the hub CLI's environment (when the source uses them), the deploy's scripts and
    its configuration. HostResources lstats every component of each (unsafe_roots judges)."""
    s = settings
    roots = [("engine_root", s.engine_root), ("model_stage_dir", s.model_stage_dir)]
    if s.source.kind != "target":
        roots.append(("model_cache_dir", s.model_cache_dir))
    if s.source.kind == "hf":
        roots.append(("model_hub_cli", layout.hub_cli_venv(s.model_hub_cli)))
    roots += [("scripts dir", layout.SCRIPT_DIR), ("config dir", layout.CONFIG_DIR)]
    return roots


def gpu_nodes(settings: Settings) -> list[str]:
    """The nodes a deploy's ranks open: the driver's control nodes and every GPU's."""
    return [*layout.CUDA_NODES, *(layout.gpu_node(i) for i in range(settings.gpu_count))]


def access_probe(settings: Settings) -> tuple[str, list[str], list[tuple[str, str]]]:
    """What GpuNodeAccess is asked: the service user, the nodes, rank 0's own sandbox."""
    return (
        settings.service_user,
        gpu_nodes(settings),
        units.rank_sandbox(settings.service_user, 0, None),
    )


def _node_text(node: NodeAccess) -> str:
    return f"{node.path} (owner {node.uid}:{node.gid}, mode {node.mode:04o})"


def _node_fix(nodes: list[NodeAccess]) -> str:
    lines = "; ".join(f"pct set CTID --devN {n.path},mode=0666" for n in nodes)
    return (
        f"on the Proxmox node give each node mode 0666 in the container's config ({lines}: N "
        "is the entry that passes that node; `.venv/bin/pyinfra inventory/pve.py pve.py` "
        "writes them so), then restart the container; a chmod inside the container is lost at "
        "its next start (pve-container makes the nodes 0660 root:root when a devN names no mode)"
    )


def denied_nodes(settings: Settings, access: GpuAccess) -> list[NodeAccess]:
    """The nodes the service user cannot open read-write. An existing user: what opening
    them in the probe unit gave (EACCES: mode, owner, group or ACL). A user still to be made
    (a new system user in a group of its own, never a node's owner or group): only the
    node's bits for other users count."""
    found = []
    for path in gpu_nodes(settings):
        node = access.nodes.get(path)
        if node is None:
            continue  # a missing node: the "GPU device nodes" check names it
        if access.user_ids is not None and node.opened is not None:
            denied = node.opened == "EACCES"
        elif access.user_ids is not None:
            uid, gid, groups = access.user_ids
            bits = 6 if node.uid == uid else 3 if {gid, *groups} & {node.gid} else 0
            denied = (node.mode >> bits) & 0o6 != 0o6
        else:
            denied = node.mode & 0o6 != 0o6 or node.opened == "EACCES"
        if denied:
            found.append(node)
    return found


def filter_holds(settings: Settings, access: GpuAccess) -> bool | None:
    """Whether a rank's DeviceAllow= holds: in the probe (rank 0's sandbox) a GPU node outside
    it gave EPERM (True) or opened (False); None when no such node was tried. systemd only
    logs "Proceeding WITHOUT applying ACL (all devices will be accessible)!" for the first
    unit with a device ACL since it started (systemd src/core/cgroup.c, the warning after
    bpf_devices_apply_policy), and nothing at all where the devices controller of cgroup v1
    is not delegated: opening the node is the only proof."""
    others = [access.nodes.get(layout.gpu_node(i)) for i in range(1, settings.gpu_count)]
    results = [n.opened for n in others if n is not None and n.opened in ("ok", "EPERM")]
    if not results:
        return None
    return all(r == "EPERM" for r in results)


def access_warnings(settings: Settings, access: GpuAccess | None) -> list[str]:
    """What the plan must say about isolation between ranks."""
    if access is None or filter_holds(settings, access) is not False:
        return []
    return [
        "GPU isolation: systemd in this container cannot apply a rank's DeviceAllow= (a "
        f"transient unit allowed only {layout.gpu_node(0)} opened the other GPUs): every rank "
        "can open every GPU of the container. The ranks still each use their own GPU (CUDA_VISIBLE_"
        "DEVICES), but nothing enforces it"
    ]


def access_failures(settings: Settings, access: GpuAccess | None) -> list[Failure]:
    s = settings
    if access is None or not access.asked:
        return []
    failures = []
    denied = denied_nodes(s, access)
    if denied:
        who = (
            f"{s.service_user} (uid {access.user_ids[0]})"
            if access.user_ids
            else f"{s.service_user} (to be made: a new system user, not the owner or group of "
            "any node)"
        )
        failures.append(
            Failure(
                "GPU access",
                f"{who} can open {', '.join(gpu_nodes(s))} read-write: the ranks run as "
                f"{s.service_user}, and a root check proves nothing for them",
                "; ".join(_node_text(n) for n in denied),
                _node_fix(denied),
            )
        )
    if access.probe_rc == 226:
        failures.append(
            Failure(
                "rank sandbox",
                f"a transient unit ({PROBE_UNIT}) with a rank unit's sandbox (ProtectSystem="
                "strict, PrivateTmp, ...) starts in this container",
                "exit status 226/NAMESPACE: systemd could not set up the unit's mount "
                f"namespace ({access.probe_error or 'no message'})",
                NESTING_FIX,
            )
        )
    elif access.probe_rc not in (None, 0):
        failures.append(
            Failure(
                "rank sandbox",
                f"a transient unit ({PROBE_UNIT}) with a rank unit's sandbox runs as "
                f"{s.service_user} and opens the GPU nodes",
                f"exit status {access.probe_rc}: {access.probe_error or 'no message'}",
                "run the deploy on a systemd host whose systemd-run works (journalctl -u "
                f"'{PROBE_UNIT}-*' says why it failed); a sandbox that cannot start here "
                f"cannot start a rank either: {NESTING_FIX}",
            )
        )
    return failures


def _components(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _component_problem(st: PathStat, sticky_ok: bool) -> str | None:
    if st.uid != 0:
        return f"owned by uid {st.uid}, not root"
    if st.is_link:
        return None  # a link's own mode means nothing; what it points to is walked too
    if st.mode & 0o002 and not (sticky_ok and st.mode & 0o1000):
        return f"writable by every user (mode {st.mode:o})"
    if st.mode & 0o020 and st.gid != 0:
        return f"writable by group {st.gid} (mode {st.mode:o})"
    return None


def unsafe_roots(settings: Settings, resources: Resources) -> list[tuple[str, str, str, str]]:
    """(setting, path, component, why) for every existing component of a root path (as
    written, and as it resolves) that is not root's alone: another user could replace what is
    below it. The stage dir itself may be sticky and world-writable, as /dev/shm is (the
    staging script makes and checks its models tree)."""
    found: list[tuple[str, str, str, str]] = []
    for key, path in root_paths(settings):
        chains = [path]
        real = resources.resolved.get(path)
        if real and real != path:
            chains.append(real)
        seen: set[str] = set()
        for chain in chains:
            for component in _components(chain):
                st = resources.components.get(component)
                if st is None or component in seen:
                    continue
                seen.add(component)
                sticky_ok = key == "model_stage_dir" and component in (path, real)
                why = _component_problem(st, sticky_ok)
                if why:
                    found.append((key, path, component, why))
    return found


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def check(
    settings: Settings,
    kb: Knowledge,
    gpu: NvidiaSmi,
    resources: Resources,
    model: Model,
    access: GpuAccess | None = None,
) -> list[Failure]:
    s = settings
    failures: list[Failure] = []

    def fail(check: str, expected: str, found: str, fix: str) -> None:
        failures.append(Failure(check, expected, found, fix))

    if not gpu.ok:
        error = gpu.error or "no output"
        if "mismatch" in error.lower():
            fix = MISMATCH_FIX
        elif "not found" in error.lower():
            fix = "install the NVIDIA driver user space (nvidia-smi) in the container"
        else:
            fix = NO_DRIVER_FIX
        fail("nvidia-smi answers", "a list of GPUs", error, fix)
    else:
        if len(gpu.gpus) != s.gpu_count:
            fail(
                "GPU count",
                f"{s.gpu_count} GPUs (gpu_count)",
                f"{len(gpu.gpus)}: {', '.join(sorted({g.name for g in gpu.gpus})) or 'none'}",
                "pass every GPU into the container, or set gpu_count (and dp_size) to match",
            )
        if gpu.cuda_version is None:
            fail(
                "CUDA user space",
                "nvidia-smi's banner naming the CUDA version the driver supports",
                "CUDA Version: N/A (libcuda is not visible in the container)",
                "install the driver's user-space libraries in the container (libcuda.so.1, the "
                "same version as the node's driver; the NVIDIA .run with --no-kernel-module)",
            )
        wrong = [g for g in gpu.gpus if g.compute_cap != s.gpu_compute_cap]
        if wrong:
            caps = ", ".join(sorted({f"{g.name} ({g.compute_cap})" for g in wrong}))
            chip = kb.gpus.get(s.gpu_compute_cap)
            arch = chip.arch if chip else s.gpu_compute_cap
            fail(
                "compute capability",
                f"{s.gpu_compute_cap} ({arch}) on every GPU (gpu_compute_cap)",
                caps,
                "this deploy is planned for another GPU: set gpu_compute_cap for this host, "
                "after checking the knowledge base supports it",
            )

    for key, path, component, why in unsafe_roots(s, resources):
        fail(
            "root-only paths",
            f"{key} {path} and every directory above it owned by root and writable by root "
            "only (root writes or runs what is under it)",
            f"{component}: {why}",
            f"chown root:root {component} && chmod go-w {component}"
            + (f", or set {key} to a directory only root writes to" if "_" in key else ""),
        )

    expected_nodes = [*layout.CUDA_NODES, *(layout.gpu_node(i) for i in range(s.gpu_count))]
    missing = [n for n in expected_nodes if n not in resources.device_nodes]
    if missing:
        fail(
            "GPU device nodes",
            ", ".join(expected_nodes),
            f"missing {', '.join(missing)}",
            f"add the nodes to the container's config (lxc.mount.entry: {layout.GPU_NODE_PREFIX}N "
            "... bind), "
            "nvidia-uvm included: CUDA needs it",
        )

    failures += access_failures(s, access)

    size = model_bytes(s, kb, model.size_bytes)
    source = s.source
    where = source.controller_dir if source.kind == "controller" else source.target_dir
    on = "the controller" if source.kind == "controller" else "the target"
    if source.kind == "hf" and not model.exists:
        pass  # downloaded by the model step; its size comes from the knowledge base until then
    elif not model.exists:
        fail(
            "model source",
            f"a model directory at {where} on {on} (model_source {s.model_source})",
            "no such directory",
            "mount the weights into the container at model_source, or set model_source",
        )
    elif model.architecture is None:
        fail(
            "model config",
            f"{where}/config.json naming the architecture",
            model.config_error or "unreadable",
            "point model_source at a Hugging Face model directory (config.json + shards)",
        )

    if size is not None:
        need = int(size * STAGE_HEADROOM)
        if resources.stage_total_bytes is not None and resources.stage_total_bytes < need:
            fail(
                f"{s.model_stage_dir} size",
                f">= {_gib(need)} = {need} bytes (the model, {_gib(size)}, plus 2%); "
                "nothing was copied",
                _gib(resources.stage_total_bytes),
                f"enlarge the tmpfs (mount -o remount,size=... {s.model_stage_dir}, or the "
                "container's /dev/shm size) or set model_stage_dir",
            )
        limit = resources.memory_limit_bytes
        needed = memory_needed(s, size)
        if limit is not None and limit < needed:
            fail(
                "container memory",
                f">= {_gib(needed)} (model {_gib(size)} in tmpfs + {s.dp_size} ranks x "
                f"{_gib(ram_per_rank(s))}, ram_per_rank_gb, + Proxmox's 128 MiB memory.high "
                "margin)",
                _gib(limit),
                "raise the container's memory limit (pct set CTID --memory MiB): /dev/shm "
                "pages count against it",
            )

    release = kb.releases.get(s.sglang_version)
    if release is not None:
        floor = release.glibc
        if resources.glibc is None or version(resources.glibc) < version(floor):
            fail(
                "glibc",
                f">= {floor} (the wheels of sglang {s.sglang_version} need it)",
                resources.glibc or "unknown",
                "use a newer distribution in the container (Debian 12 has 2.36)",
            )
        # The engine is locked and built for the host's own Python (uv never downloads one).
        if resources.python is not None and release.python.minor_of(resources.python) is None:
            supported = ", ".join(release.python.versions)
            fail(
                "Python",
                f"python3 {supported} (sglang {s.sglang_version} is built for these only: "
                f"{release.python.why})",
                resources.python,
                f"install python3 {supported} (with python3-venv) in the container (Debian 12 "
                "has 3.11, Ubuntu 24.04 3.12), or pin a release built for this one",
            )
    if resources.systemd is None:
        fail("systemd", "systemd as init", "not found", "run a systemd-based container")
    if resources.rocm:
        fail(
            "rocm",
            "no /opt/rocm in the container",
            "/opt/rocm exists",
            "remove it (or run the engine where it is absent): apache-tvm-ffi, which compiles "
            "SGLang's own kernels at run time, takes /opt/rocm as a ROCm host and runs hipcc "
            "instead of the engine's nvcc (https://github.com/sgl-project/sglang/issues/30120)",
        )
    if resources.engine_free_bytes is not None and resources.engine_free_bytes < ENGINE_ENV_BYTES:
        fail(
            "disk for engines",
            f">= {_gib(ENGINE_ENV_BYTES)} free under {s.engine_root}",
            _gib(resources.engine_free_bytes),
            "free disk space or grow the container's root disk (pct resize)",
        )
    return failures
