"""The compatibility knowledge base: knowledge/sglang.yaml and the CLI tables, loaded into frozen,
typed objects and checked. One module per job:

- model.py: the typed entries (`Knowledge`, `Release`, `Lane`, ...) and their lookups;
- raw.py: where the files are, the shapes schema.json admits (TypedDicts), `KnowledgeError`;
- loader.py: the schema check, the reader and the cross-checks: `build()`, `load()`;
- cli.py: the command-line tables (`CliTable`, `load_cli_table`);
- startup.py: each release's start-up log lines, read from its wheel (`load_startup`);
- caches.py: compile caches and start-up levers by release (`release_caches`);
- throughput.py: the throughput levers, the card's ceilings and public reference figures
  (`load_throughput`, `ceilings`).

Consumers import from here (`from operations.kb import Knowledge`, `kb.load()`).
"""

from __future__ import annotations

from operations.kb.caches import (
    CacheKnowledge,
    ReleaseCaches,
    load_caches,
    release_caches,
)
from operations.kb.cli_tables import (
    CliOption,
    CliTable,
    cli_table_path,
    load_cli_table,
)
from operations.kb.loader import (
    build,
    load,
)
from operations.kb.raw import (
    CLI_DIR,
    KNOWLEDGE_DIR,
    KnowledgeError,
)
from operations.kb.startup import (
    PHASES,
    Phase,
    PhaseLine,
    StartupLines,
    load_startup,
    startup_problems,
)
from operations.kb.throughput import (
    GpuCeiling,
    ReferenceFigure,
    ThroughputKnowledge,
    ThroughputLever,
    ceilings,
    load_throughput,
)
from operations.kb.types import (
    PLACEHOLDER,
    PYPI_FILES_URL,
    Architecture,
    AttentionBackend,
    AutoBackend,
    Cites,
    Compiler,
    CompilerArchive,
    Exclude,
    Flag,
    Flags,
    Gpu,
    GpuRule,
    HybridBackends,
    Knowledge,
    KnownModel,
    Lane,
    LaneBuild,
    NoBufferLimits,
    NoBufferRule,
    Override,
    PackageBuild,
    PythonSupport,
    RankEnvironment,
    RankMetrics,
    Release,
    RouterControlPlane,
    RouterDrain,
    RouterEngines,
    RouterHealth,
    RouterPackage,
    RouterPolicy,
    RouterRelease,
    RouterWorkerKey,
    Source,
    Speculative,
    Spelling,
    StartAssert,
    Unproven,
    cite,
    in_range,
    version,
)


def router_package(release: str) -> RouterPackage:
    """The package a router release ships as (its `routers` entry in the knowledge base); a
    release the knowledge base does not name: smg, the name every release after
    sglang-router 0.3.2 ships under (the plan refuses it: no option table, no pins)."""
    known = load().routers.get(release)
    return known.package if known is not None else "smg"


__all__ = [
    "CLI_DIR",
    "KNOWLEDGE_DIR",
    "PHASES",
    "PLACEHOLDER",
    "PYPI_FILES_URL",
    "Architecture",
    "AttentionBackend",
    "AutoBackend",
    "CacheKnowledge",
    "Cites",
    "CliOption",
    "CliTable",
    "Compiler",
    "CompilerArchive",
    "Exclude",
    "Flag",
    "Flags",
    "Gpu",
    "GpuCeiling",
    "GpuRule",
    "HybridBackends",
    "Knowledge",
    "KnowledgeError",
    "KnownModel",
    "Lane",
    "LaneBuild",
    "NoBufferLimits",
    "NoBufferRule",
    "Override",
    "PackageBuild",
    "Phase",
    "PhaseLine",
    "PythonSupport",
    "RankEnvironment",
    "RankMetrics",
    "ReferenceFigure",
    "Release",
    "ReleaseCaches",
    "RouterControlPlane",
    "RouterDrain",
    "RouterEngines",
    "RouterHealth",
    "RouterPackage",
    "RouterPolicy",
    "RouterRelease",
    "RouterWorkerKey",
    "Source",
    "Speculative",
    "Spelling",
    "StartAssert",
    "StartupLines",
    "ThroughputKnowledge",
    "ThroughputLever",
    "Unproven",
    "build",
    "ceilings",
    "cite",
    "cli_table_path",
    "in_range",
    "load",
    "load_caches",
    "load_cli_table",
    "load_startup",
    "load_throughput",
    "release_caches",
    "router_package",
    "startup_problems",
    "version",
]
