"""Deployment settings: pyinfra host data, checked against settings.schema.json.

Every problem names the key, the value, where it was set and what is accepted, one line each,
all of them at once. Keys that belong to pyinfra or its connectors (ssh_*, _sudo, ...) pass.

One module per job: schema_json.py reads the schema and its defaults; checks.py holds the checks
beyond the schema's reach; controller_files.py reads the files on the controller the settings
name (the keys, the CUDA manifest), once; this module merges the layers, checks and types them.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pyinfra.api.host import Host

from operations.redact import redact_text
from operations.settings import verdicts
from operations.settings.checks import (
    control_characters,
    control_problems,
    path_escape,
    value_problems,
)
from operations.settings.controller_files import (
    ControllerFiles,
    api_key_problem,
    control_plane_key_problem,
    default_control_plane_key,
    read_all,
)
from operations.settings.schema_json import (
    SCHEMA_PATH,
    PropertySchema,
    SettingsSchema,
    defaults,
    describe,
    schema,
)

__all__ = [
    "COMMAND_LINE",
    "SCHEMA_PATH",
    "ControllerFiles",
    "Layer",
    "PropertySchema",
    "Rollout",
    "Router",
    "Settings",
    "SettingsError",
    "SettingsSchema",
    "SourceKind",
    "SourceSpec",
    "Speculative",
    "control_characters",
    "controller_problems",
    "defaults",
    "layers_for_host",
    "load",
    "load_for_host",
    "load_inventory",
    "parse_source",
    "path_escape",
    "schema",
    "value_problem",
    "verdicts",
    "with_values",
]

# Where the weights come from (docs/how-it-works/model.md): a directory on the target, one on the
# controller, or a Hugging Face hub repository.
SourceKind = Literal["target", "controller", "hf"]


@dataclass(frozen=True)
class Speculative:
    algorithm: str
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class SourceSpec:
    """What `model_source` names (docs/how-it-works/model.md): where the weights come from, and the
    persistent directory on the target they are staged from (the boot unit reads it too)."""

    kind: SourceKind
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
    """The router (smg, or sglang-router for releases up to 0.3.2: the knowledge base's `routers`
    names each release's package) on the inventory host `host`, in front of every rank of every
    host."""

    host: str
    port: int = 8000
    policy: str = "cache_aware"
    bind: str = "0.0.0.0"
    version: str = "1.13.0"
    # Reliability, written on its command line (the router's own defaults in brackets, from
    # sglang-router 0.3.2's router_args.py, the same in smg 1.13.0's; docs/reference/settings.md
    # "The router's keys" says why each):
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
    # smg only (the knowledge base's routers."1.13.0".health, its defaults): a rank that does
    # not answer for this long after a transport failure gets no new requests [2 s] ...
    worker_stall_s: int = 2
    # ... nor one that produces no token for this long while requests are in flight and its
    # queue grows (stretched by its prefill) [3 s]; either lifts on contact or progress. smg
    # judges this only on its gRPC streams: an HTTP rank (this deploy's) that stops producing
    # leaves routing when its /health (a one-token generate) fails, by the health rule above.
    worker_wedge_s: int = 3
    # Where the router serves its Prometheus metrics (on `bind`) [29000 on 0.0.0.0]: written on
    # its command line, listed in the Prometheus targets file (operations/plan/monitoring.py).
    metrics_port: int = 29000
    # The control-plane key (worker add/remove, sglang-router's --control-plane-api-keys) on the
    # controller, written to every host behind the router; None: `router-control-plane.key`
    # beside the engine locks, made by the first run (Settings.control_plane_key_file).
    # docs/how-it-works/security-gateway-and-concurrency.md "The router's control plane".
    control_plane_key_file: str | None = None


# Keys an earlier version took and this one does not: what to do instead (one line each).
REMOVED = {
    "throughput_prompts_per_rank": (
        "removed in 0.14.0: the check measures throughput_rounds windows of throughput_window_s "
        "seconds at saturation instead of a number of prompts; remove the key"
    ),
}


RolloutStrategy = Literal["rolling", "canary"]


@dataclass(frozen=True)
class Rollout:
    """How ranks move onto a new engine or new flags (operations/plan/canary_plan.py). The
    defaults are settings.schema.json's `rollout` default (tests/unit/test_canary_settings.py):
    no strategy set (a canary where a rank already serves, today's roll on a first deploy:
    the plan decides); and for a canary, one rank (the least capacity on the new engine while it is
    judged), 10% slower at most (the throughput guard's margin: a real regression is far past
    it, run-to-run noise of a greedy fixed-length run is a few percent), a minute of soak (long
    enough for a router's retries and health checks to show a failing worker, short beside a
    roll) and no pause."""

    # None (unset): a canary on a host that already serves, today's roll on a first deploy
    # (plan/canary_plan.py decides, and says why when a canary cannot be compared).
    strategy: RolloutStrategy | None = None
    canary_ranks: int = 1
    max_slowdown: float = 0.1
    soak_s: int = 60
    pause: bool = False


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
    max_running_requests: int | None
    chunked_prefill_size: int | None
    schedule_conservativeness: float | None
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
    flashinfer_index_url: str
    flashinfer_jit_cache: bool
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
    throughput_check: str
    throughput_guard: str
    throughput_max_slowdown: float
    throughput_input_len: int
    throughput_output_len: int
    throughput_concurrency_per_rank: int | None
    throughput_max_concurrency_per_rank: int
    throughput_rounds: int
    throughput_window_s: float
    throughput_ramp_timeout_s: int
    throughput_timeout_s: int
    rollout: Rollout
    # The time of a failed canary verdict to judge again on purpose (plan/canary_plan.py).
    canary_judge_again: str | None
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
    # The files on the controller the settings name, as `load` read them (controller_files.py):
    # the plan takes their text from here and reads no file. Never shown.
    controller_files: ControllerFiles = field(default_factory=ControllerFiles, repr=False)

    @property
    def source(self) -> SourceSpec:
        return parse_source(self.model_source, self.model_cache_dir)

    def origin(self, key: str) -> str:
        return self.origins.get(key, "default")

    @property
    def control_plane_key_file(self) -> str | None:
        """The controller's file of the router's control-plane key: router.control_plane_key_file,
        or, unset, the one beside the engine locks; None: no router."""
        if self.router is None:
            return None
        return self.router.control_plane_key_file or default_control_plane_key(self.engine_lock_dir)

    def control_plane_key_origin(self) -> str:
        """Where control_plane_key_file comes from, for a line about it."""
        if self.router is not None and self.router.control_plane_key_file:
            return f"router.control_plane_key_file, set in {self.origin('router')}"
        return (
            "router.control_plane_key_file unset: beside engine_lock_dir, set in "
            f"{self.origin('engine_lock_dir')}"
        )


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


def load(
    host_name: str,
    layers: list[Layer],
    *,
    make_key: bool = False,
    connector_keys: frozenset[str] = frozenset(),
) -> Settings:
    """Merge the layers, validate, apply defaults; raise SettingsError listing every problem.
    `make_key`: a router's control-plane key file that is not set and not there yet is made
    beside the engine locks before it is read (a run of the toolkit's commands, never a test's
    plain settings). `connector_keys`: the host data keys pyinfra's connectors read, not ours
    to judge (the inventory session hands them in:
    runtime/pyinfra_internals.connector_data_keys)."""
    merged, origins = _merge(layers)
    props = schema()["properties"]
    ours = {k: v for k, v in merged.items() if k in props}
    problems: list[str] = []

    for key in sorted(merged):
        if key in props or key in connector_keys or key.startswith("_"):
            continue
        close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.6)
        hint = REMOVED.get(key) or (
            f"did you mean {close[0]!r}?"
            if close
            else "see the Configuration reference, docs/reference/settings.md"
        )
        problems.append(
            f"{host_name}: unknown setting {key!r} = {merged[key]!r} "
            f"(set in {origins[key]}); {hint}"
        )

    # Control characters first: for such a value that is the one thing to say.
    control = control_problems(ours)
    problems += [
        f"{host_name}: {key} = {ours[key]!r} (set in {origins[key]}); {why}" for key, why in control
    ]
    for error in verdicts.errors(schema(), ours):
        key, accepts = describe(error, props)
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
            for key, why in value_problems(ours)
        ]
    if problems:
        # Index URLs may carry tokens: an error line is shown, so it never holds one.
        raise SettingsError([redact_text(p) for p in problems])

    values = {**defaults(), **ours}
    typed = {key: _CONVERT.get(key, _same)(values[key]) for key in props}
    files = _read_controller_files(typed, make_key)
    return Settings(**typed, origins={k: origins[k] for k in ours}, controller_files=files)


def value_problem(key: str, value: object) -> str | None:
    """What `load` would refuse in `value` for the setting `key` alone (its schema, and the
    checks beyond it), as "VALUE; accepted: ..."; None when it is accepted."""
    props = schema()["properties"]
    if key not in props:
        return f"{key!r} is not a setting; see docs/reference/settings.md"
    one = {"type": "object", "properties": {key: props[key]}}
    for error in verdicts.errors(one, {key: value}):
        return f"{value!r}; accepted: {describe(error, props)[1]}"
    for _, why in control_problems({key: value}) + value_problems({key: value}):
        return f"{value!r}; {why}"
    return None


def with_values(s: Settings, values: Mapping[str, object], origin: str) -> Settings:
    """`s` with `values` (each as a group_data line sets it) checked as `load` checks each key
    (SettingsError naming every problem), converted as `load` converts them, each set in
    `origin`. Pure: the controller's files are `s`'s."""
    problems = [
        f"{key} = {value!r} (set in {origin}): {why}"
        for key, value in values.items()
        if (why := value_problem(key, value)) is not None
    ]
    if problems:
        raise SettingsError(problems)
    typed = {key: _CONVERT.get(key, _same)(value) for key, value in values.items()}
    origins = {**s.origins, **dict.fromkeys(values, origin)}
    return replace(s, **typed, origins=origins)


def _read_controller_files(typed: Mapping[str, Any], make_key: bool) -> ControllerFiles:
    """The files on the controller the typed values name, each read once; the router's
    control-plane key is router.control_plane_key_file or, unset, the one beside the engine
    locks, which `make_key` makes first when it is not there yet."""
    router: Router | None = typed["router"]
    key_file, made_here = None, False
    if router is not None:
        key_file = router.control_plane_key_file or default_control_plane_key(
            typed["engine_lock_dir"]
        )
        made_here = make_key and not router.control_plane_key_file
    return read_all(
        typed["api_key_file"],
        key_file,
        typed["cuda_redist_manifest"],
        make_control_plane_key=made_here,
    )


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
        "scripts/fill_wheelhouse.py (docs/how-to/air-gap.md, 'A first air-gapped deploy'), or set "
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
    """Checks of files on the controller (the wheelhouse, uv's pin, the keys `load` read): part
    of every inventory load."""
    problems = _wheelhouse_problems(host_name, settings) + _pin_problems(host_name, settings)
    read = settings.controller_files
    if settings.control_plane_key_file and read.control_plane_key:
        why = control_plane_key_problem(read.control_plane_key)
        if why is not None:
            problems.append(
                f"{host_name}: the router's control-plane key "
                f"{settings.control_plane_key_file!r} ({settings.control_plane_key_origin()}); "
                f"{why}"
            )
    if settings.api_key_file and read.api_key:
        why = api_key_problem(read.api_key)
        if why is not None:
            problems.append(
                f"{host_name}: api_key_file = {settings.api_key_file!r} (set in "
                f"{settings.origin('api_key_file')}); {why}"
            )
    return problems


def _same(value: Any) -> Any:
    return value


def _path(value: str) -> str:
    return value.rstrip("/") or "/"


def _rollout(rollout: Rollout) -> Rollout:
    return replace(rollout, max_slowdown=float(rollout.max_slowdown))


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


# Shapes the schema has checked, turned into the types Settings declares.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "model_source": _path,
    "model_stage_dir": _path,
    "model_cache_dir": _path,
    "engine_root": _path,
    "mem_fraction_static": float,
    "throughput_max_slowdown": float,
    "throughput_window_s": float,
    "ram_per_rank_gb": float,
    "model_stage_bwlimit_mbps": _number,
    "schedule_conservativeness": _number,
    "extra_server_args": tuple,
    "speculative": lambda v: Speculative(**v) if isinstance(v, dict) else None,
    "router": lambda v: Router(**v) if isinstance(v, dict) else None,
    "rollout": lambda v: _rollout(Rollout(**v)),
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


def load_for_host(host: Host, connector_keys: frozenset[str]) -> Settings:
    """A host's settings for a run of the toolkit: its router's control-plane key is made on
    the controller when it is not set and not there yet (the first run, by whichever host comes
    first; the others read it)."""
    return load(host.name, layers_for_host(host), make_key=True, connector_keys=connector_keys)


def load_inventory(
    hosts: Iterable[Any], connector_keys: frozenset[str]
) -> tuple[dict[str, Settings], list[str]]:
    """Every host's settings, and every problem of every host (the whole inventory at once).
    `connector_keys`: the host data keys pyinfra's connectors read (load's)."""
    loaded: dict[str, Settings] = {}
    problems: list[str] = []
    hosts = list(hosts)
    for host in hosts:
        try:
            loaded[host.name] = load_for_host(host, connector_keys)
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
