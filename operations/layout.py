"""Where things are on a host: unit names, paths and URLs, in one place.

Pure functions of settings (and of a name or key); no decisions, no I/O. Facts, operations, the
resolver and the status command all import their names from here, so a unit name or a path is
spelled once. See docs/how-it-works/architecture.md.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from operations.kb import router_package
from operations.settings import Settings

# -- on the controller -------------------------------------------------------------------------

# How the toolkit's own commands are spelled to a user (help, errors): the checkout's virtualenv,
# as the README's commands are (`make` builds it).
CONTROLLER_PYTHON = ".venv/bin/python"


def command(module: str) -> str:
    """A toolkit command as a user types it: `.venv/bin/python -m operations.plan`."""
    return f"{CONTROLLER_PYTHON} -m operations.{module}"


# -- systemd ---------------------------------------------------------------------------------

UNIT_DIR = "/etc/systemd/system"
TARGET = "sglang.target"
ROUTER_UNIT = "sglang-router.service"
STAGE_UNIT = "sglang-stage-model.service"
# On the Proxmox node (pve.py): makes the UVM device nodes at every boot, before pve-guests.
NODE_UVM_UNIT = "nvidia-uvm-nodes.service"
RANK_UNIT_GLOB = "sglang@*.service"
_RANK_UNIT = re.compile(r"^sglang@(\d+)\.service$")


def unit_name(rank: int) -> str:
    return f"sglang@{rank}.service"


def rank_of(unit: str) -> int | None:
    """The rank a unit name belongs to; None for any other unit."""
    match = _RANK_UNIT.match(unit)
    return int(match.group(1)) if match else None


def unit_path(unit: str) -> str:
    return f"{UNIT_DIR}/{unit}"


def rank_unit_path(rank: int) -> str:
    return unit_path(unit_name(rank))


def service_home(user: str) -> str:
    """The service user's home (JIT caches; a rank unit's ReadWritePaths=)."""
    return f"/var/lib/{user}"


# -- files the deploy owns -------------------------------------------------------------------

CONFIG_DIR = "/etc/sglang"
SECRETS_FILE = f"{CONFIG_DIR}/secrets.yaml"
# The toolkit version that last deployed the host and the date it was first recorded, written by
# the deploy's last step once the run succeeded (operations/plan/toolkit_version.py).
TOOLKIT_RECORD = f"{CONFIG_DIR}/toolkit.json"
SCRIPT_DIR = "/usr/local/lib/sglang-deploy"
# systemd's PATH for services: a rank's unit puts its engine's CUDA_HOME/bin before it.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WAIT_SCRIPT = f"{SCRIPT_DIR}/wait_healthy.py"
STAGE_SCRIPT = f"{SCRIPT_DIR}/stage_model.py"
SMOKE_SCRIPT = f"{SCRIPT_DIR}/smoke.py"
ROUTER_WORKERS_SCRIPT = f"{SCRIPT_DIR}/router_workers.py"
ROLL_BATCH_SCRIPT = f"{SCRIPT_DIR}/roll_batch.py"
# The throughput check (programs/throughput.py) and its records, one JSON line per run, kept on
# the host across deploys and engines (root's, 644: no secret in them).
THROUGHPUT_SCRIPT = f"{SCRIPT_DIR}/throughput.py"
THROUGHPUT_RECORDS = "/var/lib/sglang-deploy/throughput.jsonl"
# Present from the moment a throughput check starts until one passes (programs/throughput.py):
# a check that failed or was cut off is run again by the next deploy (facts/serve.py reads it).
THROUGHPUT_PENDING = "/var/lib/sglang-deploy/throughput.pending"
# A canary rollout (settings `rollout`, operations/plan/canary_plan.py): the comparison program
# (CANARY_SCRIPT, canary_compare.py) and its verdict, one JSON object it writes atomically (root's,
# 644: no secret in it; facts/canary.py reads it back), and the unit files of the canary ranks
# as they were before the canary rewrote them, by unit file name (sglang@0.service), which a
# rollback restores.
CANARY_SCRIPT = f"{SCRIPT_DIR}/canary_compare.py"
CANARY_RECORD = "/var/lib/sglang-deploy/canary.json"
CANARY_BACKUP_DIR = "/var/lib/sglang-deploy/canary"
# The tune (`python -m operations.tune`, programs/tune.py): its results, one JSON line a
# candidate and one a finished tune, beside the throughput records (root's, 644: no secret);
# and its state while a candidate runs: the rank under test, where its own unit is saved and
# the candidate's digest, so a cut-off tune's rank is restored by the next tune (the next
# deploy rewrites a unit that is not the plan's anyway).
TUNE_SCRIPT = f"{SCRIPT_DIR}/tune.py"
TUNE_RECORDS = "/var/lib/sglang-deploy/tune.jsonl"
TUNE_STATE = "/var/lib/sglang-deploy/tune.state"
# The router's control-plane key (root only, mode 600): systemd hands it to the router unit as
# the credential CONTROL_PLANE_CREDENTIAL (LoadCredential=), the launcher reads it from there
# and the drain script from here (docs/how-it-works/security-gateway-and-concurrency.md "The
# router's control plane").
CONTROL_PLANE_KEY_FILE = f"{CONFIG_DIR}/router-control-plane.key"
CONTROL_PLANE_CREDENTIAL = "control-plane-key"
# The ranks' API key file (SECRETS_FILE) handed to smg as a credential: it probes and routes to
# ranks that want the key (programs/router_launch.py API_KEY_CREDENTIAL).
API_KEY_CREDENTIAL = "api-key"
ROUTER_LAUNCH_SCRIPT = f"{SCRIPT_DIR}/router_launch.py"
ROUTER_MARKER = ".sglang-deploy-complete"


def router_marker(env: str) -> str:
    """Touched last by the router's install (operations/steps/serve.py router_env): env is
    complete."""
    return f"{env}/{ROUTER_MARKER}"


# Monitoring: a Prometheus file_sd targets file and a Grafana dashboard
# (operations/plan/monitoring.py).
# Not under CONFIG_DIR: with an API key that is 750 root:SERVICE_USER, which a `prometheus` or
# `grafana` user on the host could not read; these files hold no secret (mode 644).
MONITORING_DIR = "/etc/sglang-monitoring"
TARGETS_FILE = f"{MONITORING_DIR}/prometheus-targets.json"
DASHBOARD_FILE = f"{MONITORING_DIR}/grafana-dashboard.json"
# Under an hf:// source's directory: the revision the hub download completed
# (operations/programs/stage_model.py HUB_MARKER, which the host script spells on its own).
HUB_MARKER = ".cache/sglang-hub-complete"
# Root-only, and only for the length of one hub download: the token never lands in a unit file.
HUB_TOKEN_DIR = f"{CONFIG_DIR}/hub"
HUB_TOKEN_FILE = f"{HUB_TOKEN_DIR}/token"
# Written into an environment only after it passed its checks: an environment without it is
# partial (a cut download, a full disk, a failed check) and is removed by the next run.
ENGINE_MARKER = "sglang-deploy.json"
# Beside the marker: on which GPUs (nvidia-smi's names, the driver) and on which day the engine
# check passed on this host, as the service user (facts/engine.py's Proven; steps/engine_check).
ENGINE_PROVEN = "sglang-deploy-proven.json"
# The resolved set, in each engine project (uv writes it) and environment (copied there).
LOCK_FILE = "uv.lock"
# The stage unit's interpreter: the host's own, present before any engine is installed.
SYSTEM_PYTHON = "/usr/bin/python3"
# On a Proxmox node (pve.py): NVIDIA's installers, downloaded once.
PVE_DRIVER_CACHE = "/var/cache/sglang-deploy/driver"

# -- the engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineTree:
    """ENGINE_ROOT on a host: every path the engine, router and serve steps, the facts and the
    status command use under it.

      envs/<name>/            one environment per EngineSpec.name (bin/python, the marker)
      projects/<name>/        its uv project (pyproject.toml, uv.lock)
      current -> envs/<name>  for people and tools; no unit reads it
      tools/bin/uv, cache/    uv and its cache; uv.toml and pip.conf: the package sources
      wheelhouse/             the controller's wheels (setting wheelhouse)
      cuda/<name>/            a lane's CUDA compiler; cuda-redist/ its archives, offline
      router/PACKAGE-V/       the router's environment (sglang-router-0.3.2, smg-1.13.0)
      caches/<name>/          an environment's compile caches (FlashInfer's JIT modules,
                              Triton's kernels and autotune results, SGLang's, Inductor's, the
                              driver's PTX cache): the service user's, shared by that engine's
                              ranks, kept across restarts and switches, pruned with the env
    """

    root: str

    @property
    def envs(self) -> str:
        return f"{self.root}/envs"

    def env(self, name: str) -> str:
        """An engine environment: ENGINE_ROOT/envs/<EngineSpec.name>."""
        return f"{self.envs}/{name}"

    def python(self, name: str) -> str:
        """The interpreter a rank unit runs: its own environment's, never the `current` link."""
        return env_python(self.env(name))

    def name_of(self, env: str) -> str | None:
        """The name of an environment path under this root; None for any other path."""
        prefix = f"{self.envs}/"
        name = env[len(prefix) :] if env.startswith(prefix) else ""
        return name if name and "/" not in name else None

    def project(self, name: str) -> str:
        return f"{self.root}/projects/{name}"

    @property
    def caches(self) -> str:
        return f"{self.root}/caches"

    def compile_cache(self, name: str) -> str:
        """An environment's compile caches: ENGINE_ROOT/caches/<EngineSpec.name>, outside
        /tmp (a rank's PrivateTmp empties it) and /dev/shm (gone at a reboot)."""
        return f"{self.caches}/{name}"

    def project_toml(self, name: str) -> str:
        """Its pyproject.toml (root-only: index URLs may carry credentials)."""
        return f"{self.project(name)}/pyproject.toml"

    def project_lock(self, name: str) -> str:
        """Its uv.lock: `uv lock`'s, or the controller's copy uploaded."""
        return f"{self.project(name)}/{LOCK_FILE}"

    def project_requirements(self, name: str) -> str:
        """The lock exported for an offline install (`uv export`)."""
        return env_requirements(self.project(name))

    def env_marker(self, name: str) -> str:
        """The environment's marker (ENGINE_MARKER): complete once its check passed."""
        return f"{self.env(name)}/{ENGINE_MARKER}"

    def env_proven(self, name: str) -> str:
        """Where the engine check records that it passed on this host's GPUs (ENGINE_PROVEN)."""
        return f"{self.env(name)}/{ENGINE_PROVEN}"

    def env_lock(self, name: str) -> str:
        """The lock an environment was installed from, kept inside it."""
        return f"{self.env(name)}/{LOCK_FILE}"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def current_temp_pattern(self) -> str:
        """mktemp's template of the link renamed over `current`."""
        return f"{self.root}/.current.XXXXXXXX"

    @staticmethod
    def current_target(name: str) -> str:
        """What `current` points at (relative, so the root may move)."""
        return f"envs/{name}"

    @property
    def tools(self) -> str:
        return f"{self.root}/tools"

    @property
    def uv(self) -> str:
        return f"{self.tools}/bin/uv"

    @property
    def tools_pip(self) -> str:
        return f"{self.tools}/bin/pip"

    @property
    def tools_requirements(self) -> str:
        """uv's pinned wheel (with its hash), as bootstrap_uv installs it."""
        return env_requirements(self.tools)

    @property
    def cache(self) -> str:
        return f"{self.root}/cache"

    @property
    def wheelhouse(self) -> str:
        return f"{self.root}/wheelhouse"

    @property
    def uv_config(self) -> str:
        return f"{self.root}/uv.toml"

    @property
    def pip_config(self) -> str:
        return f"{self.root}/pip.conf"

    @property
    def cuda(self) -> str:
        return f"{self.root}/cuda"

    def toolkit(self, name: str) -> str:
        """A lane's CUDA compiler: ENGINE_ROOT/cuda/<name> (its CUDA_HOME)."""
        return f"{self.cuda}/{name}"

    def toolkit_args(self, name: str) -> str:
        return f"{self.cuda}/.{name}.json"

    def redist(self, directory: str) -> str:
        return f"{self.root}/{directory}"

    @property
    def routers(self) -> str:
        """Every router environment, one per package and release (router_env_dir)."""
        return f"{self.root}/router"

    def router_env_dir(self, package: str, version: str) -> str:
        return f"{self.routers}/{package}-{version}"


