"""The knowledge base as it lies on disk: where its files are (knowledge/sglang.yaml, schema.json,
knowledge/cli/*.json), the shapes schema.json admits (TypedDicts, as the loader reads them), and
the error for data that is broken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import yaml

KNOWLEDGE_DIR = Path(__file__).parent / "knowledge"
CLI_DIR = KNOWLEDGE_DIR / "cli"

# libyaml's safe loader where PyYAML has it (PyYAML's documented `CSafeLoader`; its pure-Python
# `SafeLoader` otherwise): the same documents (tests/unit/test_kb_yaml.py reads every knowledge
# file with both), read ~20x faster; a converged deploy reads sglang.yaml's kept build, and
# caches.yaml and throughput.yaml themselves (throughput.yaml: ~17 ms pure Python, ~1 ms here).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """A knowledge file's YAML text as plain data (safe: no Python objects)."""
    return yaml.load(text, Loader=SAFE_LOADER)


class KnowledgeError(Exception):
    """The knowledge base itself is broken (a bug in our data, not a user mistake)."""


# -- raw shapes: what schema.json admits, as the loader reads them ---------------------------

RawCites = str | list[str]


class RawSource(TypedDict):
    what: str
    url: str


class RawGpu(TypedDict):
    arch: str
    family: str
    min_cuda: str
    source: RawCites


class RawArchive(TypedDict):
    version: str
    path: str
    sha256: str
    size: int


RawCompiler = TypedDict(
    "RawCompiler",
    {
        "version": str,
        "from": str,
        "release": NotRequired[str],
        "root": str,
        "archives": dict[str, RawArchive],
        "why": str,
        "source": RawCites,
    },
)


class RawLane(TypedDict):
    cuda: str
    min_driver: str
    toolkit_driver: str
    source: RawCites
    compiler: RawCompiler


class RawOverride(TypedDict):
    requirement: str
    replaces: str
    source: RawCites


class RawUnproven(TypedDict):
    what: str
    source: RawCites


class RawPackage(TypedDict):
    version: str
    index: str
    index_lane: NotRequired[str]
    source: RawCites


class RawExclude(TypedDict):
    package: str
    replaces: str
    source: RawCites


class RawBuild(TypedDict):
    packages: dict[str, RawPackage]
    overrides: NotRequired[list[RawOverride]]
    excludes: NotRequired[list[RawExclude]]
    unproven: NotRequired[list[RawUnproven]]


class RawPython(TypedDict):
    versions: list[str]
    why: str
    source: RawCites


class RawRelease(TypedDict):
    glibc: str
    python: RawPython
    requires: list[str]
    overrides: NotRequired[list[RawOverride]]
    builds: dict[str, RawBuild]
    source: RawCites


class RawArchitecture(TypedDict):
    first_release: str
    hybrid_linear_attention: bool
    source: RawCites


class RawModel(TypedDict):
    architecture: str
    min_release: NotRequired[str]
    size_gb: NotRequired[float]
    quantization: NotRequired[str]
    source: RawCites


class RawByRelease(TypedDict):
    releases: str
    runs_on: list[str]
    reason: str
    source: RawCites


class RawBackend(TypedDict):
    runs_on: NotRequired[list[str]]
    refused_on: NotRequired[list[str]]
    reason: NotRequired[str]
    source: RawCites
    by_release: NotRequired[list[RawByRelease]]


class RawHybrid(TypedDict):
    releases: str
    backends: list[str]
    reason: NotRequired[str]
    source: RawCites


class RawAuto(TypedDict):
    compute_caps: list[str]
    prefer: list[str]
    why: str
    source: RawCites


class RawSpelling(TypedDict):
    releases: str
    option: str | None
    note: NotRequired[str]
    source: RawCites


class RawLimits(TypedDict, total=False):
    attention_backends: list[str]
    page_size_other_than_1: bool


class RawNoBuffer(TypedDict):
    releases: str
    refuses: NotRequired[RawLimits]
    warns: NotRequired[RawLimits]
    adds: NotRequired[list[str]]
    reason: str
    source: RawCites


class RawStartAssert(TypedDict):
    function: str
    match: NotRequired[str]
    anticipated: NotRequired[str]
    unreachable: NotRequired[str]
    source: RawCites


class RawRouterPolicy(TypedDict):
    policy: str
    releases: str
    reason: str
    source: RawCites


class RawSpeculative(TypedDict):
    hybrid_requires_mamba_strategy: str
    hybrid_reason: str
    flashinfer_newer_than: str
    flashinfer_reason: str
    source: RawCites
    hybrid_max_draft_tokens: NotRequired[int]
    hybrid_max_draft_tokens_reason: NotRequired[str]


class RawRankEnvironment(TypedDict):
    variable: str
    value: str
    flashinfer: str
    compute_caps: list[str]
    compiler: str
    driver_below: NotRequired[str]
    why: str
    source: RawCites


class RawRouterDrain(TypedDict):
    state: str
    settle_secs: int
    settle_update: str
    settle_applied: str
    waits_for_in_flight: bool
    why: str
    source: RawCites


class RawRouterControlPlane(TypedDict):
    key_format: str
    missing_key_status: int
    from_option: str
    no_environment: bool
    why: str
    source: RawCites


class RawRouterWorkerKey(TypedDict):
    field: str
    why: str
    source: RawCites


class RawRouterHealth(TypedDict):
    options: dict[str, str]
    rules: str
    source: RawCites


class RawRankMetrics(TypedDict):
    prefix: str
    gauges: list[str]
    why: str
    source: RawCites


class RawRouterEngines(TypedDict):
    tested: list[str]
    unproven: str
    why: str
    source: RawCites


class RawRouter(TypedDict):
    package: Literal["sglang-router", "smg"]
    commands: list[str]
    launcher: str
    list_workers: str
    remove_worker: str
    add_worker: str
    why: str
    source: RawCites
    update_worker: NotRequired[str]
    worker_states: NotRequired[list[str]]
    duplicate_add_status: NotRequired[int]
    drain: NotRequired[RawRouterDrain]
    control_plane: NotRequired[RawRouterControlPlane]
    worker_api_key: NotRequired[RawRouterWorkerKey]
    health: NotRequired[RawRouterHealth]
    rank_metrics: NotRequired[RawRankMetrics]
    engines: NotRequired[RawRouterEngines]


class RawKnowledge(TypedDict):
    sources: dict[str, RawSource]
    gpus: dict[str, RawGpu]
    lanes: dict[str, RawLane]
    releases: dict[str, RawRelease]
    architectures: dict[str, RawArchitecture]
    models: dict[str, RawModel]
    attention_backends: dict[str, RawBackend]
    hybrid_attention_backends: list[RawHybrid]
    auto_attention_backend: list[RawAuto]
    flags: dict[str, list[RawSpelling]]
    speculative: RawSpeculative
    mamba_no_buffer: list[RawNoBuffer]
    start_asserts: list[RawStartAssert]
    router_policies: NotRequired[list[RawRouterPolicy]]
    rank_environment: list[RawRankEnvironment]
    routers: NotRequired[dict[str, RawRouter]]


class RawCliOption(TypedDict):
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: list[str] | None
    deprecated: bool


class RawCliTable(TypedDict):
    package: str
    version: str
    options: dict[str, RawCliOption]
