"""systemd unit text: the one renderer of every unit the deploy writes (rank, router, stage,
target: templates/*.j2), and escaping for each directive.

Every value that reaches a unit goes through one of the escapes below, chosen for the directive
it lands in (systemd.service(5), systemd.exec(5), systemd.unit(5) "Specifiers" and "Quoting"):

- `exec_line` (operations/render/execstart.py, with its inverse): ExecStart= words: `%` -> `%%`,
  `$` -> `$$`, quoted (C escapes) when needed;
- `env_assignment`: Environment= ("KEY=value", quoted, C escapes; `$` has no meaning there);
- `path_word`: RequiresMountsFor=/ReadWritePaths= (quoted, specifiers escaped, no escapes
  processed, so a control character is refused);
- `text`: free text (Description=): specifiers escaped, control characters shown, never a
  line break.
Tests render units for many settings and run `systemd-analyze verify` on them.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from operations import layout
from operations.render import execstart
from operations.settings import Settings

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
RANK_TEMPLATE = "sglang-rank.service.j2"
ROUTER_TEMPLATE = "sglang-router.service.j2"
STAGE_TEMPLATE = "sglang-stage-model.service.j2"
TARGET_TEMPLATE = f"{layout.TARGET}.j2"
# A 54 GB copy at disk speed takes minutes (the stage unit's TimeoutStartSec=).
STAGE_TIMEOUT_S = 3600
# TimeoutStartSec= of a rank. With Type=simple a unit is started once its process runs, so this
# bounds nothing: the health wait bounds a start (health_timeout_s, and 600 s without a journal
# line: plan/startup.py RANK_SILENCE_S), naming its last phase.
RANK_START_TIMEOUT_S = 1800
# TimeoutStopSec of a rank: longer than the drain (settings.drain_timeout_s) by this margin, so a
# stop that systemd itself makes (a shutdown) never cuts a rank sooner than a roll would.
STOP_MARGIN_S = 30
# A crash-looping unit gives up (ends `failed`) after this many starts within the interval.
START_LIMIT_BURST = 5
START_LIMIT_INTERVAL_S = 600
LIMIT_NOFILE = 65536

_SAFE_WORD = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnitValueError(ValueError):
    """A value that no escape can carry into a unit (a control character in a path)."""


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


def render(template: str, **context: Any) -> str:
    """The one way a unit template becomes text. Values must already be escaped."""
    return _environment().get_template(template).render(**context)


# ExecStart= words: one encoder, whose inverse the ServingState fact reads units back with.
exec_word = execstart.encode_word
exec_line = execstart.encode
_c_escape = execstart.c_escape


def env_assignment(key: str, value: str) -> str:
    """One Environment= assignment."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise UnitValueError(f"environment variable name {key!r} is not valid")
    return '"' + _c_escape(f"{key}={value}".replace("%", "%%")) + '"'