def env_python(env: str) -> str:
    """An environment's interpreter."""
    return f"{env}/bin/python"


def env_of_python(python: str) -> str | None:
    """The environment an interpreter path belongs to (ENV/bin/python -> ENV); None else."""
    suffix = env_python("")
    return python[: -len(suffix)] if python.endswith(suffix) and python != suffix else None


def engine_tree(settings: Settings) -> EngineTree:
    return EngineTree(settings.engine_root)


def engine_current(engine_root: str) -> str:
    return EngineTree(engine_root).current


def hub_cli_venv(cli: str) -> str:
    """The Hugging Face CLI's own venv: model_hub_cli is VENV/bin/hf (settings checks it)."""
    return posixpath.dirname(posixpath.dirname(cli))


def hub_cli_requirements(cli: str) -> str:
    """The CLI's pinned wheels (with hashes), kept in its venv."""
    return env_requirements(hub_cli_venv(cli))


def hub_cli_pip(cli: str) -> str:
    return f"{hub_cli_venv(cli)}/bin/pip"


def router_env_dir(settings: Settings) -> str:
    """The router's environment: named by its package and release (sglang-router-0.3.2,
    smg-1.13.0), so one release's never holds another's `smg` command."""
    if settings.router is None:
        return engine_tree(settings).router_env_dir("sglang-router", "none")
    version = settings.router.version
    return engine_tree(settings).router_env_dir(router_package(version), version)


