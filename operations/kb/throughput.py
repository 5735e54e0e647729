"""Throughput knowledge: knowledge/throughput.yaml (the levers that set a rank's throughput, each
with what it trades and its sources; the card's ceilings; public reference figures), loaded once
into frozen dataclasses and checked, every problem named by its key. `ceilings()` turns a card
and a model's size into the two numbers a measurement is read against.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NotRequired, TypedDict, cast

from operations.kb.raw import KNOWLEDGE_DIR, KnowledgeError, RawCites, RawSource, parse_yaml
from operations.kb.types import Cites, Source
from operations.settings import value_problem

THROUGHPUT_FILE = KNOWLEDGE_DIR / "throughput.yaml"

LEVERS = (
    "max_running_requests",
    "cuda_graph_max_bs",
    "chunked_prefill_size",
    "mem_fraction_static",
    "schedule_conservativeness",
    "speculative",
    "fp8_checkpoint",
)
Counts = Literal["output", "total"]


class RawGpuCeiling(TypedDict):
    names: list[str]
    compute_cap: str
    memory_bandwidth_gb_s: float
    dense_bf16_tflops: float
    source: RawCites


class RawLever(TypedDict):
    why: str
    source: RawCites
    speculative_cap: NotRequired[int]
    release_default: NotRequired[int]


class RawReference(TypedDict):
    what: str
    concurrency: int
    tok_s: float
    counts: str
    source: RawCites


class RawTogether(TypedDict):
    lead: str
    follows: str
    why: str
    source: RawCites


class RawNeed(TypedDict):
    lever: str
    sets: NotRequired[dict[str, object]]
    explicit: NotRequired[str]
    why: str
    source: RawCites


class RawLast(TypedDict):
    levers: list[str]
    why: str
    source: RawCites


class RawTune(TypedDict):
    values: dict[str, list[object]]
    together: list[RawTogether]
    needs: NotRequired[list[RawNeed]]
    last: NotRequired[RawLast]


class RawThroughput(TypedDict):
    sources: dict[str, RawSource]
    gpus: dict[str, RawGpuCeiling]
    levers: dict[str, RawLever]
    reference: list[RawReference]
    tune: RawTune


# The levers `python -m operations.tune` may move (each a setting the resolver writes as
# flags): a lever of `tune.values` outside these is a knowledge error.
TUNABLE = (
    "max_running_requests",
    "cuda_graph_max_bs",
    "chunked_prefill_size",
    "mem_fraction_static",
    "schedule_conservativeness",
    "speculative",
)

# One value of a tune lever, as a group_data line sets the setting (settings.schema.json checks
# it at load): a whole number or a fraction, a name, false or null (off), or a mapping.
TuneValue = int | float | bool | str | None | Mapping[str, object]


@dataclass(frozen=True)
class GpuCeiling:
    """One card's roofline: what bounds a decode step (bandwidth) and a full batch (compute)."""

    key: str
    names: tuple[str, ...]  # as nvidia-smi prints them
    compute_cap: str
    memory_bandwidth_gb_s: float
    dense_bf16_tflops: float
    source: Cites


@dataclass(frozen=True)
class ThroughputLever:
    name: str
    why: str  # what it does and what it trades
    source: Cites
    # max_running_requests: what speculative decoding caps it at when it is unset.
    speculative_cap: int | None = None
    # The release's own value on the card the knowledge names (90-160 GiB), where it has one.
    release_default: int | None = None


@dataclass(frozen=True)
class ReferenceFigure:
    what: str
    concurrency: int
    tok_s: float
    counts: Counts  # output tokens only, or input and output
    source: Cites


@dataclass(frozen=True)
class Together:
    """Two levers the tune moves together: `follows` takes `lead`'s value in the pair's
    candidates (a larger running batch than the CUDA-graph size decodes without graphs)."""

    lead: str
    follows: str
    why: str
    source: Cites


@dataclass(frozen=True)
class Need:
    """What a candidate that turns `lever` on (a value other than false or null) carries with it:
    `sets`, settings at these values (where the current settings differ); `explicit`, a lever
    that must be set (where the current settings leave it unset, the candidate is tried at each
    of its tune.values)."""

    lever: str
    sets: Mapping[str, TuneValue]
    explicit: str | None
    why: str
    source: Cites


@dataclass(frozen=True)
class Last:
    """Levers searched after every other lever and pair (each value on the current settings)."""

    levers: tuple[str, ...]
    why: str
    source: Cites


