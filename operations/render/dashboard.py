"""The Grafana dashboard the serve step writes beside the Prometheus targets file
(grafana-dashboard.json; where it comes from: grafana-dashboard.SOURCE.md). Shipped as it is:
its text is read once per process, like the bundled host programs (host_scripts.script_text)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

DASHBOARD_SOURCE = Path(__file__).parent / "grafana-dashboard.json"


@cache
def dashboard_text() -> bytes:
    return DASHBOARD_SOURCE.read_bytes()