# -- the registry of managed files -----------------------------------------------------------


@dataclass(frozen=True)
class ManagedFile:
    """One file a deploy step writes on a host: where, with what mode and owners, by which step,
    and whether the ServingState fact checksums it on every run (by its path, or, for a rank
    unit, by the glob RANK_UNIT_GLOB: `by_glob`). When it does, that digest is the plan's
    "digest now" for its write (`host_files.planned`): a converged run rewrites nothing and
    asks no FileAt fact for it. A secret's mode and owners are read on every run (FileAt),
    whatever the fact says."""

    path: str
    step: str  # "engine", "model", "serve", "router", "record"
    mode: str = "644"
    group: str = "root"
    secret: bool = False
    # False: written only together with what it belongs to (an environment being built, a
    # download), which a converged run never redoes, so no run needs its digest.
    checksummed: bool = True
    dir_mode: str = "755"
    dir_group: str = "root"
    owner: str = "root"
    # The fact reads it with the rank units (RANK_UNIT_GLOB), not by its path.
    by_glob: bool = False


def managed_files(settings: Settings) -> tuple[ManagedFile, ...]:
    """Every file the deploy's steps write on the host, one entry each: ServingState's paths
    (`checksummed_paths`) and every digest handed to put_file derive from here, and
    tests/unit/test_converged.py fails on a write of a path not listed. Add a file here."""
    tree = engine_tree(settings)
    user = settings.service_user
    files = (
        *(ManagedFile(rank_unit_path(r), "serve", by_glob=True) for r in range(settings.dp_size)),
        ManagedFile(WAIT_SCRIPT, "serve", "755"),
        ManagedFile(SMOKE_SCRIPT, "serve", "755"),
        ManagedFile(ROUTER_WORKERS_SCRIPT, "serve", "755"),
        ManagedFile(ROLL_BATCH_SCRIPT, "serve", "755"),
        ManagedFile(THROUGHPUT_SCRIPT, "serve", "755"),
        ManagedFile(CANARY_SCRIPT, "serve", "755"),
        # Written by the tune only (no deploy writes or reads it).
        ManagedFile(TUNE_SCRIPT, "serve", "755", checksummed=False),
        ManagedFile(SECRETS_FILE, "serve", "640", user, True, dir_mode="750", dir_group=user),
        ManagedFile(unit_path(TARGET), "serve"),
        ManagedFile(TARGETS_FILE, "serve"),
        ManagedFile(DASHBOARD_FILE, "serve"),
        ManagedFile(unit_path(ROUTER_UNIT), "router"),
        ManagedFile(ROUTER_LAUNCH_SCRIPT, "router", "755"),
        # The router's control-plane key, on every host behind it (its digest says whether the
        # router restarts: resolver/router.key_changes).
        ManagedFile(
            CONTROL_PLANE_KEY_FILE, "router", "600", secret=True, dir_mode="750", dir_group=user
        ),
        ManagedFile(tree.uv_config, "engine", "600", secret=True, checksummed=False),
        ManagedFile(tree.pip_config, "engine", "600", secret=True, checksummed=False),
        ManagedFile(tree.tools_requirements, "engine", checksummed=False),
        ManagedFile(STAGE_SCRIPT, "model", "755"),
        ManagedFile(unit_path(STAGE_UNIT), "model"),
        # Written only for a hub download that is still to do (no run after it needs them).
        ManagedFile(HUB_TOKEN_FILE, "model", "600", secret=True, checksummed=False, dir_mode="700"),
        ManagedFile(hub_cli_requirements(settings.model_hub_cli), "model", checksummed=False),
        # In CONFIG_DIR as the secrets are, so its directory is made as theirs is.
        ManagedFile(TOOLKIT_RECORD, "record", dir_mode="750", dir_group=user),
    )
    if settings.router is None:
        return files
    router = router_env_dir(settings)
    return (
        *files,
        # Touched last by the router's install: its environment is complete.
        ManagedFile(router_marker(router), "router"),
        ManagedFile(env_requirements(router), "router", checksummed=False),
    )


