"""Deployment settings: pyinfra host data, checked against settings.schema.json.

Every problem names the key, the value, where it was set and what is accepted, one line each,
all of them at once. Keys that belong to pyinfra or its connectors (ssh_*, _sudo, ...) pass.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import posixpath
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pyinfra.api.host import Host

from operations.redact import redact_text
from operations.settings import verdicts

if TYPE_CHECKING:
    import jsonschema

SCHEMA_PATH = Path(__file__).parent / "settings.schema.json"


# One setting's entry in settings.schema.json, the keys read here (jsonschema reads them all).
PropertySchema = TypedDict(
    "PropertySchema",
    {"type": str | list[str], "default": Any, "description": str, "x-accepts": str},
    total=False,
)


class SettingsSchema(TypedDict):
    """settings.schema.json, as this module and its tests read it."""

    required: list[str]
    properties: dict[str, PropertySchema]


@cache
def schema() -> SettingsSchema:
    loaded: SettingsSchema = json.loads(SCHEMA_PATH.read_text())
    return loaded


def defaults() -> dict[str, object]:
    """Each setting's default, as settings.schema.json spells it (JSON: converted by load)."""
    return {k: p["default"] for k, p in schema()["properties"].items() if "default" in p}


@cache
def _pyinfra_keys() -> frozenset[str]:
    """Host data keys that pyinfra's connectors read: these are not ours to judge."""
    from operations.runtime.pyinfra_internals import connector_data_keys

    return connector_data_keys()


@dataclass(frozen=True)
class Speculative:
    algorithm: str
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class SourceSpec:
    """What `model_source` names (docs/model.md): where the weights come from, and the
    persistent directory on the target they are staged from (the boot unit reads it too)."""

    kind: str  # "target", "controller" or "hf"
    target_dir: str
    controller_dir: str | None = None
    repo: str | None = None
    revision: str | None = None


def parse_source(model_source: str, cache_dir: str) -> SourceSpec:
    """The schema and `load` have checked the form; this only splits it.

    Distinct sources never share a cache directory: a controller directory's cache name is its
    basename plus a hash of its whole path (`rsync --delete` into a shared one would wipe the
    other's weights); hub repositories cannot contain "--", so ORG--NAME@REV is unique.
    """
    if model_source.startswith("controller:"):
        path = model_source.removeprefix("controller:").rstrip("/") or "/"
        name = path.rsplit("/", 1)[-1] or "root"
        tag = hashlib.sha256(path.encode()).hexdigest()[:12]
        return SourceSpec("controller", f"{cache_dir}/controller/{name}@{tag}", controller_dir=path)
    if model_source.startswith("hf://"):
        repo, _, revision = model_source.removeprefix("hf://").rpartition("@")
        slug = repo.replace("/", "--")
        return SourceSpec("hf", f"{cache_dir}/hf/{slug}@{revision}", repo=repo, revision=revision)
    return SourceSpec("target", model_source)


@dataclass(frozen=True)
class Router:
    """sglang-router on the inventory host `host`, in front of every rank of every host."""

    host: str
    port: int = 8000
    policy: str = "cache_aware"
    bind: str = "0.0.0.0"
    version: str = "0.3.2"
    # Reliability, written on its command line (the router's own defaults in brackets, from
    # sglang-router 0.3.2's router_args.py; README "Upgrading without downtime" says why):
    # attempts per request, retried on a connection error and 408/429/500/502/503/504 [5].
    retry_max_retries: int = 5
    retry_initial_backoff_ms: int = 100  # [50], x1.5 per attempt
    # A crashed rank leaves the rotation after interval x failures [60 s x 3].
    health_check_interval_s: int = 5
    health_failure_threshold: int = 2
    health_success_threshold: int = 2  # [2]
    # Consecutive failed requests that open a worker's circuit [10], and how long it stays open
    # before one request may try it again [60 s].
    cb_failure_threshold: int = 5
    cb_timeout_s: int = 10
    # How long the router waits for a worker it is given to answer /health [1800 s].
    worker_startup_timeout_s: int = 1800
    # Where the router serves its Prometheus metrics (on `bind`) [29000 on 0.0.0.0]: written on
    # its command line, listed in the Prometheus targets file (operations/plan/monitoring.py).
    metrics_port: int = 29000
    # The control-plane key (worker add/remove, sglang-router's --control-plane-api-keys) on the
    # controller, written to every host behind the router; None: generated once on the router's
    # host (one host only). docs/security.md "The router's control plane".
    control_plane_key_file: str | None = None


