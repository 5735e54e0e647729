"""Preflight: is this host fit to run the plan? Pure checks over gathered facts.

Each failure says what was expected, what was found and how to fix it. A host with any
failure gets no change at all (deploy.py stops it before the first change).
"""

from __future__ import annotations

from operations import layout
from operations.facts.gpu import PROBE_UNIT, GpuAccess, NodeAccess, NvidiaSmi
from operations.facts.host import Model, PathStat, Resources
from operations.kb import Knowledge, version
from operations.plan.capacity import GIB, STAGE_HEADROOM, gib, ram_per_rank

# The container's memory rule, as pve.py and preflight's checks both use it.
from operations.plan.capacity import memory_high as memory_high
from operations.plan.capacity import memory_needed as memory_needed
from operations.plan.preflight_source import ControllerTools as ControllerTools
from operations.plan.preflight_source import Failure as Failure
from operations.plan.preflight_source import controller_failures, source_failures
from operations.programs.tokenizer_files import TOKENIZER_FILES
from operations.render import units
from operations.settings import Settings

# A fresh engine environment (torch + CUDA libraries + kernels) takes about 12 GB.
ENGINE_ENV_BYTES = 15 * GIB

MISMATCH_FIX = (
    "the container's NVIDIA user-space libraries must be the exact version of the host's kernel "
    "module: on the Proxmox node run 'cat /proc/driver/nvidia/version' and install the same "
    "driver version inside the container (user space only, --no-kernel-module)"
)
NO_DRIVER_FIX = (
    "on the Proxmox node: pass the GPUs into the container (lxc.cgroup2.devices.allow c 195:* "
    f"rwm and bind-mount {layout.GPU_NODE_GLOB}) and check that the node's driver is loaded "
    "(nvidia-smi on the node)"
)


NESTING_FIX = (
    "on the Proxmox node turn on nesting for the container (pct set CTID --features nesting=1, "
    "or pve.py with pve_nesting: true) and restart it: without it the AppArmor profile denies "
    "the mounts a sandboxed unit needs (pve-container make_apparmor_config)"
)


def model_bytes(settings: Settings, kb: Knowledge, measured: int | None) -> int | None:
    """The model's size: as measured on the host, else the knowledge base's size_gb for
    model_name, else unknown."""
    known = kb.models.get(settings.model_name)
    if measured is None and known is not None and known.size_gb is not None:
        return int(known.size_gb * 1e9)
    return measured


# SGLang's host memory per server beside the weights, as docs/how-to/tune.md ("Host memory per
# rank")
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
        "host memory per server beside the weights (docs/how-to/tune.md): ranks may be throttled "
        "at "
        "memory.high or OOM-killed"
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
                "in the container: journalctl -u "
                f"'{PROBE_UNIT}-*' says why systemd-run failed; a sandbox that cannot start here "
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


def check(
    settings: Settings,
    kb: Knowledge,
    gpu: NvidiaSmi,
    resources: Resources,
    model: Model,
    access: GpuAccess | None = None,
    tools: ControllerTools | None = None,
) -> list[Failure]:
    """Every reason this host cannot run the plan, in the order a user fixes them: the model
    source (missing, or a link its scan refuses: nothing else is judged on a guessed size),
    what the controller must have (`tools`: None, not asked), the GPUs, the root-only paths,
    the device nodes and their access, the model and its room, the release's needs of the
    host, the host itself."""
    s = settings
    return [
        *source_failures(s, model),
        *controller_failures(s, tools, resources),
        *gpu_failures(s, kb, gpu),
        *root_failures(s, resources),
        *node_failures(s, resources),
        *access_failures(s, access),
        *model_failures(s, kb, model, resources),
        *release_failures(s, kb, resources),
        *host_failures(s, resources),
    ]


