"""Where things are on a host: unit names, paths and URLs, in one place.

Pure functions of settings (and of a name or key); no decisions, no I/O. Facts, operations, the
resolver and the status command all import their names from here, so a unit name or a path is
spelled once. See docs/architecture.md.
"""

from __future__ import annotations

import re

from operations.settings import Settings

# -- systemd ---------------------------------------------------------------------------------

UNIT_DIR = "/etc/systemd/system"
TARGET = "sglang.target"
ROUTER_UNIT = "sglang-router.service"
STAGE_UNIT = "sglang-stage-model.service"
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


# -- files the deploy owns -------------------------------------------------------------------

CONFIG_DIR = "/etc/sglang"
SECRETS_FILE = f"{CONFIG_DIR}/secrets.yaml"
SCRIPT_DIR = "/usr/local/lib/sglang-deploy"
# systemd's PATH for services: a rank's unit puts its engine's CUDA_HOME/bin before it.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WAIT_SCRIPT = f"{SCRIPT_DIR}/wait_healthy.py"
STAGE_SCRIPT = f"{SCRIPT_DIR}/stage_model.py"
SMOKE_SCRIPT = f"{SCRIPT_DIR}/smoke.py"
ROUTER_WORKERS_SCRIPT = f"{SCRIPT_DIR}/router_workers.py"
ROUTER_MARKER = ".sglang-deploy-complete"

# Monitoring: a Prometheus file_sd targets file and a Grafana dashboard (operations/monitoring.py).
# Not under CONFIG_DIR: with an API key that is 750 root:SERVICE_USER, which a `prometheus` or
# `grafana` user on the host could not read; these files hold no secret (mode 644).
MONITORING_DIR = "/etc/sglang-monitoring"
TARGETS_FILE = f"{MONITORING_DIR}/prometheus-targets.json"
DASHBOARD_FILE = f"{MONITORING_DIR}/grafana-dashboard.json"

# -- the engine ------------------------------------------------------------------------------


def engine_env(engine_root: str, name: str) -> str:
    """An engine environment: ENGINE_ROOT/envs/<EngineSpec.name>."""
    return f"{engine_root}/envs/{name}"


def engine_python(engine_root: str, name: str) -> str:
    """The interpreter a rank unit runs: its own environment's, never the `current` link."""
    return f"{engine_env(engine_root, name)}/bin/python"


def engine_current(engine_root: str) -> str:
    return f"{engine_root}/current"


def router_env(settings: Settings) -> str:
    version = settings.router.version if settings.router else "none"
    return f"{settings.engine_root}/router/sglang-router-{version}"


# -- the staged model ------------------------------------------------------------------------


def model_slug(settings: Settings) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", settings.model_name)


def models_dir(settings: Settings) -> str:
    return f"{settings.model_stage_dir}/models"


def staged_model_link(settings: Settings) -> str:
    """STAGE_DIR/models/SLUG: the link to the newest complete copy (for people and status)."""
    return f"{models_dir(settings)}/{model_slug(settings)}"


def hub_key(revision: str) -> str:
    """The copy key of a hub source: its pinned revision, made one path-safe name."""
    return "hf-" + re.sub(r"[^A-Za-z0-9._-]+", "-", revision)


def staged_copy(settings: Settings, key: str) -> str:
    """One complete staged copy, STAGE_DIR/models/.SLUG@KEY: what a rank unit names."""
    return f"{models_dir(settings)}/.{model_slug(settings)}@{key}"


def copy_key(settings: Settings, path: str) -> str | None:
    """The key of a staged copy path of this model; None for any other path."""
    prefix = f"{models_dir(settings)}/.{model_slug(settings)}@"
    if not path.startswith(prefix):
        return None
    key = path[len(prefix) :]
    return key if key and "/" not in key else None


# -- URLs ------------------------------------------------------------------------------------


def local_url(address: str, port: int) -> str:
    """A server bound to `address`, as the host itself reaches it (no path)."""
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


def health_url(address: str, port: int) -> str:
    """/health as the host itself reaches a server bound to `address`."""
    return f"{local_url(address, port)}/health"


def rank_health_url(settings: Settings, rank: int) -> str:
    return health_url(settings.server_host, settings.base_port + rank)


def worker_url(address: str, port: int) -> str:
    """A rank as the router (on another host, maybe) reaches it."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


# The OpenAI-compatible API a client uses (SGLang serves it under /v1; so does the router).
API_PREFIX = "/v1"
CHAT_PATH = f"{API_PREFIX}/chat/completions"
MODELS_PATH = f"{API_PREFIX}/models"


def api_base(address: str, port: int) -> str:
    """The OpenAI client's base_url for a server bound to `address`, as the host reaches it."""
    return f"{local_url(address, port)}{API_PREFIX}"


def metrics_url(address: str, port: int) -> str:
    """A server's Prometheus /metrics, as its host reaches it."""
    return f"{local_url(address, port)}/metrics"


def rank_api_base(settings: Settings, rank: int) -> str:
    return api_base(settings.server_host, settings.base_port + rank)


def rank_chat_url(settings: Settings, rank: int) -> str:
    return f"{local_url(settings.server_host, settings.base_port + rank)}{CHAT_PATH}"


def rank_models_url(settings: Settings, rank: int) -> str:
    return f"{local_url(settings.server_host, settings.base_port + rank)}{MODELS_PATH}"


def router_api_base(settings: Settings) -> str | None:
    """The router's base_url as its own host reaches it; None without a router."""
    router = settings.router
    return api_base(router.bind, router.port) if router is not None else None