@dataclass(frozen=True)
class Settings:
    """Typed settings: one field per key of settings.schema.json, where their defaults live."""

    sglang_version: str
    cuda_lane: str
    model_name: str
    model_source: str
    model_stage_dir: str
    dp_size: int
    gpu_count: int
    gpu_compute_cap: str
    server_host: str
    base_port: int
    attention_backend: str
    mem_fraction_static: float
    mamba_cache_strategy: str
    cuda_graph_max_bs: int | None
    speculative: Speculative | None
    enable_metrics: bool
    extra_server_args: tuple[str, ...]
    engine_root: str
    service_user: str
    wheelhouse: str | None
    api_key_file: str | None
    model_cache_dir: str
    model_verify: str
    model_hub_cli: str
    model_stage_bwlimit_mbps: float | None
    engine_keep: int
    package_index_url: str | None
    engine_lock_dir: str
    torch_index_url: str
    kernel_index_url: str
    cuda_redist_url: str
    cuda_wheels_url: str
    cuda_redist_manifest: str | None
    uv_version: str
    ram_per_rank_gb: float
    health_timeout_s: int
    restart_batch_size: int
    drain_timeout_s: int
    smoke_requests: bool
    smoke_router_requests: int
    smoke_timeout_s: int
    router: Router | None
    deploy_lock_wait_s: int
    pve_ctid: int | None
    pve_restart: bool
    pve_nesting: bool
    pve_install_driver: bool
    pve_driver_url: str
    pve_driver_hashes: Mapping[str, str]
    # Where each key's value came from, for messages that point at the right file.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def source(self) -> SourceSpec:
        return parse_source(self.model_source, self.model_cache_dir)

    def origin(self, key: str) -> str:
        return self.origins.get(key, "default")


@dataclass(frozen=True)
class Layer:
    """One source of host data, highest precedence first: --data, the host, its groups, all."""

    label: str
    data: Mapping[str, Any]


class SettingsError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


COMMAND_LINE = "--data on the command line"


def _merge(layers: Iterable[Layer]) -> tuple[dict[str, object], dict[str, str]]:
    """Each key's value from the first layer that sets it, not yet checked (load checks it),
    and that layer's label."""
    props = schema()["properties"]
    merged: dict[str, object] = {}
    origins: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.data.items():
            if key in merged:
                continue
            # pyinfra's --data turns "12.0" into a float; a string setting wants the text back.
            wants_text = props.get(key, {}).get("type") == "string"
            if layer.label == COMMAND_LINE and wants_text and type(value) in (int, float):
                value = str(value)
            merged[key] = value
            origins[key] = layer.label
    return merged, origins


def _describe(
    error: jsonschema.ValidationError, props: Mapping[str, PropertySchema]
) -> tuple[str, str]:
    """(key, what is accepted) for one schema error."""
    if error.validator == "required":
        missing = str(error.message).split("'")[1]
        return missing, props[missing].get("x-accepts", "a value")
    key = str(error.absolute_path[0]) if error.absolute_path else "?"
    accepts = props.get(key, {}).get("x-accepts", error.message)
    if len(error.absolute_path) > 1:
        accepts = f"{accepts} ({'.'.join(map(str, error.absolute_path))}: {error.message})"
    return key, accepts


def load(host_name: str, layers: list[Layer]) -> Settings:
    """Merge the layers, validate, apply defaults; raise SettingsError listing every problem."""
    merged, origins = _merge(layers)
    props = schema()["properties"]
    ours = {k: v for k, v in merged.items() if k in props}
    problems: list[str] = []

    for key in sorted(merged):
        if key in props or key in _pyinfra_keys() or key.startswith("_"):
            continue
        close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else "see the Configuration reference, docs/configuration.md"
        )
        problems.append(
            f"{host_name}: unknown setting {key!r} = {merged[key]!r} "
            f"(set in {origins[key]}); {hint}"
        )

    # Control characters first: for such a value that is the one thing to say.
    control = _control_problems(ours)
    problems += [
        f"{host_name}: {key} = {ours[key]!r} (set in {origins[key]}); {why}" for key, why in control
    ]
    for error in verdicts.errors(schema(), ours):
        key, accepts = _describe(error, props)
        if any(key == k for k, _ in control):
            continue
        if key in ours:
            where = f"= {ours[key]!r} (set in {origins[key]})"
        else:
            where = "is not set (in no inventory, group_data file or --data)"
        problems.append(f"{host_name}: {key} {where}; accepted: {accepts}")

    if not problems:
        problems += [
            f"{host_name}: {key} = {ours[key]!r} (set in {origins[key]}); {why}"
            for key, why in _value_problems(ours)
        ]
    if problems:
        # Index URLs may carry tokens: an error line is shown, so it never holds one.
        raise SettingsError([redact_text(p) for p in problems])

    values = {**defaults(), **ours}
    typed = {key: _CONVERT.get(key, _same)(values[key]) for key in props}
    return Settings(**typed, origins={k: origins[k] for k in ours})


