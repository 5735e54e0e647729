"""The serve and smoke steps' files, each planned with the digest the ServingState fact read
(planned_files): the scripts, the API key file, the target unit, the monitoring files, each
rank's unit. operations/plan/serve_plan.py decides when each is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from operations import layout
from operations.plan.drain import DrainPlan
from operations.plan.monitoring import MonitoringPlan
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.resolver import Rank
from operations.render import units
from operations.render.dashboard import dashboard_text
from operations.render.host_scripts import script_text
from operations.settings import Settings


@dataclass(frozen=True)
class Writer:
    """The plan's write of a registry entry with what the fact read of it (planned_files)."""

    settings: Settings
    digests: Mapping[str, str]

    def file(self, name: str, path: str, src: str | bytes, shown: bool = False) -> PlannedFile:
        entry = layout.managed_file(self.settings, path)
        return planned(name, entry, src, self.digests, shown=shown)


def serve_files_of(
    write: Writer,
    secret: str | None,
    drain: DrainPlan | None,
    asks_batches: bool,
    watched: MonitoringPlan | None,
    rolls: bool,
    compares: bool = False,
) -> tuple[list[PlannedFile], list[PlannedFile]]:
    """The serve step's files in the order it writes them, and the smoke step's: the request
    script goes with the serve step when a drained batch is asked before it rejoins, else with
    the smoke step (shipped either way, for `status --probe`)."""
    file = write.file
    files = [file("health-wait script", layout.WAIT_SCRIPT, script_text("wait_healthy.py"))]
    if rolls:
        # Only a roll runs it (each batch is one host command): a converged run has no
        # operation for it (issue 29's floor).
        files.append(
            file("roll-batch script", layout.ROLL_BATCH_SCRIPT, script_text("roll_batch.py"))
        )
    if compares:
        # The canary's comparison (and its rollback) runs this run.
        files.append(file("canary script", layout.CANARY_SCRIPT, script_text("canary_compare.py")))
    if secret is not None:
        # A secret: mode 640 before the first byte, /etc/sglang 750 on every run.
        files.append(file("API key file", layout.SECRETS_FILE, secret))
    smoke = script_text("smoke.py")
    smoke_files = [file("Smoke | request script", layout.SMOKE_SCRIPT, smoke)]
    if drain is not None:
        files.append(
            file("drain script", layout.ROUTER_WORKERS_SCRIPT, script_text("router_workers.py"))
        )
        if asks_batches:
            # Each drained batch answers a chat request before it rejoins the router.
            files.append(file("smoke script", layout.SMOKE_SCRIPT, smoke))
            smoke_files = []
    target = layout.unit_path(layout.TARGET)
    files.append(file(layout.TARGET, target, units.target_unit(), shown=True))
    if watched is not None:
        files.append(file("Prometheus targets file", watched.targets_file, watched.targets_text()))
        files.append(file("Grafana dashboard", watched.dashboard_file, dashboard_text()))
    return files, smoke_files


def rank_units(write: Writer, ranks: Sequence[Rank]) -> dict[int, PlannedFile]:
    """The unit file of each rank the step writes, with the digest the fact read (by glob)."""
    return {
        r.rank: write.file(r.unit_name, layout.rank_unit_path(r.rank), r.unit, shown=True)
        for r in ranks
    }
