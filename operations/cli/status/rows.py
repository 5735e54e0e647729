"""What status shows per host: the rows of ranks and the router built from the ServingStatus
fact (and the SmokeProbe fact with --probe), the arguments of those facts, the JSON document and
the exit status. Pure: no host is asked here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import NotRequired, TypedDict

from operations import layout
from operations.cli.status.canary import CanaryStatusJson, CanaryView
from operations.cli.status.throughput import RecordsJson, ThroughputView
from operations.cli.status.tune import TuneJson, TuneView
from operations.facts.serve import RankLoad, RankStart, Serving, UnitState
from operations.facts.serve_status import ROUTER_KEY
from operations.facts.smoke import Probe, ProbeAnswer
from operations.facts.toolkit_record import ToolkitRecord
from operations.plan import rank_state
from operations.plan.resolver.router import worker_urls
from operations.plan.smoke_plan import ranks_behind_router
from operations.plan.startup import startup_patterns
from operations.plan.toolkit_version import NONE_RECORDED
from operations.redact import redact_data
from operations.settings import Settings

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_ERROR = 0, 1, 2
PROBE_TIMEOUT_S = 2.0


class ServingArgs(TypedDict):
    """The ServingStatus fact's arguments (operations/facts/serve_status.py)."""

    engine_root: str
    model_link: str
    ranks: list[int]
    router: bool
    health_urls: dict[str, str]
    metrics_urls: dict[str, str] | None
    gpus: bool
    router_list: str | None
    timeout_s: float
    start_units: dict[str, str]
    phases: str
    throughput: bool
    canary: bool
    tune: bool


class ProbeArgs(TypedDict):
    """The SmokeProbe fact's arguments (operations/facts/smoke.py)."""

    python: str
    model: str
    targets: dict[str, str]
    timeout_s: float
    service_user: str
    units: dict[str, str]
    router_workers: list[str]


class RequestsRow(TypedDict, total=False):
    """A rank's running and queued requests from /metrics, or why they are missing (none of
    them for a unit found beyond dp_size)."""

    metrics: str
    running_reqs: int | None
    queued_reqs: int | None


class AnswerRow(TypedDict):
    """A rank's (or the router's) answer to the probe's chat request."""

    answered: bool
    latency_s: float | None
    tokens: int | None
    answer: str | None


class ToolkitRow(TypedDict):
    """The host's toolkit record (layout.TOOLKIT_RECORD): the version that last deployed it,
    the date it was first recorded, or why the record is unreadable."""

    version: str | None
    recorded: str | None
    problem: str | None


class HostJson(TypedDict):
    reachable: bool
    error: str | None
    healthy: bool
    probed: bool
    ranks: list[dict[str, object]]  # asdict(RankStatus)
    router: dict[str, object] | None  # asdict(RouterStatus)
    # The toolkit version that last deployed the host, from its record (None: no record).
    toolkit: ToolkitRow | None
    throughput: NotRequired[RecordsJson]
    canary: NotRequired[CanaryStatusJson]
    # The last tune (status/tune.py); null: the host was never tuned.
    tune: NotRequired[TuneJson | None]


class StatusJson(TypedDict):
    """`python -m operations.status --json`."""

    hosts: dict[str, HostJson]
    healthy: bool


