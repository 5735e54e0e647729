"""The chat requests the serve and smoke steps send (programs/smoke.py), decided in the plan:
one per rolled batch behind a router, asked before it rejoins, and after the serve step each
rank (re)started and not asked in its batch, and the router when anything (re)started
(serve_plan.serve_plan calls `smoke_requests_of`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from operations import layout
from operations.plan.drain import DrainPlan
from operations.plan.resolver import Rank, RouterPlan
from operations.plan.vocabulary import SmokeJson
from operations.settings import Settings

ROUTER_TARGET = "router"  # programs/smoke.py ROUTER: judged by its chat answers alone


def smoke_targets(
    settings: Settings, ranks: Sequence[Rank], router: RouterPlan | None, router_too: bool
) -> list[str]:
    """The script's NAME=URL[*COUNT] arguments: each (re)started rank once, then the router
    `smoke_router_requests` times when it is asked too."""
    targets = [f"{r.unit_name}={layout.rank_api_base(settings, r.rank)}" for r in ranks]
    base = layout.router_api_base(settings)
    count = settings.smoke_router_requests
    if router is not None and router_too and base is not None and count > 0:
        targets.append(f"{ROUTER_TARGET}={base}*{count}")
    return targets


def ranks_behind_router(settings: Settings) -> list[str]:
    """The script's --router-worker UNIT=URL arguments: every rank of this host, as the host
    reaches it. A request through the router carries the key on to a rank, so each one that
    listens is checked as the router is (programs/smoke.py)."""
    return [
        f"{layout.unit_name(rank)}={layout.rank_api_base(settings, rank)}"
        for rank in range(settings.dp_size)
    ]


@dataclass(frozen=True)
class SmokeRequests:
    """One run of programs/smoke.py: the interpreter it runs with (an engine environment's, for
    httpx), its NAME=URL[*COUNT] targets (no targets: nothing is asked), and when the router
    is asked, this host's ranks it forwards to."""

    python: str = ""
    targets: list[str] = field(default_factory=list)
    # This host's ranks the router forwards a request (and its key) to: UNIT=URL each.
    ranks_behind_router: list[str] = field(default_factory=list)


def smoke_json(smoke: SmokeRequests) -> SmokeJson:
    return {
        "python": smoke.python,
        "targets": smoke.targets,
        "router_workers": smoke.ranks_behind_router,
    }


def smoke_requests_of(
    s: Settings,
    ranks: Sequence[Rank],
    batches: Sequence[Sequence[Rank]],
    started: Sequence[Rank],
    rolled: Sequence[Rank],
    router: RouterPlan | None,
    drain: DrainPlan | None,
    router_restart: bool,
) -> tuple[list[SmokeRequests | None], SmokeRequests]:
    """Behind a router, one chat request per rolled batch before it rejoins; then what the
    smoke step asks after the serve step: each rank (re)started (`started`) and not asked in
    its batch (`rolled`: the batches' ranks), and the router when anything (re)started."""
    batch_smoke: list[SmokeRequests | None] = []
    for batch in batches:
        if drain is not None and s.smoke_requests:
            targets = smoke_targets(s, batch, None, router_too=False)
            batch_smoke.append(SmokeRequests(layout.env_python(batch[0].engine_env), targets))
        else:
            batch_smoke.append(None)
    if not s.smoke_requests:
        return batch_smoke, SmokeRequests()
    # A drained batch already answered before it rejoined the router.
    asked = [r for r in started if not _asked_in_roll(r, rolled, drain, s)]
    router_too = router is not None and (bool(started) or router_restart)
    targets = smoke_targets(s, asked, router, router_too)
    # No rank at all (a release the resolver refused, as `releases` tries each): nothing to
    # ask with, nothing asked.
    if not targets or not (asked or ranks):
        return batch_smoke, SmokeRequests()
    python = layout.env_python((asked or list(ranks))[0].engine_env)
    through = any(t.startswith(f"{ROUTER_TARGET}=") for t in targets)
    return batch_smoke, SmokeRequests(python, targets, ranks_behind_router(s) if through else [])


def _asked_in_roll(
    rank: Rank, rolled: Sequence[Rank], drain: DrainPlan | None, s: Settings
) -> bool:
    return drain is not None and s.smoke_requests and rank in rolled