def gpu_failures(s: Settings, kb: Knowledge, gpu: NvidiaSmi) -> list[Failure]:
    """nvidia-smi answers, with gpu_count GPUs of gpu_compute_cap and a CUDA user space."""
    if not gpu.ok:
        error = gpu.error or "no output"
        if "mismatch" in error.lower():
            fix = MISMATCH_FIX
        elif "not found" in error.lower():
            fix = (
                "in the container: install the NVIDIA driver user space (nvidia-smi), the "
                "node's driver version (the NVIDIA .run with --no-kernel-module)"
            )
        else:
            fix = NO_DRIVER_FIX
        return [Failure("nvidia-smi answers", "a list of GPUs", error, fix)]
    failures = []
    if len(gpu.gpus) != s.gpu_count:
        failures.append(
            Failure(
                "GPU count",
                f"{s.gpu_count} GPUs (gpu_count)",
                f"{len(gpu.gpus)}: {', '.join(sorted({g.name for g in gpu.gpus})) or 'none'}",
                "on the Proxmox node: pass every GPU into the container (pve.py), or on the "
                "controller set gpu_count (and dp_size) to match in the inventory",
            )
        )
    if gpu.cuda_version is None:
        failures.append(
            Failure(
                "CUDA user space",
                "nvidia-smi's banner naming the CUDA version the driver supports",
                "CUDA Version: N/A (libcuda is not visible in the container)",
                "in the container: install the driver's user-space libraries (libcuda.so.1, the "
                "same version as the node's driver; the NVIDIA .run with --no-kernel-module)",
            )
        )
    wrong = [g for g in gpu.gpus if g.compute_cap != s.gpu_compute_cap]
    if wrong:
        caps = ", ".join(sorted({f"{g.name} ({g.compute_cap})" for g in wrong}))
        chip = kb.gpus.get(s.gpu_compute_cap)
        arch = chip.arch if chip else s.gpu_compute_cap
        failures.append(
            Failure(
                "compute capability",
                f"{s.gpu_compute_cap} ({arch}) on every GPU (gpu_compute_cap)",
                caps,
                "this deploy is planned for another GPU: on the controller set gpu_compute_cap "
                "for this host in the inventory, after checking the knowledge base supports it",
            )
        )
    return failures


def root_failures(s: Settings, resources: Resources) -> list[Failure]:
    """Every directory root writes or runs under, and each one above it, root-only."""
    return [
        Failure(
            "root-only paths",
            f"{key} {path} and every directory above it owned by root and writable by root "
            "only (root writes or runs what is under it)",
            f"{component}: {why}",
            f"in the container: chown root:root {component} && chmod go-w {component}"
            + (
                f", or on the controller set {key} to a directory only root writes to"
                if "_" in key
                else ""
            ),
        )
        for key, path, component, why in unsafe_roots(s, resources)
    ]


def node_failures(s: Settings, resources: Resources) -> list[Failure]:
    """The CUDA device nodes and one per GPU, in the container."""
    expected_nodes = [*layout.CUDA_NODES, *(layout.gpu_node(i) for i in range(s.gpu_count))]
    missing = [n for n in expected_nodes if n not in resources.device_nodes]
    if not missing:
        return []
    return [
        Failure(
            "GPU device nodes",
            ", ".join(expected_nodes),
            f"missing {', '.join(missing)}",
            "on the Proxmox node: add the nodes to the container's config (lxc.mount.entry: "
            f"{layout.GPU_NODE_PREFIX}N ... bind; pve.py writes them), nvidia-uvm included: CUDA "
            "needs it",
        )
    ]


def model_failures(s: Settings, kb: Knowledge, model: Model, resources: Resources) -> list[Failure]:
    """The model's config names its architecture, its tokenizer is there when the throughput
    check will load it, and its size fits the tmpfs and the memory (no size while the scan
    refuses the source: source_failures names why)."""
    failures = []
    source = s.source
    where = source.controller_dir if source.kind == "controller" else source.target_dir
    on = "the controller" if source.kind == "controller" else "the target"
    if model.exists and model.architecture is None:
        failures.append(
            Failure(
                "model config",
                f"{where}/config.json naming the architecture",
                model.config_error or "unreadable",
                f"on {on}: put the model's config.json in {where}, or point model_source "
                "(inventory or group_data) at a Hugging Face model directory (config.json "
                "and shards)",
            )
        )
    if model.scan_error is not None:
        return failures
    if s.throughput_check != "off" and model.tokenizer == ():
        failures.append(
            Failure(
                "model tokenizer",
                f"{' or '.join(TOKENIZER_FILES)} in {where} (SGLang's tokenizer manager "
                "loads it from the staged copy, offline, and so does the smoke's chat)",
                "none",
                f"on {on}: put the model's tokenizer files in {where}, or on the controller "
                "set throughput_check: off",
            )
        )
    size = model_bytes(s, kb, model.size_bytes)
    if size is not None:
        failures += room_failures(s, resources, size)
    return failures


