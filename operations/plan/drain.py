"""Whether a roll on this host is drain-protected, and how: decided once, in the plan.

Behind the router (smg, or sglang-router 0.3.2), every rank the serve step restarts (a roll batch,
a changed API key, a shrink) first leaves the router through the pinned router release's worker API
(the knowledge base's `routers` entry: `DELETE /workers/{id}`; smg lists it `draining`), so no new
request reaches it while the requests it already has finish; smg's own drain is a timer that does
not wait for them, so the step waits until its own /metrics shows nothing running or queued
(`sglang:num_running_reqs` + `sglang:num_queue_reqs` = 0) for at most `drain_timeout_s`, then
restarts it, waits for /health and a chat request, and only then puts it back (`POST /workers`).
smg keeps a removed worker listed `draining` for its drain settle time (5 s by default) and
refuses to re-add it until then: the roll sets the drained worker's own settle to ROLL_SETTLE_S
first (the release's `settle_update`, once that job is done), and the re-add's POST carries it.
Every call sends the router's control-plane key (layout.CONTROL_PLANE_KEY_FILE, read on the host;
resolver/router.py says how sglang-router checks it). The serve step carries this out with
programs/router_workers.py; this module only decides it (pure: settings and knowledge in, DrainPlan
out), so `operations.plan` shows it.

Without a router, clients talk to the ranks directly: a roll restarts each batch as before, and
the plan says that its in-flight requests are cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from operations import layout
from operations.kb import Knowledge, RouterRelease
from operations.plan.vocabulary import Decision
from operations.programs.router_workers import PEER_WAIT_S
from operations.settings import Settings

# smg's drain settle for a worker a roll drains, in its unit (whole seconds): the shortest that
# still keeps the worker listed `draining` a while (0 is smg's "skip draining": removed within a
# poll; the knowledge base's routers."1.13.0".drain and its capture). What protects the worker's
# requests is the roll's own wait on the rank's gauges; smg's timer only has to last until smg
# stops picking the worker, which the `draining` state does at once. Its default (5 s) made
# each re-add wait it out.
ROLL_SETTLE_S = 1


@dataclass(frozen=True)
class DrainPlan:
    """How this host's ranks leave and rejoin the router around a restart."""

    # The router as this host reaches it (http://ADDRESS:PORT).
    router_url: str
    # This host's ranks: rank N listens on server_host:base_port+N.
    server_host: str
    base_port: int
    api: RouterRelease
    # How long a rank may take to finish its in-flight requests once out of the router.
    timeout_s: int
    # How long the router may take to list a re-added rank healthy.
    readmit_timeout_s: int
    # The control-plane key on this host, which every call sends (programs/router_workers.py).
    key_file: str = layout.CONTROL_PLANE_KEY_FILE
    # The router's drain settle for a drained worker, set before its removal and on its re-add
    # (smg); None: the release has no per-worker settle (sglang-router 0.3.2 removes at once).
    settle_s: int | None = None
    # (the ranks' key file on this host, the add request's field): each re-add carries the
    # ranks' key, read there (smg, ranks with an API key); None: the router needs none.
    worker_key: tuple[str, str] | None = None
    # The router's Prometheus server as this host reaches it (router.metrics_port on the address
    # above; its page is URL/metrics) and its circuit breaker's timeout (router.cb_timeout_s):
    # the drain's peer guard reads each worker's breaker there (programs/router_workers.py:
    # smg's GET /workers does not say it); None: not read (the guard takes `ready` alone).
    router_metrics: str | None = None
    breaker_timeout_s: int | None = None

    def worker(self, rank: int) -> str:
        """The rank as the router names it (its --worker-urls entry, resolver.worker_urls)."""
        return layout.worker_url(self.server_host, self.base_port + rank)

    def list_url(self) -> str | None:
        """The router's worker list as a GET URL (what the ServingState fact reads to find
        this host's ranks an interrupted run left out); None when the call is not a GET."""
        return _list_url(self.router_url, self.api)

    def metrics(self, rank: int) -> str:
        """The rank's own /metrics, as its host reaches it."""
        return layout.metrics_url(self.server_host, self.base_port + rank)


def router_address(host_name: str, router_host: Settings, router_bind: str) -> str:
    """The router's address as `host_name` reaches it: its bind address, or where it binds every
    address, loopback on its own host and its host's server_host from any other."""
    if router_bind not in ("0.0.0.0", "::", ""):
        return router_bind
    name = router_host.router.host if router_host.router is not None else ""
    return "127.0.0.1" if host_name == name else router_host.server_host


def _list_url(router_url: str, api: RouterRelease) -> str | None:
    method, _, path = api.list_workers.partition(" ")
    return router_url.rstrip("/") + path if method == "GET" and "{" not in path else None


def _router_address(
    host_name: str, settings: Settings, inventory_settings: list[tuple[str, Settings]]
) -> str:
    router = settings.router
    assert router is not None
    router_host = dict(inventory_settings).get(router.host, settings)
    return router_address(host_name, router_host, router.bind)