@dataclass(frozen=True)
class RankStatus:
    rank: int
    unit: str
    port: int
    # Within dp_size; a unit found beyond it is reported, but does not count.
    expected: bool
    # "active (running)", "failed (failed)", "missing" (no unit file), ...
    state: str
    # "ok", "http 503", "refused", "timeout", "not probed", ...
    health: str
    healthy: bool
    sglang_version: str | None
    lane: str | None
    engine: str | None
    model: str
    model_revision: str | None
    gpu: int | None
    gpu_name: str | None
    gpu_memory_used_mib: int | None
    gpu_memory_total_mib: int | None
    pid: int | None
    uptime_s: int | None
    restarts: int | None
    # The staged copy its unit names (its key), and the environment's path.
    model_path: str | None = None
    # Its requests from its /metrics (sglang:num_running_reqs, sglang:num_queue_reqs), read in
    # the same round trip; None when not read, with why in `metrics`.
    running_reqs: int | None = None
    queued_reqs: int | None = None
    metrics: str | None = None
    # The router's own view of the rank (its worker list, read with the control-plane key):
    # smg's status (ready, draining, not_ready, failed, pending), sglang-router 0.3.2's
    # healthy|unhealthy, or "not listed"; None: no router, or its list was not read (the
    # router row's `workers` says why). `router_stalled`: why smg keeps it out of routing while
    # that status stands (unreachable, wedged); None: routable.
    router_state: str | None = None
    router_stalled: str | None = None
    # --probe: whether it answered a chat request right (None: not probed), how fast, tokens,
    # and why not.
    answered: bool | None = None
    latency_s: float | None = None
    tokens: int | None = None
    answer: str | None = None
    # Its last start phase by phase, read from its journal in the pinned release's words
    # (plan/startup.py); None: not read (a release without start-up data, a unit beyond dp_size).
    startup: RankStart | None = None


@dataclass(frozen=True)
class RouterStatus:
    unit: str
    state: str
    health: str
    healthy: bool
    url: str | None
    pid: int | None
    uptime_s: int | None
    restarts: int | None
    # Its worker list as this host read it: "ok", or why not (None: not asked).
    workers: str | None = None
    answered: bool | None = None
    latency_s: float | None = None
    tokens: int | None = None
    answer: str | None = None


@dataclass
class HostResult:
    name: str
    reachable: bool
    error: str | None = None
    ranks: list[RankStatus] = field(default_factory=list)
    router: RouterStatus | None = None
    # Not contacted because its settings are invalid (`error` says which); JSON: reachable false.
    invalid_settings: bool = False
    # --probe asked its ranks a chat question (each row says how it answered).
    probed: bool = False
    # The toolkit version that last deployed the host (its record); None: no record.
    toolkit: ToolkitRecord | None = None
    # The last throughput record and the one before it (status/throughput.py).
    throughput: ThroughputView | None = None
    # The last canary verdict and the ranks' command lines (status/canary.py).
    canary: CanaryView | None = None
    # The last tune: finished, running or cut off (status/tune.py).
    tune: TuneView | None = None

    def deployed_by(self) -> str:
        """The status's line of the toolkit version that last deployed the host."""
        found = self.toolkit
        if found is None:
            return NONE_RECORDED
        if found.version is None:
            return f"toolkit record {layout.TOOLKIT_RECORD} unreadable: {found.problem}"
        return f"deployed by toolkit {found.version} (recorded {found.recorded or 'with no date'})"

    @property
    def counted(self) -> list[RankStatus]:
        return [r for r in self.ranks if r.expected]

    @property
    def healthy(self) -> bool:
        return (
            self.reachable
            and self.error is None
            and all(r.healthy for r in self.counted)
            and (self.router is None or self.router.healthy)
            and (not self.probed or self.answered)
        )

    @property
    def answered(self) -> bool:
        """Every counted rank (and the router) answered the probe's chat request."""
        router = self.router is None or self.router.answered is True
        return all(r.answered is True for r in self.counted) and router

    def summary(self) -> str:
        if self.invalid_settings:
            return f"{self.name}: not checked: {self.error}"
        if not self.reachable:
            return f"{self.name}: unreachable: {self.error}"
        if self.error is not None:
            return f"{self.name}: {self.error}"
        good = sum(1 for r in self.counted if r.healthy)
        line = f"{self.name}: {good}/{len(self.counted)} ranks healthy"
        bad = [f"rank {r.rank} {r.state}, {r.health}" for r in self.counted if not r.healthy]
        if len(bad) > 3:
            bad = [*bad[:2], f"{len(bad) - 2} more"]
        if bad:
            line += " (" + "; ".join(bad) + ")"
        if self.router is not None:
            line += f", router {'healthy' if self.router.healthy else self.router.health}"
        if self.probed:
            said = sum(1 for r in self.counted if r.answered)
            line += f"; {said}/{len(self.counted)} ranks answered a chat request"
            silent = [f"rank {r.rank}: {r.answer}" for r in self.counted if not r.answered]
            if self.router is not None:
                line += ", router " + ("answered" if self.router.answered else "did NOT")
                if not self.router.answered:
                    silent.append(f"router: {self.router.answer}")
            if len(silent) > 3:
                silent = [*silent[:2], f"{len(silent) - 2} more"]
            if silent:
                line += " (" + "; ".join(silent) + ")"
        return line

    def to_json(self) -> HostJson:
        data: HostJson = {
            "reachable": self.reachable,
            "error": self.error,
            "healthy": self.healthy,
            "probed": self.probed,
            "ranks": [asdict(r) for r in self.ranks],
            "router": asdict(self.router) if self.router is not None else None,
            "toolkit": (
                {
                    "version": self.toolkit.version,
                    "recorded": self.toolkit.recorded,
                    "problem": self.toolkit.problem,
                }
                if self.toolkit is not None
                else None
            ),
        }
        if self.throughput is not None:
            data["throughput"] = self.throughput.to_json()
        if self.canary is not None:
            data["canary"] = self.canary.to_json()
        if self.tune is not None:
            data["tune"] = self.tune.to_json()
        return data