# ------------------------------------------------------------------ beyond the schema's reach

# Unicode categories no setting may contain: controls (newline, NUL, ESC, DEL, C1) and the line
# and paragraph separators. A newline in a value would start a new line in a unit file.
_FORBIDDEN_CATEGORIES = ("Cc", "Zl", "Zp")
# Target paths the deploy writes into or installs under: never a system directory itself.
_SYSTEM_DIRS = frozenset(
    {
        *("/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64"),
        *("/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp"),
        *("/usr", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/local/sbin"),
        *("/var", "/var/cache", "/var/lib", "/var/log", "/var/tmp"),
    }
)
# Trees owned by the distribution or the kernel: no environment of ours goes under them.
# /usr/local/ is the administrator's and allowed (/usr/local/hf/bin/hf).
_SYSTEM_TREES: tuple[str, ...] = ("/bin/", "/boot/", "/dev/", "/etc/", "/lib/", "/proc/")
_SYSTEM_TREES += ("/run/", "/sbin/", "/sys/", "/tmp/", "/var/tmp/")
_PATH_KEYS = ("model_stage_dir", "model_cache_dir", "engine_root", "model_hub_cli")
# Trees every local user may write in: root never writes or runs anything under them. The one
# exception is the stage tree the staging script makes and checks itself (/dev/shm/models).
_SHARED_TREES = ("/tmp", "/var/tmp", "/dev/shm")
_STAGE_TMPFS = "/dev/shm"


def _strings(value: Any, where: str) -> Iterable[tuple[str, str]]:
    """(where, text) for every string in a setting's value, nested ones included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def control_characters(text: str) -> list[str]:
    """The control characters in text, as Python escapes ('\\n', '\\x00'); [] when clean."""
    found = {c for c in text if unicodedata.category(c) in _FORBIDDEN_CATEGORIES}
    return sorted(repr(c)[1:-1] for c in found)


def path_escape(path: str) -> str | None:
    """Why an absolute path could mean another directory than it reads as, or None."""
    if not path.startswith("/"):
        return "it is not absolute"
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    if any(p in ("", ".", "..") for p in parts):
        return "it has an empty, '.' or '..' component"
    return None


def _hub_cli_problem(cli: str) -> str | None:
    """model_hub_cli is installed as VENV/bin/hf: VENV must be a directory of its own."""
    venv = posixpath.dirname(posixpath.dirname(cli))
    in_system_tree = (venv + "/").startswith(_SYSTEM_TREES) or (
        venv.startswith("/usr/") and not venv.startswith("/usr/local/")
    )
    if not cli.endswith("/bin/hf"):
        return "the CLI is installed as DIR/bin/hf; accepted: such as /opt/sglang-hub/bin/hf"
    if venv in _SYSTEM_DIRS or in_system_tree:
        return (
            f"its environment would be {venv}, a system directory that the Hugging Face CLI's "
            "install would take over; accepted: DIR/bin/hf with DIR a directory of its own, "
            "such as /opt/sglang-hub/bin/hf"
        )
    return None


def _shared_tree_problem(key: str, path: str) -> str | None:
    """A root path under a tree every local user writes in (/tmp, /var/tmp, /dev/shm): another
    user could make the directory first, or plant a file root then runs or serves."""
    where = posixpath.dirname(posixpath.dirname(path)) if key == "model_hub_cli" else path
    where = where.rstrip("/") or "/"
    if key == "model_stage_dir" and where == _STAGE_TMPFS:
        return None  # the staging script makes and checks STAGE_DIR/models itself
    if key == "model_stage_dir":
        accepted = f"{_STAGE_TMPFS} itself (the staging script makes and checks its models tree)"
        accepted += " or a tmpfs mounted where only root writes"
    else:
        accepted = "a directory that only root writes to, such as "
        accepted += schema()["properties"][key]["default"]
    for tree in _SHARED_TREES:
        if where == tree or where.startswith(tree + "/"):
            return (
                f"it lies in {tree}, which every local user can write in: another user could "
                f"make {where} first or plant a file there that root then runs or serves; "
                f"accepted: {accepted}"
            )
    return None


def _source_problem(source: str) -> str | None:
    if source.startswith("hf://"):
        repo, _, revision = source.removeprefix("hf://").rpartition("@")
        if ".." in repo or "--" in repo or ".." in revision:
            return (
                "a hub repository or revision holding '..' or '--' (the hub forbids them in "
                "names; a revision with '..' would leave the cache directory); accepted: "
                "hf://org/name@revision"
            )
        return None
    path = source.removeprefix("controller:")
    why = path_escape(path)
    if why is None and path.rstrip("/") in ("", "/"):
        why = "it is the root directory"
    return f"{why}; accepted: a model directory as a plain absolute path" if why else None


def _control_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, why) for values holding control characters, nested strings included."""
    problems: list[tuple[str, str]] = []
    for key, value in values.items():
        for where, text in _strings(value, key):
            bad = control_characters(text)
            if bad:
                problems.append(
                    (
                        key,
                        f"{where} holds control characters ({', '.join(bad)}); accepted: "
                        "text without control characters (no newline, tab, NUL or escape)",
                    )
                )
    return problems


def _value_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, why) for values of the right shape that are still unsafe to use."""
    problems: list[tuple[str, str]] = []
    for key in _PATH_KEYS:
        if key in values:
            why = path_escape(values[key])
            if why:
                problems.append((key, f"{why}; accepted: a plain absolute path"))
    for key in _PATH_KEYS:
        if key in values and not any(k == key for k, _ in problems):
            why = _shared_tree_problem(key, values[key])
            if why:
                problems.append((key, why))
    if "model_hub_cli" in values and not any(k == "model_hub_cli" for k, _ in problems):
        why = _hub_cli_problem(values["model_hub_cli"])
        if why:
            problems.append(("model_hub_cli", why))
    if "model_source" in values:
        why = _source_problem(values["model_source"])
        if why:
            problems.append(("model_source", why))
    name = values.get("model_name")
    if isinstance(name, str) and any(p in (".", "..") for p in name.split("/")):
        problems.append(
            (
                "model_name",
                "a '.' or '..' part would name a directory outside the stage dir; "
                'accepted: a model name such as "Qwen/Qwen3.6-27B"',
            )
        )
    if values.get("service_user") == "root":
        problems.append(
            (
                "service_user",
                "the servers would run as root; accepted: an unprivileged system "
                'user such as "sglang" (created by the deploy)',
            )
        )
    return problems


def _wheelhouse_problems(host_name: str, settings: Settings) -> list[str]:
    """The wheelhouse is a directory on the controller, read before any change: a missing one
    is a settings problem of the plan, not a failure in the middle of the deploy."""
    if not settings.wheelhouse or Path(settings.wheelhouse).expanduser().is_dir():
        return []
    found = Path(settings.wheelhouse).expanduser().absolute()
    why = "is a file, not a directory" if found.exists() else "does not exist"
    return [
        f"{host_name}: wheelhouse = {settings.wheelhouse!r} (set in "
        f"{settings.origin('wheelhouse')}); {found} {why} on the controller; create it with "
        "scripts/fill_wheelhouse.py (docs/engine.md, 'A first air-gapped deploy'), or set "
        "wheelhouse: null to install from the package indexes"
    ]


def _pin_problems(host_name: str, settings: Settings) -> list[str]:
    """uv is installed only as a wheel whose sha256 operations/kb/pins/uv.txt pins."""
    from operations.kb.pins import uv_requirement

    if uv_requirement(settings.uv_version) is not None:
        return []
    return [
        f"{host_name}: uv_version = {settings.uv_version!r} (set in "
        f"{settings.origin('uv_version')}) has no pinned wheel hash in operations/kb/pins/uv.txt; "
        "add it with `python scripts/pin_installs.py --uv VERSION` (every pinned version "
        "again), or use a pinned one"
    ]


def controller_problems(host_name: str, settings: Settings) -> list[str]:
    """Checks of files on the controller (the API key, the wheelhouse): part of every
    inventory load."""
    problems = _wheelhouse_problems(host_name, settings) + _pin_problems(host_name, settings)
    problems += _control_plane_key_problems(host_name, settings)
    if not settings.api_key_file:
        return problems
    path = Path(settings.api_key_file).expanduser()
    where = f"{host_name}: api_key_file = {settings.api_key_file!r} (set in "
    where += f"{settings.origin('api_key_file')})"
    try:
        key = path.read_text()
    except FileNotFoundError:
        why = "no such file on the controller"
    except (OSError, UnicodeDecodeError) as exc:
        why = f"cannot be read on the controller ({getattr(exc, 'strerror', None) or exc})"
    else:
        if not key.strip():
            why = (
                "the file is empty: SGLang turns authentication off for an empty key; put the "
                "key in it, or set api_key_file: null to serve without one"
            )
        elif control_characters(key.strip()):
            why = "the key holds control characters (more than one line?)"
        else:
            return problems
    return [*problems, f"{where}; {why}; accepted: a readable file holding one non-empty API key"]


def _control_plane_key_problems(host_name: str, settings: Settings) -> list[str]:
    """router.control_plane_key_file: a readable file of one key the router's parser takes."""
    name = settings.router.control_plane_key_file if settings.router is not None else None
    if not name:
        return []
    where = f"{host_name}: router.control_plane_key_file = {name!r} (set in "
    where += f"{settings.origin('router')})"
    try:
        key = Path(name).expanduser().read_text().strip()
    except FileNotFoundError:
        why = "no such file on the controller"
    except (OSError, UnicodeDecodeError) as exc:
        why = f"cannot be read on the controller ({getattr(exc, 'strerror', None) or exc})"
    else:
        if len(key) < 16:
            why = "the key is empty or shorter than 16 characters"
        elif control_characters(key) or any(c.isspace() for c in key):
            why = "the key holds whitespace or control characters (more than one line?)"
        else:
            return []
    accepted = "accepted: a readable file holding one key of 16 or more characters, no spaces"
    return [f"{where}; {why}; {accepted}"]


