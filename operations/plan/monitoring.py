"""What Prometheus scrapes on a host, and the Grafana dashboard beside it: decided in the plan.

Every host gets a Prometheus file_sd targets file (layout.TARGETS_FILE): one target group per
rank, `SERVER_HOST:PORT` (the address the router's worker list uses, resolver.worker_urls), and
on the router's host one for the router's own metrics (`--prometheus-host BIND --prometheus-port
router.metrics_port`, written on its command line by resolver.resolve_router). Each group carries
the labels `host` (the inventory name), `rank` (the rank number, or `router`) and `version` (the
SGLang release the plan runs, or the sglang-router release). The file is JSON as Prometheus'
file_sd_configs documents it (https://prometheus.io/docs/prometheus/latest/configuration/
configuration/#file_sd_config): a list of {"targets": ["HOST:PORT"], "labels": {...}}; Prometheus
scrapes `/metrics` of each target by default, which is where SGLang (`--enable-metrics`) and the
router serve them.

The dashboard (render/grafana-dashboard.json, see its SOURCE note) is written beside it. Pure:
settings in, MonitoringPlan out; the serve step writes both files through put_file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from operations import layout
from operations.plan.vocabulary import Decision, MonitoringJson, TargetGroupJson
from operations.render.dashboard import DASHBOARD_SOURCE as DASHBOARD_SOURCE
from operations.settings import Settings

ROUTER_RANK = "router"


TargetGroup = TargetGroupJson


@dataclass(frozen=True)
class MonitoringPlan:
    """The targets file's content and where it and the dashboard go."""

    targets: list[TargetGroup]
    targets_file: str = layout.TARGETS_FILE
    dashboard_file: str = layout.DASHBOARD_FILE

    def targets_text(self) -> str:
        """The file as written: stable key order, so a converged run compares equal."""
        return json.dumps(self.targets, indent=2, sort_keys=True) + "\n"

    def to_json(self) -> MonitoringJson:
        return {
            "targets_file": self.targets_file,
            "dashboard_file": self.dashboard_file,
            "targets": self.targets,
        }


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def router_metrics_address(router_host: Settings) -> str | None:
    """The router's metrics as Prometheus (anywhere) reaches them: its bind address, or where it
    binds every address, its host's server_host (drain.router_address's rule from another
    host)."""
    router = router_host.router
    if router is None:
        return None
    bind = router.bind if router.bind not in ("0.0.0.0", "::", "") else router_host.server_host
    return _address(bind, router.metrics_port)


def targets(host_name: str, settings: Settings) -> list[TargetGroup]:
    """One group per rank (with --enable-metrics), and the router's on its own host."""
    groups: list[TargetGroup] = []
    if settings.enable_metrics:
        for rank in range(settings.dp_size):
            groups.append(
                {
                    "targets": [_address(settings.server_host, settings.base_port + rank)],
                    "labels": {
                        "host": host_name,
                        "rank": str(rank),
                        "version": settings.sglang_version,
                    },
                }
            )
    router = settings.router
    address = router_metrics_address(settings)
    if router is not None and router.host == host_name and address is not None:
        groups.append(
            {
                "targets": [address],
                "labels": {"host": host_name, "rank": ROUTER_RANK, "version": router.version},
            }
        )
    return groups


def decide(host_name: str, settings: Settings) -> tuple[MonitoringPlan, Decision]:
    plan = MonitoringPlan(targets(host_name, settings))
    ranks = sum(1 for g in plan.targets if g["labels"]["rank"] != ROUTER_RANK)
    router = any(g["labels"]["rank"] == ROUTER_RANK for g in plan.targets)
    what = f"{ranks} rank target(s)" + (" and the router's" if router else "")
    why = (
        f"a Prometheus file_sd targets file at {plan.targets_file} (labels host, rank, version) "
        f"and a Grafana dashboard at {plan.dashboard_file}"
    )
    if not settings.enable_metrics:
        why += "; enable_metrics is false, so the ranks serve no /metrics and are not listed"
    return plan, Decision("monitoring", what, why)
