"""Which SGLang releases fit each host: every known release x lane, fits or not, why, and what
would unlock it.

    python -m operations.releases INVENTORY [--data KEY=VALUE ...] [--json]

Loads the inventory and gathers the facts as `python -m operations.plan` does (pyinfra's own
connectors, @fake included; nothing is changed), then asks the plan itself
(`host_plan.decide`, the one place that decides) for each release and lane the knowledge base
knows, with the host's settings but that pin. A combination fits when its plan has no error;
its unproven parts (what only the GPU settles) are listed either way. Exit status 0 unless the
inventory itself cannot be read.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, TypedDict

from operations import kb as kbmod
from operations import settings as settings_mod
from operations.host_plan import HostReport, decide, gather
from operations.plan import build_state, connect, inventory_arguments, parse_data

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
    from pyinfra.context import ctx_host

    knowledge = kbmod.load()
    state = build_state(inventory_path, override)
    hosts = list(state.inventory)
    loaded, problems = settings_mod.load_inventory(hosts)
    result: dict[str, list[Verdict] | str] = {}
    for problem in problems:
        result[problem.split(":", 1)[0]] = problem
    if loaded:
        unreachable = connect(state)
        for host in hosts:
            if host.name in result:
                continue
            if host not in state.activated_hosts:
                result[host.name] = unreachable.get(host.name, "could not connect")
                continue
            with ctx_host.use(host):
                result[host.name] = verdicts(host, loaded[host.name], knowledge)
    return result


def render(result: dict[str, list[Verdict] | str]) -> str:
    lines: list[str] = []
    for name, entry in result.items():
        lines.append(f"{name}:")
        if isinstance(entry, str):
            lines.append(f"  not asked: {entry}")
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
    args = inventory_arguments("python -m operations.releases", __doc__).parse_args(argv)
    try:
        result = run(args.inventory, parse_data(args.data))
    except SystemExit as exc:  # a user's mistake, in one line
        if isinstance(exc.code, str):
            print(f"error: {exc.code}", file=sys.stderr)
            return 1
        raise
    except kbmod.KnowledgeError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    try:
        if args.json:
            document: Document = {"hosts": result}
            json.dump(document, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render(result))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