def checksummed_paths(settings: Settings) -> list[str]:
    """The paths the ServingState fact checksums: the registry's checksummed entries."""
    return [f.path for f in managed_files(settings) if f.checksummed and not f.by_glob]


def managed_file(settings: Settings, path: str) -> ManagedFile:
    """The registry's entry for `path`; a path not in the registry is a bug, said at once."""
    for entry in managed_files(settings):
        if entry.path == path:
            return entry
    raise KeyError(f"{path} is not in layout.managed_files: add it there")


def env_requirements(env: str) -> str:
    """The pinned requirements an environment was installed from (kept inside it)."""
    return f"{env}/requirements.txt"


# -- the staged model ------------------------------------------------------------------------


@dataclass(frozen=True)
class StageTree:
    """STAGE_DIR/models on a host (the staging script, programs/stage_model.py, makes it):

    models/SLUG -> .SLUG@KEY   the newest complete copy (for people and status)
    models/.SLUG@KEY/          one complete copy: what a rank unit names
    """

    stage_dir: str
    slug: str

    @property
    def models(self) -> str:
        return f"{self.stage_dir}/models"

    @property
    def link(self) -> str:
        return f"{self.models}/{self.slug}"

    def copy(self, key: str) -> str:
        return f"{self.models}/.{self.slug}@{key}"

    def key_of(self, path: str) -> str | None:
        """The key of a staged copy path of this model; None for any other path."""
        prefix = self.copy("")
        if not path.startswith(prefix):
            return None
        key = path[len(prefix) :]
        return key if key and "/" not in key else None

    def entry(self, name: str) -> str:
        """A name under models/ (the link's target, `.SLUG@KEY`) as a path."""
        return f"{self.models}/{name}"