# -- from settings and the fact to rows (pure) ----------------------------------------------


def router_url(settings: Settings, host_name: str) -> str | None:
    router = settings.router
    if router is None or router.host != host_name:
        return None
    return layout.health_url(router.bind, router.port)


def metrics_urls(settings: Settings) -> dict[str, str] | None:
    """Each configured rank's /metrics (None: the ranks run without --enable-metrics)."""
    if not settings.enable_metrics:
        return None
    return {
        str(rank): layout.metrics_url(settings.server_host, settings.base_port + rank)
        for rank in range(settings.dp_size)
    }


def _requests(settings: Settings, load: RankLoad | None) -> RequestsRow:
    """running_reqs, queued_reqs and why they are missing, from the fact's /metrics answer."""
    if not settings.enable_metrics:
        return {"metrics": "off (enable_metrics is false)"}
    if load is None:
        return {"metrics": "not read"}
    if load.error is not None:
        return {"metrics": load.error}
    running = None if load.running is None else round(load.running)
    queued = None if load.queued is None else round(load.queued)
    missing = running is None or queued is None
    return {
        "running_reqs": running,
        "queued_reqs": queued,
        "metrics": "no request gauges on /metrics" if missing else "ok",
    }


def fact_args(settings: Settings, host_name: str, router_list: str | None = None) -> ServingArgs:
    """The ServingStatus arguments for a host with these settings (probes and GPUs included);
    `router_list`: the router's worker list URL as this host reaches it (drain.router_list_url),
    None without a router."""
    urls = {str(rank): layout.rank_health_url(settings, rank) for rank in range(settings.dp_size)}
    router = router_url(settings, host_name)
    if router is not None:
        urls[ROUTER_KEY] = router
    return {
        "engine_root": settings.engine_root,
        "model_link": layout.staged_model_link(settings),
        "ranks": list(range(settings.dp_size)),
        "router": router is not None,
        "health_urls": urls,
        "metrics_urls": metrics_urls(settings),
        "gpus": True,
        "router_list": router_list,
        "timeout_s": PROBE_TIMEOUT_S,
        "start_units": {str(rank): layout.unit_name(rank) for rank in range(settings.dp_size)},
        "phases": startup_patterns(settings.sglang_version),
        "throughput": True,
        "canary": True,
        "tune": True,
    }


