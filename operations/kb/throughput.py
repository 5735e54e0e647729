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


class RawTune(TypedDict):
    values: dict[str, list[float]]
    together: list[RawTogether]


class RawThroughput(TypedDict):
    sources: dict[str, RawSource]
    gpus: dict[str, RawGpuCeiling]
    levers: dict[str, RawLever]
    reference: list[RawReference]
    tune: RawTune


# The levers `python -m operations.tune` may move (their settings are numbers the resolver
# writes as flags): a lever of `tune.values` outside these is a knowledge error.
TUNABLE = (
    "max_running_requests",
    "cuda_graph_max_bs",
    "chunked_prefill_size",
    "mem_fraction_static",
)


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
class TuneSpace:
    """The tune's search (knowledge/throughput.yaml `tune`): each lever's values tried one at a
    time, in the file's order, then each pair of `together` moved as one."""

    values: Mapping[str, tuple[float, ...]]
    together: tuple[Together, ...]


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
    for name, values in tune["values"].items():
        if name not in TUNABLE:
            yield (
                f"throughput.yaml tune.values.{name}: not a lever the tune moves "
                f"({', '.join(TUNABLE)})"
            )
        elif not values or not all(isinstance(v, int | float) and v > 0 for v in values):
            yield (
                f"throughput.yaml tune.values.{name}: {values!r}; accepted: a list of numbers "
                "above 0"
            )
    for i, pair in enumerate(tune["together"]):
        for end, name in (("lead", pair["lead"]), ("follows", pair["follows"])):
            if name not in tune["values"]:
                yield (
                    f"throughput.yaml tune.together[{i}].{end}: {name!r} has no tune.values; "
                    "accepted: a lever listed there"
                )


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
                {k: tuple(float(v) for v in vs) for k, vs in raw["tune"]["values"].items()}
            ),
            together=tuple(
                Together(p["lead"], p["follows"], p["why"], _source(raw, p["source"]))
                for p in raw["tune"]["together"]
            ),
        ),
    )