def model_slug(settings: Settings) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", settings.model_name)


def stage_tree(settings: Settings) -> StageTree:
    return StageTree(settings.model_stage_dir, model_slug(settings))


def staged_model_link(settings: Settings) -> str:
    """STAGE_DIR/models/SLUG: the link to the newest complete copy (for people and status)."""
    return stage_tree(settings).link


def hub_key(revision: str) -> str:
    """The copy key of a hub source: its pinned revision, made one path-safe name."""
    return "hf-" + re.sub(r"[^A-Za-z0-9._-]+", "-", revision)


def staged_copy(settings: Settings, key: str) -> str:
    """One complete staged copy, STAGE_DIR/models/.SLUG@KEY: what a rank unit names."""
    return stage_tree(settings).copy(key)


def copy_key(settings: Settings, path: str) -> str | None:
    """The key of a staged copy path of this model; None for any other path."""
    return stage_tree(settings).key_of(path)


# -- GPU device nodes --------------------------------------------------------------------------
# One list for the units (DeviceAllow=), preflight (what a container must have) and pve.py
# (what a container is given). CUDA opens its GPU's /dev/nvidiaN, the control node and UVM;
# nvidia-uvm-tools (profilers) when the host has it; MIG capabilities under /dev/nvidia-caps.
# /dev/nvidia-modeset (display mode setting) is not a compute node: nvidia-container-toolkit's
# compute device list (ctl, uvm, uvm-tools) does not have it, so neither does this one.