def _same(value: Any) -> Any:
    return value


def _path(value: str) -> str:
    return value.rstrip("/") or "/"


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


# Shapes the schema has checked, turned into the types Settings declares.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "model_source": _path,
    "model_stage_dir": _path,
    "model_cache_dir": _path,
    "engine_root": _path,
    "mem_fraction_static": float,
    "ram_per_rank_gb": float,
    "model_stage_bwlimit_mbps": _number,
    "extra_server_args": tuple,
    "speculative": lambda v: Speculative(**v) if isinstance(v, dict) else None,
    "router": lambda v: Router(**v) if isinstance(v, dict) else None,
}


def layers_for_host(host: Host, group_data_dir: Path | None = None) -> list[Layer]:
    """The data layers of a pyinfra host, labelled with where a user would look for them."""
    inventory = host.inventory
    group_data_dir = group_data_dir or Path.cwd() / "group_data"
    layers = [
        Layer(COMMAND_LINE, inventory.get_override_data() or {}),
        Layer(f"the inventory entry of host {host.name}", inventory.get_host_data(host.name)),
    ]
    # Later groups win in pyinfra's merge, so the last group is the highest precedence.
    for group in reversed(host.groups):
        path = group_data_dir / f"{group}.py"
        label = f"group_data/{group}.py" if path.exists() else f"inventory group {group!r}"
        layers.append(Layer(label, inventory.get_group_data(group)))
    layers.append(Layer("the inventory's 'all' data", inventory.get_data() or {}))
    return layers


def load_for_host(host: Host) -> Settings:
    return load(host.name, layers_for_host(host))


def load_inventory(hosts: Iterable[Any]) -> tuple[dict[str, Settings], list[str]]:
    """Every host's settings, and every problem of every host (the whole inventory at once)."""
    loaded: dict[str, Settings] = {}
    problems: list[str] = []
    hosts = list(hosts)
    for host in hosts:
        try:
            loaded[host.name] = load_for_host(host)
        except SettingsError as exc:
            problems.extend(exc.problems)
            continue
        problems.extend(controller_problems(host.name, loaded[host.name]))
    names = [h.name for h in hosts]
    for name, s in loaded.items():
        if s.router is not None and s.router.host not in names:
            close = difflib.get_close_matches(s.router.host, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"hosts: {', '.join(names)}"
            problems.append(
                f"{name}: router.host {s.router.host!r} (set in {s.origin('router')}) is not a "
                f"host of this inventory; {hint}"
            )
    return loaded, problems
