"""Which SGLang releases fit each host: every known release x lane, fits or not, why, and what
would unlock it.

    python -m operations.releases INVENTORY [--data KEY=VALUE ...] [--why] [--json]

Loads the inventory and gathers the facts as `python -m operations.plan` does (pyinfra's own
connectors, @fake included; nothing is changed), then asks the plan itself
(`host_plan.decide`, the one place that decides) for each release and lane the knowledge base
knows, with the host's settings but that pin. A combination fits when its plan has no error;
its unproven parts (what only the GPU settles) are listed either way, one note a reason (each
note's sources under --why), and a build the engine check passed in on this host's GPUs is
marked proven, with the day. Exit status 0 when every host was asked; 1 when the inventory
cannot be read (one line), or a host was not asked (its settings do not pass, one line per key,
or it could not be reached).
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
from operations.cli.report import without_sources
from operations.cli.wrapping import unbroken
from operations.plan.host_plan import HostReport, decide
from operations.plan.resolver import engine as resolver_engine
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
    # The day the engine check passed in this build on the host's GPUs (its record); None: not.
    proven: str | None


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
            "docs/how-to/upgrade-with-canary.md, 'Off driver 570'); then the container's user "
            "space to match: the installer's sha256 in pve_driver_hashes, then "
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
    proven = [d["value"] for d in plan["decisions"] if d["what"] == resolver_engine.PROVEN]
    return {
        "release": release,
        "lane": lane,
        "fits": not errors,
        "why": errors,
        "unproven": unproven,
        "unlock": unlock_hints(errors, knowledge, lane) if errors else [],
        "proven": _day(proven[0]) if proven else None,
    }


def _day(value: str) -> str:
    """The day in the plan's decision for a build proven on the host's GPUs
    (plan/resolver/engine.py, proven_decision: "on this host's GPUs on DATE (...)")."""
    return value.split(resolver_engine.ON_GPUS, 1)[-1].split(" ", 1)[0]


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

# A point about one version of a package ("sglang-kernel 0.4.1 is a CUDA 12.9 build: ...") is
# the same reason for each release's own version of it: one note, with the range of versions.
# So is a point listing what a release leaves out ("left out (...): a, b; ..."): one note, each
# package with the first release it is left out of.
_SUBJECT = re.compile(r"^(?P<lead>[A-Za-z][\w.-]*) (?P<part>\d[\w.+]*) (?P<rest>.+)$", re.S)
_LISTED = re.compile(r"^(?P<lead>[^:]+:) (?P<part>[\w.-]+(?:, [\w.-]+)*)(?P<rest>; .+)$", re.S)


class Reason(NamedTuple):
    """An unproven point less the version (or packages) it names; `lead` is empty when it
    names none, and `listed` when its parts are packages."""

    lead: str
    rest: str
    listed: bool = False


def reason(point: str) -> tuple[Reason, list[str]]:
    """The point's reason, and the version(s) or packages it names."""
    text = point.removesuffix(SETTLES)
    if found := _SUBJECT.match(text):
        return Reason(found["lead"], " " + found["rest"]), [found["part"]]
    if found := _LISTED.match(text):
        return Reason(found["lead"], found["rest"], True), found["part"].split(", ")
    return Reason("", text), []


def said(why: Reason, parts: dict[str, str]) -> str:
    """One reason's note. `parts`: each version (or package) it names, with the first release
    it names it for, in release order."""
    if not why.lead:
        return why.rest
    names = list(parts)
    if not why.listed:
        span = names[0] if len(names) == 1 else f"{names[0]} to {names[-1]}"
        return f"{why.lead} {span}{why.rest}"
    since = len(set(parts.values())) > 1
    listed = ", ".join(f"{n} (from {r})" if since else n for n, r in parts.items())
    return f"{why.lead} {listed}{why.rest}"


def _cells(
    entry: list[Verdict], pin: Pin | None
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, ...], int], dict[Reason, dict[str, str]]]:
    """Each (release, lane)'s cell, the notes its cells point to, numbered in order, and the
    unproven reasons (numbered in order too), each with what it names and from which release."""
    notes: dict[tuple[str, ...], int] = {}
    unproven: dict[Reason, dict[str, str]] = {}
    cells: dict[tuple[str, str], str] = {}
    for v in entry:
        if v["fits"]:
            marks: list[int] = []
            for point in v["unproven"]:
                why, names = reason(point)
                parts = unproven.setdefault(why, {})
                for name in names:
                    parts.setdefault(name, v["release"])
                mark = list(unproven).index(why) + 1
                marks += [mark] if mark not in marks else []
            cell = "fits" + (f" u{','.join(map(str, sorted(marks)))}" if marks else "")
        else:
            cell = f"no ({notes.setdefault(_note_text(v), len(notes) + 1)})"
        if v["proven"]:
            cell += " p"
        if pin is not None and (v["release"], v["lane"]) == pin:
            cell += " <"
        cells[(v["release"], v["lane"])] = cell
    return cells, notes, unproven


def render_host(entry: list[Verdict], pin: Pin | None, width: int, why: bool = False) -> list[str]:
    """One row per release, a column per lane; each reason said once, as a numbered note
    (its sources under `why`, as the plan's compact view leaves them to --why)."""
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
        pinned = f"<: this host's pin (sglang_version {pin.release}, cuda_lane {pin.lane})"
        lines += unbroken(pinned, width, "     ", "  ")
    proven = [f"{v['release']} {v['lane']} on {v['proven']}" for v in entry if v["proven"]]
    if proven:
        lines += unbroken(
            f"p: proven on this host's GPUs: {'; '.join(proven)} (the engine check)",
            width,
            "     ",
            "  ",
        )
    shown = (lambda text: text) if why else without_sources
    lines += [""] if notes else []
    for text, n in notes.items():
        for i, part in enumerate(text):
            lead = f"  ({n}) " if i == 0 else ""
            lines += unbroken(shown(part), width, "      ", lead.ljust(6))
    if unproven:
        lines.append("")
        lines += unbroken(
            "uN: unproven: only the GPUs settle it (the engine check, before any rank)", width, "  "
        )
    for n, (reason_of, parts) in enumerate(unproven.items(), 1):
        lead = f"  u{n} "
        lines += unbroken(shown(said(reason_of, parts)), width, " " * len(lead), lead)
    if not why and (notes or unproven):
        lines.append("  (each note's sources: --why, or --json)")
    return lines


def render(
    result: dict[str, list[Verdict] | str],
    pins: dict[str, Pin] | None = None,
    width: int | None = None,
    why: bool = False,
) -> str:
    width = width or shutil.get_terminal_size((80, 24)).columns
    lines: list[str] = []
    for name, entry in result.items():
        lines.append(f"{name}:")
        if isinstance(entry, str):
            # One line a problem, as every command says it (the terminal wraps it).
            lines += [f"  not asked: {why}" for why in entry.splitlines()]
            continue
        lines += render_host(entry, (pins or {}).get(name), width, why)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from operations.runtime.inventory import InventoryError, inventory_arguments, parse_data, said

    parser = inventory_arguments(layout.command("releases"), __doc__)
    parser.add_argument("--why", action="store_true", help="also each note's sources")
    args = parser.parse_args(argv)
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
        sys.stdout.write(render(result, pins, why=args.why))
    # A host not asked (its settings, or unreachable) has no answer: as in the plan, exit 1.
    return 0 if all(isinstance(entry, list) for entry in result.values()) else 1
