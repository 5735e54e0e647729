"""SGLang's own benchmark client in each release (knowledge/bench/sglang-<v>.json), loaded once.

Generated from each release's wheel by scripts/gen_bench_client.py, never by hand: the module
`python -m` runs, the file that implements it, and the line (in that file) of every flag the
throughput check passes and every --output-file field it reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from operations.kb.raw import KNOWLEDGE_DIR

BENCH_DIR = KNOWLEDGE_DIR / "bench"


@dataclass(frozen=True)
class BenchClient:
    release: str
    module: str  # sglang.bench_serving, or sglang.benchmark.serving from 0.5.15
    file: str  # the implementation, relative to site-packages
    flags: dict[str, int | None]
    fields: dict[str, int | None]

    def missing(self, flags: tuple[str, ...], fields: tuple[str, ...]) -> list[str]:
        """What the check uses that this release's client lacks."""
        return [f for f in flags if self.flags.get(f) is None] + [
            f for f in fields if self.fields.get(f) is None
        ]


@cache
def load_bench_client(release: str, directory: Path = BENCH_DIR) -> BenchClient | None:
    """The release's client, or None when the knowledge base has no file for it."""
    path = directory / f"sglang-{release}.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return BenchClient(raw["release"], raw["module"], raw["file"], raw["flags"], raw["fields"])