def describe_health(answer: str | None, probe_error: str | None) -> str:
    if answer is None:
        return f"not probed ({probe_error})" if probe_error else "not probed"
    if answer == "200":
        return "ok"
    if answer.isdigit():
        return f"http {answer}"
    return answer.replace("error:", "error ")


def describe_unit(unit: UnitState | None, why: str | None = None) -> str:
    """systemd's state; with a running process that does not run what its unit file says
    (`why`: rank_state.rank_pending_restart), "pending restart" and why."""
    if unit is None or not unit.exists:
        return "missing"
    state = f"{unit.active or '?'} ({unit.sub or '?'})"
    why = why or rank_state.pending_restart(unit)
    return f"{state}, pending restart: {why}" if why else state


def _uptime(unit: UnitState | None, now: int | None) -> int | None:
    if unit is None or unit.started_at is None or now is None or unit.active != "active":
        return None
    return max(0, now - unit.started_at)


def _gpu_index(unit: UnitState | None, rank: int) -> int | None:
    if unit is not None and unit.visible_devices is not None:
        first = unit.visible_devices.split(",")[0]
        return int(first) if first.isdigit() else None
    return rank  # one rank per GPU (operations/plan/resolver/ranks.py)


def _engine(unit: UnitState | None, status: Serving) -> tuple[str | None, str | None, str | None]:
    """(environment name, release, lane) of what the rank's unit file runs."""
    env = unit.engine_env() if unit is not None else None
    if env is None:
        return None, None, None
    name = env.rstrip("/").rsplit("/", 1)[-1]
    marker = status.envs.get(name)
    return name, marker.release if marker else None, marker.lane if marker else None


def _revision(settings: Settings, unit: UnitState | None) -> tuple[str | None, str | None]:
    """(key, path) of the staged copy the rank's unit file names."""
    path = unit.model_path() if unit is not None else None
    if path is None:
        return None, None
    return layout.copy_key(settings, path) or path.rstrip("/").rsplit("/", 1)[-1], path


def _router_view(settings: Settings, status: Serving, rank: int) -> tuple[str | None, str | None]:
    """(router_state, router_stalled) of a configured rank: what the router's worker list says
    of its URL (the one the router is given: resolver.worker_urls, which reads no host name)."""
    if status.router_workers is None:
        return None, None
    url = worker_urls([("", settings)])[rank]
    return status.router_states.get(url, "not listed"), status.router_stalled.get(url)


def rank_rows(settings: Settings, status: Serving) -> list[RankStatus]:
    expected = set(range(settings.dp_size))
    gpus = {g.index: g for g in status.gpus}
    rows = []
    for rank in sorted(expected | set(status.ranks)):
        unit = status.ranks.get(rank)
        if rank not in expected and (unit is None or not unit.exists):
            continue
        answer = status.health.get(str(rank))
        state = describe_unit(unit, rank_state.rank_pending_restart(status, rank))
        healthy = unit is not None and unit.exists and unit.active == "active" and answer == "200"
        index = _gpu_index(unit, rank)
        gpu = gpus.get(index) if index is not None else None
        engine, release, lane = _engine(unit, status)
        revision, model_path = _revision(settings, unit)
        seen, stalled = _router_view(settings, status, rank) if rank in expected else (None, None)
        rows.append(
            RankStatus(
                rank=rank,
                unit=layout.unit_name(rank),
                port=settings.base_port + rank,
                expected=rank in expected,
                state=state,
                health=describe_health(answer, status.health_error)
                if rank in expected
                else "not probed (beyond dp_size)",
                healthy=healthy,
                sglang_version=release,
                lane=lane,
                engine=engine,
                model=settings.model_name,
                model_revision=revision,
                gpu=index,
                gpu_name=gpu.name if gpu else None,
                gpu_memory_used_mib=gpu.memory_used_mib if gpu else None,
                gpu_memory_total_mib=gpu.memory_total_mib if gpu else None,
                pid=unit.main_pid if unit is not None else None,
                uptime_s=_uptime(unit, status.now),
                restarts=unit.restarts if unit is not None and unit.exists else None,
                model_path=model_path,
                router_state=seen,
                router_stalled=stalled,
                startup=status.starts.get(str(rank)) if rank in expected else None,
                **(_requests(settings, status.load.get(str(rank))) if rank in expected else {}),
            )
        )
    return rows