def _router_url(
    host_name: str, settings: Settings, inventory_settings: list[tuple[str, Settings]]
) -> str:
    assert settings.router is not None
    address = _router_address(host_name, settings, inventory_settings)
    return layout.worker_url(address, settings.router.port)


def router_list_url(
    host_name: str,
    settings: Settings,
    inventory_settings: list[tuple[str, Settings]],
    kb: Knowledge,
) -> str | None:
    """The router's worker list as this host reaches it, for the ServingState fact (the same
    URL as the DrainPlan's list_url; None: no router, or no listing by GET)."""
    router = settings.router
    api = kb.routers.get(router.version) if router is not None else None
    if api is None:
        return None
    return _list_url(_router_url(host_name, settings, inventory_settings), api)


def decide(
    host_name: str,
    settings: Settings,
    inventory_settings: list[tuple[str, Settings]],
    kb: Knowledge,
) -> tuple[DrainPlan | None, Decision, list[str]]:
    """The drain plan (None: rolls are not drain-protected), the decision the plan shows, and
    warnings."""
    router = settings.router
    if router is None:
        return (
            None,
            Decision(
                "roll drain",
                "none: rolls are not drain-protected",
                "no router: clients talk to the ranks directly, so a restarted rank's in-flight "
                "requests are cut and its clients see connection errors until it answers /health "
                "again (set `router` to drain each rank before it restarts)",
            ),
            [],
        )
    api = kb.routers.get(router.version)
    if api is None:
        known = ", ".join(sorted(kb.routers)) or "none"
        why = (
            f"router {router.version}'s worker API is not in the knowledge base "
            f"(known: {known}): rolls restart ranks the router still sends requests to"
        )
        return None, Decision("roll drain", "none: rolls are not drain-protected", why), [why]
    address = _router_address(host_name, settings, inventory_settings)
    plan = DrainPlan(
        router_url=layout.worker_url(address, router.port),
        server_host=settings.server_host,
        base_port=settings.base_port,
        api=api,
        timeout_s=settings.drain_timeout_s,
        readmit_timeout_s=router.worker_startup_timeout_s,
        settle_s=ROLL_SETTLE_S if api.drain is not None else None,
        worker_key=(layout.SECRETS_FILE, api.worker_api_key.field)
        if api.worker_api_key is not None and settings.api_key_file
        else None,
        router_metrics=layout.local_url(address, router.metrics_port),
        breaker_timeout_s=router.cb_timeout_s,
    )
    sources = ", ".join(s.url for s in api.source)
    timer = settle = keyed = ""
    if plan.worker_key is not None and api.worker_api_key is not None:
        cited = ", ".join(s.id for s in api.worker_api_key.source)
        keyed = (
            f"; each re-add carries the ranks' API key ({api.worker_api_key.field}, read on the "
            f"host from {plan.worker_key[0]}): {api.package} calls a worker added without one "
            f'unauthenticated (knowledge base routers."{router.version}".worker_api_key: {cited})'
        )
    if api.drain is not None and not api.drain.waits_for_in_flight:
        timer = (
            f", listed {api.drain.state} meanwhile: the router's own drain is a timer "
            f"({api.drain.settle_secs}s by default) that does not wait for them"
        )
    if api.drain is not None:
        cited = ", ".join(s.id for s in api.drain.source)
        settle = (
            f"; the router's settle for the drained rank is {ROLL_SETTLE_S}s, not its default "
            f"{api.drain.settle_secs}s ({api.drain.settle_update} before the removal, which "
            f"waits until {api.drain.settle_applied} shows that job done; and on the re-add's "
            "POST), so the re-add, "
            f"refused while it is listed {api.drain.state}, waits at most {ROLL_SETTLE_S}s: the "
            "shortest settle that keeps it listed draining a while (0 skips the drain), "
            "enough for the router to stop picking it; the rank's own gauges, not the timer, "
            f'protect its requests (knowledge base routers."{router.version}".drain: {cited})'
        )
    return (
        plan,
        Decision(
            "roll drain",
            f"through {api.package} {router.version} at {plan.router_url}, up to "
            f"{settings.drain_timeout_s}s per batch"
            + (f", router settle {plan.settle_s}s" if plan.settle_s is not None else ""),
            f"each restarted rank leaves the router first ({api.remove_worker}{timer}) once "
            "another is one the router would send a request to (listed ready, not stalled, its "
            f"circuit breaker not open on {plan.router_metrics}/metrics; {PEER_WAIT_S}s at "
            "most, then it leaves anyway, said), "
            "finishes its in-flight requests (its sglang:num_running_reqs and num_queue_reqs at "
            f"0, or {settings.drain_timeout_s}s), restarts, answers /health and a chat request, "
            f"then rejoins ({api.add_worker}); a rank that fails stays out and the roll stops"
            f"{settle}{keyed} ({sources})",
        ),
        [],
    )