@dataclass(frozen=True)
class TuneSpace:
    """The tune's search (knowledge/throughput.yaml `tune`): each lever's values tried one at a
    time, in the file's order, then each pair of `together` moved as one, then the `last`
    levers' values; a candidate carries what its `needs` say."""

    values: Mapping[str, tuple[TuneValue, ...]]
    together: tuple[Together, ...]
    needs: tuple[Need, ...] = ()
    last: Last | None = None


@dataclass(frozen=True)
class ThroughputKnowledge:
    gpus: Mapping[str, GpuCeiling]
    levers: Mapping[str, ThroughputLever]
    reference: tuple[ReferenceFigure, ...]
    tune: TuneSpace

    def gpu_named(self, name: str) -> GpuCeiling | None:
        """The card nvidia-smi calls `name`; None for one the knowledge has no figures for."""
        return next((g for g in self.gpus.values() if name in g.names), None)

    def lever(self, name: str) -> ThroughputLever:
        return self.levers[name]


def ceilings(gpu: GpuCeiling, model_bytes: float, params: float) -> tuple[float, float]:
    """(single_stream_tok_s, full_batch_tok_s) for one card: a decode step of one stream reads
    every weight once (bandwidth / weight bytes); a full batch spends two FLOPs per parameter
    per token (dense bf16 TFLOPS / (2 * params)). Upper bounds, never a prediction: KV cache
    reads, attention and scheduling come on top."""
    if model_bytes <= 0 or params <= 0:
        raise ValueError(f"model_bytes {model_bytes!r} and params {params!r} must be above 0")
    single = gpu.memory_bandwidth_gb_s * 1e9 / model_bytes
    full = gpu.dense_bf16_tflops * 1e12 / (2 * params)
    return single, full


def _cites(raw: RawCites) -> tuple[str, ...]:
    return (raw,) if isinstance(raw, str) else tuple(raw)


def _problems(raw: RawThroughput) -> Iterator[str]:
    sources = raw["sources"]
    cited: list[tuple[str, RawCites]] = [
        *((f"gpus.{k}", g["source"]) for k, g in raw["gpus"].items()),
        *((f"levers.{k}", lever["source"]) for k, lever in raw["levers"].items()),
        *((f"reference[{i}]", r["source"]) for i, r in enumerate(raw["reference"])),
        *((f"tune.together[{i}]", p["source"]) for i, p in enumerate(raw["tune"]["together"])),
        *((f"tune.needs[{i}]", n["source"]) for i, n in enumerate(raw["tune"].get("needs", []))),
        *(("tune.last", last["source"]) for last in [raw["tune"]["last"]] if "last" in raw["tune"]),
    ]
    for key, cites in cited:
        if not _cites(cites):
            yield f"throughput.yaml {key}: no source"
        for name in _cites(cites):
            if name not in sources:
                yield f"throughput.yaml {key}: source {name!r} is not a key of sources"
    for name in LEVERS:
        if name not in raw["levers"]:
            yield f"throughput.yaml levers: {name} is missing"
    for name in raw["levers"]:
        if name not in LEVERS:
            yield (
                f"throughput.yaml levers.{name}: not a lever the plan decides ({', '.join(LEVERS)})"
            )
    for key, gpu in raw["gpus"].items():
        figures = {
            "memory_bandwidth_gb_s": gpu["memory_bandwidth_gb_s"],
            "dense_bf16_tflops": gpu["dense_bf16_tflops"],
        }
        for field, value in figures.items():
            if not isinstance(value, int | float) or value <= 0:
                yield f"throughput.yaml gpus.{key}.{field}: {value!r}; accepted: a number above 0"
        if not gpu["names"]:
            yield f"throughput.yaml gpus.{key}.names: empty; list the names nvidia-smi prints"
    for i, ref in enumerate(raw["reference"]):
        if ref["counts"] not in ("output", "total"):
            yield (
                f"throughput.yaml reference[{i}].counts: {ref['counts']!r}; accepted: output, total"
            )
    yield from _tune_problems(raw["tune"])
    running = raw["levers"].get("max_running_requests")
    if running is not None and "speculative_cap" not in running:
        yield "throughput.yaml levers.max_running_requests: no speculative_cap"


