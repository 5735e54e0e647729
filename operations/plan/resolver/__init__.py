"""The resolver: (settings, host facts) -> what each rank runs, or why it cannot.

This is the one place where flags, the attention backend and the CUDA lane are decided. It is a
pure function: tests feed it facts directly, the plan command and deploy.py feed it facts
gathered by pyinfra, and so what the plan shows is exactly what a deploy writes.

One module per job:

- types.py: what it reads and writes: `Facts`, `ResolvedHost` (its `Rank`s, and its `Decision`s and
  --json shapes, the plan's words, which operations/plan/vocabulary.py holds: import them from
  there);
- context.py: one host's resolution under way (`Resolution`: settings, facts, kb, the plan);
- engine.py: the release, the CUDA lane and the driver; the engine plan and its compiler;
- model.py: the GPU, the model's architecture and its weights;
- backend.py: the attention backend, and what no_buffer refuses;
- args.py: the server's command line, renamed flags, extra_server_args, the CLI table check;
- startup_levers.py: the release's start-up levers (the watchdog, the weight load's overlap);
- throughput.py: the levers that set a rank's throughput;
- caches.py: where a rank's compilers and tuners keep what they make;
- ranks.py: each rank's argv, environment and unit;
- host.py: the checks in order: `resolve`;
- router.py: the router's command line and unit: `resolve_router`.

Consumers import from here (`resolver.resolve`, `from operations.plan.resolver import Rank`).
"""

from __future__ import annotations

from operations.plan.resolver.args import (
    MANAGED_OPTIONS,
    managed_options,
)
from operations.plan.resolver.host import resolve
from operations.plan.resolver.router import (
    RouterPlan,
    resolve_router,
    worker_urls,
)
from operations.plan.resolver.types import Facts, Rank, ResolvedHost

__all__ = [
    "MANAGED_OPTIONS",
    "Facts",
    "Rank",
    "ResolvedHost",
    "RouterPlan",
    "managed_options",
    "resolve",
    "resolve_router",
    "worker_urls",
]
