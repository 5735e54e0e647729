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
import re
import shutil
import sys
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from operations import kb as kbmod
from operations import layout
from operations import settings as settings_mod
from operations.cli.report import unbroken
from operations.plan.host_plan import HostReport, decide
from operations.plan.resolver.context import TRIED
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
            "`.venv/bin/pyinfra inventory/pve.py pve.py --data pve_install_driver=true` (preview "
            f"with --dry); then `cuda_lane={lane}`"
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
            # The values tried are said to be tried, never credited to the inventory.
            origins = {**settings.origins, "sglang_version": TRIED, "cuda_lane": TRIED}
            pinned = dataclasses.replace(
                settings, sglang_version=release, cuda_lane=lane, origins=origins
            )
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


class Pin(NamedTuple):
    """A host's own release and lane, marked in its table."""

    release: str
    lane: str


def run(
    inventory_path: str, override: dict[str, object], pins: dict[str, Pin] | None = None
) -> dict[str, list[Verdict] | str]:
    """Verdicts by host; a host not asked is why, in lines (its settings' problems, one per
    key, or why it could not be reached). `pins` gets each asked host's own release and lane."""
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
            if pins is not None:
                pins[visit.name] = Pin(visit.settings.sglang_version, visit.settings.cuda_lane)
    return result


# A reason's lead names the value tried ("cuda_lane 'cu130' (tried by ...): "): the table's row
# and column say it, so the same reason for many releases is one note.
_LEAD = re.compile(r"^(sglang_version|cuda_lane) '[^']*' \([^)]*\):? ?")


def _note_text(v: Verdict) -> tuple[str, ...]:
    return tuple(_LEAD.sub("", w) for w in v["why"]) + tuple(f"unlock: {u}" for u in v["unlock"])


SETTLES = "; the engine check settles it on this host's GPUs before any rank uses it"


def _cells(
    entry: list[Verdict], pin: Pin | None
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, ...], int], dict[str, int]]:
    """Each (release, lane)'s cell, and the notes its cells point to, numbered in order."""
    notes: dict[tuple[str, ...], int] = {}
    unproven: dict[str, int] = {}
    cells: dict[tuple[str, str], str] = {}
    for v in entry:
        if v["fits"]:
            marks = [
                unproven.setdefault(u.removesuffix(SETTLES), len(unproven) + 1)
                for u in v["unproven"]
            ]
            cell = "fits" + (f" u{','.join(map(str, marks))}" if marks else "")
        else:
            cell = f"no ({notes.setdefault(_note_text(v), len(notes) + 1)})"
        if pin is not None and (v["release"], v["lane"]) == pin:
            cell += " <"
        cells[(v["release"], v["lane"])] = cell
    return cells, notes, unproven


def render_host(entry: list[Verdict], pin: Pin | None, width: int) -> list[str]:
    """One row per release, a column per lane; each reason said once, as a numbered note."""
    lanes = sorted({v["lane"] for v in entry})
    releases = list(dict.fromkeys(v["release"] for v in entry))
    cells, notes, unproven = _cells(entry, pin)
    col = max(len(c) for c in [*cells.values(), *lanes]) + 2
    head = max(len(r) for r in [*releases, "release"]) + 2
    lines = ["  " + "release".ljust(head) + "".join(lane.ljust(col) for lane in lanes).rstrip()]
    for release in releases:
        row = "".join(cells.get((release, lane), "-").ljust(col) for lane in lanes)
        lines.append("  " + release.ljust(head) + row.rstrip())
    if pin is not None:
        lines.append(f"  <: this host's pin (sglang_version {pin.release}, cuda_lane {pin.lane})")
    for text, n in notes.items():
        lines.append("")
        for i, part in enumerate(text):
            lead = f"  ({n}) " if i == 0 else ""
            lines += unbroken(part, width, "      ", lead.ljust(6))
    if unproven:
        lines.append("")
        lines += unbroken(
            "unproven (uN): what only the GPUs settle; the engine check settles it on the "
            "host's GPUs before any rank uses it",
            width,
            "  ",
            "  ",
        )
    for point, n in unproven.items():
        lead = f"  u{n} "
        lines += unbroken(point, width, " " * len(lead), lead)
    return lines


def render(
    result: dict[str, list[Verdict] | str],
    pins: dict[str, Pin] | None = None,
    width: int | None = None,
) -> str:
    width = width or shutil.get_terminal_size((80, 24)).columns
    lines: list[str] = []
    for name, entry in result.items():
        lines.append(f"{name}:")
        if isinstance(entry, str):
            # One line a problem, as every command says it (the terminal wraps it).
            lines += [f"  not asked: {why}" for why in entry.splitlines()]
            continue
        lines += render_host(entry, (pins or {}).get(name), width)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import InventoryError, inventory_arguments, parse_data, said

    args = inventory_arguments(layout.command("releases"), __doc__).parse_args(argv)
    try:
        pins: dict[str, Pin] = {}
        result = run(args.inventory, parse_data(args.data), pins)
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
        sys.stdout.write(render(result, pins))
    # A host not asked (its settings, or unreachable) has no answer: as in the plan, exit 1.
    return 0 if all(isinstance(entry, list) for entry in result.values()) else 1