def _tune_problems(tune: RawTune) -> Iterator[str]:
    """Each lever one the tune moves, each value one its setting accepts (settings.schema.json,
    as a group_data line is checked), each pair, need and last lever naming levers with
    values."""
    for name, values in tune["values"].items():
        if name not in TUNABLE:
            yield (
                f"throughput.yaml tune.values.{name}: not a lever the tune moves "
                f"({', '.join(TUNABLE)})"
            )
        elif not isinstance(values, list) or not values:
            yield f"throughput.yaml tune.values.{name}: {values!r}; accepted: a list of its values"
        else:
            for i, value in enumerate(values):
                why = value_problem(name, value)
                if why is not None:
                    yield f"throughput.yaml tune.values.{name}[{i}]: {why}"
    for i, pair in enumerate(tune["together"]):
        for end, name in (("lead", pair["lead"]), ("follows", pair["follows"])):
            if name not in tune["values"]:
                yield (
                    f"throughput.yaml tune.together[{i}].{end}: {name!r} has no tune.values; "
                    "accepted: a lever listed there"
                )
    for i, need in enumerate(tune.get("needs", [])):
        where = f"throughput.yaml tune.needs[{i}]"
        if need["lever"] not in tune["values"]:
            yield f"{where}.lever: {need['lever']!r} has no tune.values; accepted: a lever there"
        for key, value in need.get("sets", {}).items():
            why = value_problem(key, value)
            if why is not None:
                yield f"{where}.sets.{key}: {why}"
        explicit = need.get("explicit")
        if explicit is not None and explicit not in tune["values"]:
            yield (
                f"{where}.explicit: {explicit!r} has no tune.values; accepted: a lever listed there"
            )
        if not need.get("sets") and explicit is None:
            yield f"{where}: neither sets nor explicit; accepted: one of them or both"
    for name in tune["last"]["levers"] if "last" in tune else []:
        if name not in tune["values"]:
            yield (
                f"throughput.yaml tune.last.levers: {name!r} has no tune.values; accepted: a "
                "lever listed there"
            )


def _frozen(value: object) -> TuneValue:
    """A value as the knowledge holds it (a mapping read-only); checked by _tune_problems."""
    if isinstance(value, dict):
        return MappingProxyType(dict(value))
    return cast(TuneValue, value)


def _source(raw: RawThroughput, cites: RawCites) -> Cites:
    return tuple(
        Source(n, raw["sources"][n]["what"], raw["sources"][n]["url"]) for n in _cites(cites)
    )


@cache
def load_throughput(path: Path = THROUGHPUT_FILE) -> ThroughputKnowledge:
    """throughput.yaml, checked; KnowledgeError naming every broken key."""
    raw = cast(RawThroughput, parse_yaml(path.read_text()))
    problems = list(_problems(raw))
    if problems:
        raise KnowledgeError("\n".join(problems))
    return ThroughputKnowledge(
        gpus=MappingProxyType(
            {
                k: GpuCeiling(
                    key=k,
                    names=tuple(g["names"]),
                    compute_cap=g["compute_cap"],
                    memory_bandwidth_gb_s=float(g["memory_bandwidth_gb_s"]),
                    dense_bf16_tflops=float(g["dense_bf16_tflops"]),
                    source=_source(raw, g["source"]),
                )
                for k, g in raw["gpus"].items()
            }
        ),
        levers=MappingProxyType(
            {
                k: ThroughputLever(
                    name=k,
                    why=lever["why"],
                    source=_source(raw, lever["source"]),
                    speculative_cap=lever.get("speculative_cap"),
                    release_default=lever.get("release_default"),
                )
                for k, lever in raw["levers"].items()
            }
        ),
        reference=tuple(
            ReferenceFigure(
                what=r["what"],
                concurrency=int(r["concurrency"]),
                tok_s=float(r["tok_s"]),
                counts=cast(Counts, r["counts"]),
                source=_source(raw, r["source"]),
            )
            for r in raw["reference"]
        ),
        tune=TuneSpace(
            values=MappingProxyType(
                {k: tuple(_frozen(v) for v in vs) for k, vs in raw["tune"]["values"].items()}
            ),
            together=tuple(
                Together(p["lead"], p["follows"], p["why"], _source(raw, p["source"]))
                for p in raw["tune"]["together"]
            ),
            needs=tuple(
                Need(
                    n["lever"],
                    MappingProxyType({k: _frozen(v) for k, v in n.get("sets", {}).items()}),
                    n.get("explicit"),
                    n["why"],
                    _source(raw, n["source"]),
                )
                for n in raw["tune"].get("needs", [])
            ),
            last=(
                Last(tuple(last["levers"]), last["why"], _source(raw, last["source"]))
                if (last := raw["tune"].get("last")) is not None
                else None
            ),
        ),
    )
