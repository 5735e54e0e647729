"""Show what a deploy would run, per host, without changing anything.

    python -m operations.plan INVENTORY [--data KEY=VALUE ...] [--why] [--json]

Loads the inventory and group_data as pyinfra does (same connectors, @fake included), gathers
the same facts as deploy.py and prints the resolved plan: compact, with every decision's reason
and sources under `--why` (and always in `--json`). Exit status 1 when any host has errors.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TypedDict, cast

from operations import layout
from operations.plan.host_plan import HostReport
from operations.plan.vocabulary import PlanJson
from operations.runtime.gather import plan_for_host

# What each host came to: its report, why it was not reached, or its settings' problems.
Outcome = HostReport | str | list[str]


class ArchiveUrlJson(TypedDict):
    """One CUDA archive the lane's compiler needs: what `fill_wheelhouse.py --cuda` fetches."""

    name: str
    version: str
    file: str
    url: str
    sha256: str
    size: int


class HostJson(PlanJson, total=False):
    compiler_archives: list[ArchiveUrlJson]


class PlanDocument(TypedDict):
    hosts: dict[str, HostJson]


def compiler_archives(report: HostReport) -> list[ArchiveUrlJson]:
    """The compiler's archives with the URL each is fetched from (none: no compiler)."""
    spec = report.plan.engine
    tools = spec.toolkit if spec is not None else None
    if tools is None:
        return []
    from operations.redact import redact

    return [
        {
            "name": a.name,
            "version": a.version,
            "file": a.file_name,
            "url": redact(f"{tools.url}/{a.path}"),  # a mirror's credentials: never shown
            "sha256": a.sha256,
            "size": a.size,
        }
        for a in tools.archives
    ]


def run(inventory_path: str, override: dict[str, object]) -> tuple[dict[str, Outcome], bool]:
    """(reports by host name, all ok). Settings are checked for every host before connecting
    (operations/runtime/inventory.py, the session every command shares)."""
    from operations.runtime.inventory import open_session

    session = open_session(inventory_path, override)
    session.connect()
    reports: dict[str, Outcome] = {}
    for visit in session.each():
        if visit.problems:
            reports[visit.name] = visit.problems
        elif visit.settings is None:
            reports[visit.name] = visit.unreachable or "could not connect"
        else:
            reports[visit.name] = plan_for_host(visit.host, visit.settings, session.everyone)
    ok = all(isinstance(r, HostReport) and r.ok for r in reports.values())
    return reports, ok


def to_json(reports: Mapping[str, Outcome]) -> PlanDocument:
    hosts: dict[str, HostJson] = {}
    for name, report in reports.items():
        if isinstance(report, HostReport):
            data = cast(HostJson, report.to_json())
            archives = compiler_archives(report)
            if archives:
                data["compiler_archives"] = archives
            hosts[name] = data
        else:
            errors = report if isinstance(report, list) else [report]
            hosts[name] = {
                "errors": errors,
                "warnings": [],
                "decisions": [],
                "engine": None,
                "ranks": [],
            }
    return {"hosts": hosts}


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import InventoryError, inventory_arguments, parse_data, said

    parser = inventory_arguments(layout.command("plan"), __doc__)
    parser.add_argument(
        "--why", action="store_true", help="also every decision's reason and sources"
    )
    args = parser.parse_args(argv)
    try:
        reports, ok = run(args.inventory, parse_data(args.data))
    except InventoryError as exc:  # a user's mistake, said in one line (no traceback)
        print(said(exc), file=sys.stderr)
        return 1
    if args.json:
        json.dump(to_json(reports), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from operations.cli.report import print_reports

        # Human output, refusals included, goes to stdout: `plan | less` and grep see it all.
        settings_errors = {k: v for k, v in reports.items() if isinstance(v, list)}
        for problems in settings_errors.values():
            for line in problems:
                print(f"error: {line}")
        print_reports({k: v for k, v in reports.items() if not isinstance(v, list)}, why=args.why)
    return 0 if ok else 1