def room_failures(s: Settings, resources: Resources, size: int) -> list[Failure]:
    """A model of `size` bytes fits the stage tmpfs, and beside the ranks the memory limit."""
    failures = []
    need = int(size * STAGE_HEADROOM)
    if resources.stage_total_bytes is not None and resources.stage_total_bytes < need:
        failures.append(
            Failure(
                f"{s.model_stage_dir} size",
                f">= {gib(need)} = {need} bytes (the model, {gib(size)}, plus 2%); "
                "nothing was copied",
                gib(resources.stage_total_bytes),
                f"in the container: enlarge the tmpfs (mount -o remount,size=... "
                f"{s.model_stage_dir}; on the Proxmox node: the container's /dev/shm size), or "
                "on the controller set model_stage_dir",
            )
        )
    limit = resources.memory_limit_bytes
    needed = memory_needed(s, size)
    if limit is not None and limit < needed:
        failures.append(
            Failure(
                "container memory",
                f">= {gib(needed)} (model {gib(size)} in tmpfs + {s.dp_size} ranks x "
                f"{gib(ram_per_rank(s))}, ram_per_rank_gb, + Proxmox's 128 MiB memory.high "
                "margin)",
                gib(limit),
                "on the Proxmox node: raise the container's memory limit (pct set CTID "
                "--memory MiB; pve.py sets it): /dev/shm pages count against it",
            )
        )
    return failures


def release_failures(s: Settings, kb: Knowledge, resources: Resources) -> list[Failure]:
    """What the pinned release needs of the host: its glibc, a Python it is built for."""
    release = kb.releases.get(s.sglang_version)
    if release is None:
        return []
    failures = []
    floor = release.glibc
    if resources.glibc is None or version(resources.glibc) < version(floor):
        failures.append(
            Failure(
                "glibc",
                f">= {floor} (the wheels of sglang {s.sglang_version} need it)",
                resources.glibc or "unknown",
                "in the container: a newer distribution (Debian 12 has 2.36), or on the "
                "controller pin an older release",
            )
        )
    # The engine is locked and built for the host's own Python (uv never downloads one).
    if resources.python is not None and release.python.minor_of(resources.python) is None:
        supported = ", ".join(release.python.versions)
        failures.append(
            Failure(
                "Python",
                f"python3 {supported} (sglang {s.sglang_version} is built for these only: "
                f"{release.python.why})",
                resources.python,
                f"in the container: install python3 {supported} (with python3-venv; Debian 12 "
                "has 3.11, Ubuntu 24.04 3.12), or on the controller pin a release built for "
                "this one",
            )
        )
    return failures


def host_failures(s: Settings, resources: Resources) -> list[Failure]:
    """systemd as init, no ROCm tree, disk for an engine."""
    failures = []
    if resources.systemd is None:
        failures.append(
            Failure(
                "systemd",
                "systemd as init",
                "not found",
                "on the Proxmox node: make the container from a systemd-based template",
            )
        )
    if resources.rocm:
        failures.append(
            Failure(
                "rocm",
                "no /opt/rocm in the container",
                "/opt/rocm exists",
                "in the container: remove /opt/rocm (or run the engine where it is absent): "
                "apache-tvm-ffi, which compiles "
                "SGLang's own kernels at run time, takes /opt/rocm as a ROCm host and runs hipcc "
                "instead of the engine's nvcc (https://github.com/sgl-project/sglang/issues/30120)",
            )
        )
    if resources.engine_free_bytes is not None and resources.engine_free_bytes < ENGINE_ENV_BYTES:
        failures.append(
            Failure(
                "disk for engines",
                f">= {gib(ENGINE_ENV_BYTES)} free under {s.engine_root}",
                gib(resources.engine_free_bytes),
                f"in the container: free disk space under {s.engine_root}, or on the Proxmox "
                "node grow the container's root disk (pct resize CTID rootfs +20G)",
            )
        )
    return failures
