"""Deployment settings: pyinfra host data, checked against settings.schema.json.

Every problem names the key, the value, where it was set and what is accepted, one line each,
all of them at once. Keys that belong to pyinfra or its connectors (ssh_*, _sudo, ...) pass.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).parent / "settings.schema.json"


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return loaded


def defaults() -> dict[str, Any]:
    return {k: p["default"] for k, p in schema()["properties"].items() if "default" in p}


@cache
def _pyinfra_keys() -> frozenset[str]:
    """Host data keys that pyinfra's connectors read: these are not ours to judge."""
    from pyinfra.api.connectors import get_all_connectors

    keys: set[str] = set()
    for connector in get_all_connectors().values():
        keys.update(getattr(connector, "data_meta", {}) or {})
    return frozenset(keys)


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
    """The schema has checked the form; this only splits it."""
    if model_source.startswith("controller:"):
        path = model_source.removeprefix("controller:").rstrip("/") or "/"
        name = path.rsplit("/", 1)[-1] or "root"
        return SourceSpec("controller", f"{cache_dir}/controller/{name}", controller_dir=path)
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
    package_index_url: str
    torch_index_url: str
    kernel_index_url: str
    uv_version: str
    ram_per_rank_gb: float
    health_timeout_s: int
    restart_batch_size: int
    router: Router | None
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


def _merge(layers: Iterable[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    props = schema()["properties"]
    merged: dict[str, Any] = {}
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


def _describe(error: jsonschema.ValidationError, props: Mapping[str, Any]) -> tuple[str, str]:
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
    props: dict[str, Any] = schema()["properties"]
    ours = {k: v for k, v in merged.items() if k in props}
    problems: list[str] = []

    for key in sorted(merged):
        if key in props or key in _pyinfra_keys() or key.startswith("_"):
            continue
        close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "see README 'Configuration reference'"
        problems.append(
            f"{host_name}: unknown setting {key!r} = {merged[key]!r} "
            f"(set in {origins[key]}); {hint}"
        )

    validator = jsonschema.Draft202012Validator(schema())
    for error in sorted(validator.iter_errors(ours), key=lambda e: list(e.absolute_path)):
        key, accepts = _describe(error, props)
        if key in ours:
            where = f"= {ours[key]!r} (set in {origins[key]})"
        else:
            where = "is not set (in no inventory, group_data file or --data)"
        problems.append(f"{host_name}: {key} {where}; accepted: {accepts}")

    if problems:
        raise SettingsError(problems)

    values = {**defaults(), **ours}
    typed = {key: _CONVERT.get(key, _same)(values[key]) for key in props}
    return Settings(**typed, origins={k: origins[k] for k in ours})


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


def layers_for_host(host: Any, group_data_dir: Path | None = None) -> list[Layer]:
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


def load_for_host(host: Any) -> Settings:
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