def path_word(path: str) -> str:
    """One path of a space-separated path list (RequiresMountsFor=, ReadWritePaths=)."""
    if _CONTROL.search(path):
        raise UnitValueError(f"path {path!r} holds a control character")
    escaped = path.replace("%", "%%")
    if _SAFE_WORD.fullmatch(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text(value: str) -> str:
    """Free text on one line (Description=): specifiers escaped, control characters shown."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value.replace("%", "%%"))


# The rank unit's sandbox (systemd.exec(5)), one list for the rank template and for the transient
# unit preflight probes it with (operations/facts/gpu.py GpuAccess: `systemd-run -p K=V ...`),
# so what preflight proves is what a rank gets. ReadWritePaths= (the home) and DevicePolicy= /
# DeviceAllow= (the rank's GPU) are per unit: see rank_sandbox.
SANDBOX: tuple[tuple[str, str], ...] = (
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
)


def rank_sandbox(
    user: str, gpu: int, device_nodes: tuple[str, ...] | None, compile_cache: str | None = None
) -> list[tuple[str, str]]:
    """Every sandbox property of rank `gpu`'s unit, in the order the template writes them.
    Writable: the service user's home and, where given, the engine's compile caches
    (layout.EngineTree.compile_cache; ProtectSystem=strict leaves the engine root read-only)."""
    writable = [layout.service_home(user), *([compile_cache] if compile_cache else [])]
    return [
        ("DevicePolicy", "closed"),
        *(("DeviceAllow", allow) for allow in device_allow(gpu, device_nodes)),
        *SANDBOX[:3],
        ("ReadWritePaths", " ".join(f"-{path_word(p)}" for p in writable)),
        *SANDBOX[3:],
    ]


def check_sandbox(
    user: str,
    gpu_count: int,
    device_nodes: tuple[str, ...] | None,
    compile_cache: str | None = None,
) -> list[tuple[str, str]]:
    """The engine check's sandbox: a rank's, with every GPU of the host allowed (the check
    runs a kernel on each; a rank is allowed only its own)."""
    found = rank_sandbox(user, 0, device_nodes, compile_cache)
    at = max(i for i, (k, _) in enumerate(found) if k == "DeviceAllow") + 1
    others = [("DeviceAllow", f"{path_word(layout.gpu_node(i))} rw") for i in range(1, gpu_count)]
    return [*found[:at], *others, *found[at:]]


def device_allow(gpu: int, device_nodes: tuple[str, ...] | None) -> list[str]:
    """DeviceAllow= lines for one rank: its own GPU and the nodes CUDA needs. Optional nodes
    only when the host has them (`device_nodes` from HostResources; None: not gathered)."""
    present = set(device_nodes or ())
    nodes = [layout.gpu_node(gpu), *layout.CUDA_NODES]
    nodes += [n for n in layout.CUDA_OPTIONAL_NODES if n in present]
    lines = [f"{path_word(n)} rw" for n in nodes]
    if any(layout.is_caps_node(n) for n in present):
        lines.append("char-nvidia-caps rw")  # MIG capabilities: their major, by name
    return lines


def rank_unit(
    *,
    rank: int,
    gpu: int,
    port: int,
    model_name: str,
    user: str,
    env: dict[str, str],
    argv: list[str],
    device_nodes: tuple[str, ...] | None,
    drain_timeout_s: int,
    compile_cache: str | None = None,
) -> str:
    return render(
        RANK_TEMPLATE,
        description=text(f"SGLang rank {rank}: {model_name} on GPU {gpu}, port {port}"),
        user=user,
        environment=[env_assignment(k, v) for k, v in env.items()],
        exec_start=exec_line(argv),
        stage_unit=layout.STAGE_UNIT,
        target=layout.TARGET,
        start_timeout_s=RANK_START_TIMEOUT_S,
        stop_timeout_s=drain_timeout_s + STOP_MARGIN_S,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=START_LIMIT_INTERVAL_S,
        limit_nofile=LIMIT_NOFILE,
        sandbox=[f"{k}={v}" for k, v in rank_sandbox(user, gpu, device_nodes, compile_cache)],
        identifier=f"sglang-{rank}",
    )


def router_unit(settings: Settings, argv: list[str], workers: int, package: str) -> str:
    """The router's unit, for the host that runs it (settings.router set): its control-plane
    key handed over as a credential (LoadCredential=, layout's constants)."""
    router = settings.router
    assert router is not None
    credentials = [f"{layout.CONTROL_PLANE_CREDENTIAL}:{layout.CONTROL_PLANE_KEY_FILE}"]
    if package == "smg" and settings.api_key_file:
        # smg asks each rank's /v1/models and /server_info before it routes to it
        # (workflow/steps/local/detect_backend.rs, discover_metadata.rs in the 1.13.0 sdist):
        # ranks that want the API key answer it 401 unless it sends the key (--api-key).
        credentials.append(f"{layout.API_KEY_CREDENTIAL}:{layout.SECRETS_FILE}")
    return render(
        ROUTER_TEMPLATE,
        description=text(
            f"{package} {router.version} in front of {workers} ranks, port {router.port}"
        ),
        user=settings.service_user,
        exec_start=exec_line(argv),
        credentials=[path_word(c) for c in credentials],
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=START_LIMIT_INTERVAL_S,
        limit_nofile=LIMIT_NOFILE,
    )


def stage_unit(settings: Settings, argv: list[str]) -> str:
    """The boot unit that stages the model into the tmpfs again (argv: the staging run's
    command line, operations/steps/model.py stage_command)."""
    return render(
        STAGE_TEMPLATE,
        description=text(
            f"Stage {settings.model_name} into {settings.model_stage_dir} for the SGLang ranks"
        ),
        script=layout.STAGE_SCRIPT,
        source_dir=path_word(settings.source.target_dir),
        stage_dir=path_word(settings.model_stage_dir),
        exec_start=exec_line(argv),
        timeout_s=STAGE_TIMEOUT_S,
        target=layout.TARGET,
    )


def target_unit() -> str:
    """sglang.target: every rank of the host (the rank units are WantedBy= and PartOf= it)."""
    return render(TARGET_TEMPLATE, description=text("All SGLang ranks of this host"))