GPU_NODE_PREFIX = "/dev/nvidia"
GPU_NODE_GLOB = "/dev/nvidia*"
_GPU_NODE = re.compile(r"^/dev/nvidia([0-9]+)$")
CUDA_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
CUDA_OPTIONAL_NODES = ("/dev/nvidia-uvm-tools",)
CAPS_DIR = "/dev/nvidia-caps"


# Preflight's GPU access probe keeps a result that passed here (gone at the next boot).
PROBE_CACHE_DIR = "/run/sglang-deploy"


def gpu_node(index: int) -> str:
    return f"{GPU_NODE_PREFIX}{index}"


def gpu_index(node: str) -> int | None:
    """N of a GPU node /dev/nvidiaN; None for any other node."""
    match = _GPU_NODE.match(node)
    return int(match.group(1)) if match else None


def is_caps_node(node: str) -> bool:
    return node == CAPS_DIR or node.startswith(f"{CAPS_DIR}/")


# -- URLs ------------------------------------------------------------------------------------


def local_url(address: str, port: int) -> str:
    """A server bound to `address`, as the host itself reaches it (no path)."""
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


def health_url(address: str, port: int, path: str = "/health") -> str:
    """/health (or another probe `path`) as the host itself reaches a server bound to
    `address`."""
    return f"{local_url(address, port)}{path}"


def rank_health_url(settings: Settings, rank: int) -> str:
    return health_url(settings.server_host, settings.base_port + rank)


def worker_url(address: str, port: int) -> str:
    """A rank as the router (on another host, maybe) reaches it."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


# The OpenAI-compatible API a client uses (SGLang serves it under /v1; so does the router).
API_PREFIX = "/v1"


def api_base(address: str, port: int) -> str:
    """The OpenAI client's base_url for a server bound to `address`, as the host reaches it."""
    return f"{local_url(address, port)}{API_PREFIX}"


def metrics_url(address: str, port: int) -> str:
    """A server's Prometheus /metrics, as its host reaches it."""
    return f"{local_url(address, port)}/metrics"


def rank_api_base(settings: Settings, rank: int) -> str:
    return api_base(settings.server_host, settings.base_port + rank)


def rank_server_url(settings: Settings, rank: int) -> str:
    """A rank's server root (no /v1), as its host reaches it: the benchmark client's --base-url
    and where /metrics is."""
    return local_url(settings.server_host, settings.base_port + rank)


def router_server_url(settings: Settings) -> str | None:
    """The router's server root (no /v1), as its own host reaches it; None without a router."""
    router = settings.router
    return local_url(router.bind, router.port) if router is not None else None


def router_api_base(settings: Settings) -> str | None:
    """The router's base_url as its own host reaches it; None without a router."""
    router = settings.router
    return api_base(router.bind, router.port) if router is not None else None
