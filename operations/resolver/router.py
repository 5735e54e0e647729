"""The router: its command line (every rank of every host as a worker) and unit, for the host
that runs it, checked against sglang-router's own option table and the hosts' rank ports."""

from __future__ import annotations

from dataclasses import dataclass, field

from operations import kb as kbmod
from operations import layout, units
from operations.argv import cli_problems
from operations.settings import Settings


@dataclass(frozen=True)
class RouterPlan:
    argv: list[str]
    unit: str
    workers: list[str]
    health_url: str
    env_dir: str
    version: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def worker_urls(all_settings: list[tuple[str, Settings]]) -> list[str]:
    """Every rank of every host, as the router reaches it."""
    return [
        layout.worker_url(s.server_host, s.base_port + rank)
        for _, s in all_settings
        for rank in range(s.dp_size)
    ]


def resolve_router(
    settings: Settings, host_name: str, all_settings: list[tuple[str, Settings]]
) -> RouterPlan:
    """The router's command line and unit, for the host that runs it."""
    router = settings.router
    assert router is not None and router.host == host_name
    env_dir = layout.router_env(settings)
    workers = worker_urls(all_settings)
    argv = [
        layout.env_python(env_dir),
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *workers,
        "--policy",
        router.policy,
        "--host",
        router.bind,
        "--port",
        str(router.port),
        # Reliability (settings.Router says why each differs from the router's own default).
        "--retry-max-retries",
        str(router.retry_max_retries),
        "--retry-initial-backoff-ms",
        str(router.retry_initial_backoff_ms),
        "--health-check-interval-secs",
        str(router.health_check_interval_s),
        "--health-failure-threshold",
        str(router.health_failure_threshold),
        "--health-success-threshold",
        str(router.health_success_threshold),
        "--cb-failure-threshold",
        str(router.cb_failure_threshold),
        "--cb-timeout-duration-secs",
        str(router.cb_timeout_s),
        "--worker-startup-timeout-secs",
        str(router.worker_startup_timeout_s),
        # Its Prometheus metrics, where the targets file says (operations/monitoring.py).
        "--prometheus-host",
        router.bind,
        "--prometheus-port",
        str(router.metrics_port),
    ]
    errors: list[str] = []
    warnings: list[str] = []
    table = kbmod.load_cli_table("sglang-router", router.version)
    if table is None:
        errors.append(
            f"router version {router.version!r}: no option table for sglang-router "
            f"{router.version}; run 'python scripts/gen_cli_table.py sglang-router "
            f"{router.version}' (see operations/knowledge/cli/README.md)"
        )
    else:
        found, warned = cli_problems(argv[3:], table, "router command line")
        errors += found
        warnings += warned
    if router.metrics_port == router.port:
        errors.append(
            f"router metrics_port {router.metrics_port} (set in {settings.origin('router')}) is "
            "the router's own port; choose another"
        )
    for name, s in all_settings:
        ports = range(s.base_port, s.base_port + s.dp_size)
        for what, port in (
            ("router port", router.port),
            ("router metrics_port", router.metrics_port),
        ):
            if name == host_name and port in ports:
                errors.append(
                    f"{what} {port} (set in {settings.origin('router')}) collides with "
                    f"rank {port - s.base_port} of {name} (ports {ports.start}-{ports.stop - 1})"
                    "; choose a router port outside every host's rank ports"
                )
        if name != host_name and s.server_host.startswith("127."):
            warnings.append(
                f"router on {host_name} reaches {name}'s ranks at {s.server_host}, a loopback "
                "address: set server_host for that host to an address the router can reach"
            )
    unit = units.router_unit(
        version=router.version,
        workers=len(workers),
        port=router.port,
        user=settings.service_user,
        argv=argv,
    )
    return RouterPlan(
        argv=argv,
        unit=unit,
        workers=workers,
        health_url=layout.health_url(router.bind, router.port),
        env_dir=env_dir,
        version=router.version,
        errors=errors,
        warnings=warnings,
    )
