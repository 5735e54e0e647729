"""Which SGLang releases fit each host: every known release x lane, fits or not, why, and what
would unlock it.

    python -m operations.releases INVENTORY [--data KEY=VALUE ...] [--json]

Loads the inventory and gathers the facts as `python -m operations.plan` does (pyinfra's own
connectors, @fake included; nothing is changed), then asks the plan itself
(`host_plan.decide`, the one place that decides) for each release and lane the knowledge base
knows, with the host's settings but that pin. A combination fits when its plan has no error;
its unproven parts (what only the GPU settles) are listed either way. Exit status 0 when every
host was asked; 1 when the inventory cannot be read (one line), or a host was not asked (its
settings do not pass, one line per key, or it could not be reached).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, TypedDict

from operations import kb as kbmod
from operations import settings as settings_mod
from operations.plan.host_plan import HostReport, decide
from operations.runtime.gather import gather

if TYPE_CHECKING:
    from pyinfra.api.host import Host

UNPROVEN = "is unproven: "


class Verdict(TypedDict):
    release: str
    lane: str
    fits: bool
    why: list[str]
    unproven: list[str]
    unlock: list[str]


class Document(TypedDict):
    """What --json prints: each host's verdicts, or why it was not asked."""

    hosts: dict[str, list[Verdict] | str]


def unlock_hints(errors: list[str], knowledge: kbmod.Knowledge, lane: str) -> list[str]:
    """What would make a refused combination plan: read off the plan's own reasons."""
    hints: list[str] = []
    needs = knowledge.lanes[lane].min_driver
    if any("driver" in e and f">= {needs}" in e for e in errors):
        hints.append(
            f"driver >= {needs} on the Proxmox node (the node's NVIDIA module, installed there: "
            "docs/engine.md, 'Off driver 570'); then the container's user space to match: "
            "`pyinfra inventory/pve.py pve.py --data pve_install_driver=true` (preview with "
            f"--dry); then `cuda_lane={lane}`"
        )
    if any("python3 is" in e or "Python" in e for e in errors):
        hints.append("a host python3 among the release's python.versions")
    if any(("serve" in e and "sglang >=" in e) or "first served by" in e for e in errors):
        hints.append("a model the release serves (or a newer release)")
    return hints


def verdicts(
    host: Host, settings: settings_mod.Settings, knowledge: kbmod.Knowledge
) -> list[Verdict]:
    facts = gather(host, settings)
    out: list[Verdict] = []
    for release in knowledge.supported_releases():
        for lane in knowledge.releases[release].lanes:
            pinned = dataclasses.replace(settings, sglang_version=release, cuda_lane=lane)
            report = decide(host.name, pinned, facts, knowledge)
            out.append(verdict(release, lane, report, knowledge))
    return out


def verdict(release: str, lane: str, report: HostReport, knowledge: kbmod.Knowledge) -> Verdict:
    plan = report.to_json()
    errors = list(plan["errors"])
    unproven = [w.split(UNPROVEN, 1)[1] for w in plan["warnings"] if UNPROVEN in w]
    return {
        "release": release,
        "lane": lane,
        "fits": not errors,
        "why": errors,
        "unproven": unproven,
        "unlock": unlock_hints(errors, knowledge, lane) if errors else [],
    }


def run(inventory_path: str, override: dict[str, object]) -> dict[str, list[Verdict] | str]:
    """Verdicts by host; a host not asked is why, in lines (its settings' problems, one per
    key, or why it could not be reached)."""
    from operations.runtime.inventory import open_session

    knowledge = kbmod.load()
    session = open_session(inventory_path, override)
    session.connect()
    result: dict[str, list[Verdict] | str] = {}
    for visit in session.each():
        if visit.problems:
            result[visit.name] = "\n".join(visit.problems)
        elif visit.settings is None:
            result[visit.name] = visit.unreachable or "could not connect"
        else:
            result[visit.name] = verdicts(visit.host, visit.settings, knowledge)
    return result


def render(result: dict[str, list[Verdict] | str]) -> str:
    lines: list[str] = []
    for name, entry in result.items():
        lines.append(f"{name}:")
        if isinstance(entry, str):
            lines += [f"  not asked: {why}" for why in entry.splitlines()]
            continue
        fits = [f"{v['release']}/{v['lane']}" for v in entry if v["fits"]]
        lines.append(f"  fits: {', '.join(fits) or 'nothing'}")
        for v in entry:
            mark = "fits" if v["fits"] else "does not fit"
            lines.append(f"  sglang {v['release']} {v['lane']}: {mark}")
            lines += [f"    why: {w}" for w in v["why"]]
            lines += [f"    unproven: {u}" for u in v["unproven"]]
            lines += [f"    unlock: {u}" for u in v["unlock"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import InventoryError, inventory_arguments, parse_data, said

    args = inventory_arguments("python -m operations.releases", __doc__).parse_args(argv)
    try:
        result = run(args.inventory, parse_data(args.data))
    except InventoryError as exc:  # a user's mistake, in one line
        print(said(exc), file=sys.stderr)
        return 1
    except kbmod.KnowledgeError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if args.json:
        document: Document = {"hosts": result}
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    # A host not asked (its settings, or unreachable) has no answer: as in the plan, exit 1.
    return 0 if all(isinstance(entry, list) for entry in result.values()) else 1