def router_row(settings: Settings, host_name: str, status: Serving) -> RouterStatus | None:
    url = router_url(settings, host_name)
    if url is None:
        return None
    unit = status.router
    answer = status.health.get(ROUTER_KEY)
    return RouterStatus(
        unit=layout.ROUTER_UNIT,
        state=describe_unit(unit),
        health=describe_health(answer, status.health_error),
        healthy=unit is not None and unit.active == "active" and answer == "200",
        url=url,
        pid=unit.main_pid if unit is not None else None,
        uptime_s=_uptime(unit, status.now),
        restarts=unit.restarts if unit is not None and unit.exists else None,
        workers=_workers(status),
    )


def _workers(status: Serving) -> str | None:
    if status.router_workers is not None:
        return "ok"
    if status.router_workers_error is not None:
        return f"not read: {status.router_workers_error}"
    return None


def host_result(name: str, settings: Settings, status: Serving) -> HostResult:
    return HostResult(
        name=name,
        reachable=True,
        ranks=rank_rows(settings, status),
        router=router_row(settings, name, status),
        toolkit=status.toolkit,
    )


def probe_args(settings: Settings, host_name: str, status: Serving) -> ProbeArgs:
    """The SmokeProbe arguments: every configured rank and this host's router, asked with the
    python of the environment a rank's unit runs (it has httpx, through openai)."""
    targets = {str(rank): layout.rank_api_base(settings, rank) for rank in range(settings.dp_size)}
    units = {str(rank): layout.unit_name(rank) for rank in range(settings.dp_size)}
    router = layout.router_api_base(settings) if router_url(settings, host_name) else None
    if router is not None:
        targets[ROUTER_KEY] = router
        units[ROUTER_KEY] = layout.ROUTER_UNIT
    envs = [env for unit in status.ranks.values() if (env := unit.engine_env()) is not None]
    env = envs[0] if envs else layout.engine_current(settings.engine_root)
    return {
        "python": layout.env_python(env),
        "model": settings.model_name,
        "targets": targets,
        "timeout_s": float(settings.smoke_timeout_s),
        # The script sends nothing to a listener of another user, or of a unit not active.
        "service_user": settings.service_user,
        "units": units,
        "router_workers": ranks_behind_router(settings) if router is not None else [],
    }


def _answer(probe: Probe, key: str) -> AnswerRow:
    found = probe.answers.get(key)
    if found is None:
        found = ProbeAnswer(False, why=probe.error or "no verdict from the smoke script")
    why = None if found.answered else (found.why or "did not answer")
    return {
        "answered": found.answered,
        "latency_s": found.latency_s,
        "tokens": found.tokens,
        "answer": "ok" if found.answered else why,
    }


def with_probe(result: HostResult, probe: Probe) -> HostResult:
    """The host's rows with each rank's (and the router's) answer to the probe."""
    ranks = [replace(r, **_answer(probe, str(r.rank))) if r.expected else r for r in result.ranks]
    router = replace(result.router, **_answer(probe, ROUTER_KEY)) if result.router else None
    return replace(result, ranks=ranks, router=router, probed=True)


def to_json(results: Iterable[HostResult]) -> StatusJson:
    results = list(results)
    document: StatusJson = {
        "hosts": {r.name: r.to_json() for r in results},
        "healthy": all(r.healthy for r in results),
    }
    # Errors quote settings and connection messages: no URL credential may reach the JSON.
    redacted: StatusJson = redact_data(document)
    return redacted


def exit_status(results: Iterable[HostResult]) -> int:
    results = list(results)
    return EXIT_HEALTHY if results and all(r.healthy for r in results) else EXIT_UNHEALTHY
