"""Show what a deploy would run, per host, without changing anything.

    python -m operations.plan INVENTORY [--data KEY=VALUE ...] [--why] [--json]

Loads the inventory and group_data as pyinfra does (same connectors, @fake included), gathers
the same facts as deploy.py and prints the resolved plan: compact, with every decision's reason
and sources under `--why` (and always in `--json`). Exit status 1 when any host has errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from operations import settings as settings_mod
from operations.host_plan import HostReport, plan_for_host
from operations.vocabulary import PlanJson

if TYPE_CHECKING:
    from pyinfra.api.host import Host
    from pyinfra.api.state import State

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


def parse_data(items: list[str]) -> dict[str, object]:
    """`--data KEY=VALUE` values, parsed as pyinfra's CLI parses them."""
    from pyinfra_cli.util import parse_cli_arg

    data: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--data {item!r}: expected KEY=VALUE")
        data[key] = parse_cli_arg(value)
    return data


def build_state(inventory_path: str, override: dict[str, object]) -> State:
    """An initialised pyinfra State, built the way pyinfra's CLI builds it."""
    from pyinfra.api.config import Config
    from pyinfra.api.state import State
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not Path(inventory_path).exists():
        raise SystemExit(f"inventory {inventory_path!r}: no such file")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    state = State(check_for_changes=False)
    state.cwd = cwd
    ctx_state.set(state)
    try:
        inventory = make_inventory(inventory_path, cwd=cwd, override_data=override)
    except Exception as exc:  # the inventory is the user's file: one line, no traceback
        cause = getattr(exc, "exception", exc)
        raise SystemExit(
            f"inventory {inventory_path!r} could not be loaded: {type(cause).__name__}: "
            f"{' '.join(str(cause).split())}"
        ) from None
    ctx_inventory.set(inventory)
    config = Config()
    # One unreachable host must not stop the plan of the others.
    config.FAIL_PERCENT = 100
    state.init(inventory, config)
    return state


def connect(state: State) -> dict[str, str]:
    """Connect every host; why each one that could not be reached was not, in one line, with
    what to do when its inventory says (operations/reach.py). Never raises for a host: pyinfra's
    "No hosts remaining!" (every host unreachable) is the same answer for each."""
    import logging

    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.state import BaseStateCallback

    from operations import reach

    why: dict[str, str] = {}

    class Unreachable(BaseStateCallback):
        @staticmethod
        def host_connect_error(state: State, host: Host, error: BaseException) -> None:
            text = " ".join(str(error.args[0] if error.args else error).split())
            what = reach.hint(host.name)
            why[host.name] = f"{text or type(error).__name__}" + (f"; {what}" if what else "")

    # pyinfra logs each failure itself; the one line above is what we print, once.
    logging.getLogger("pyinfra").disabled = True
    state.add_callback_handler(Unreachable())
    try:
        connect_all(state)
    except PyinfraError:
        pass
    finally:
        logging.getLogger("pyinfra").disabled = False
    return why


def run(inventory_path: str, override: dict[str, object]) -> tuple[dict[str, Outcome], bool]:
    """(reports by host name, all ok). Settings are checked for every host before connecting."""
    from pyinfra.context import ctx_host

    state = build_state(inventory_path, override)
    hosts = list(state.inventory)
    loaded, problems = settings_mod.load_inventory(hosts)
    reports: dict[str, Outcome] = {}
    for problem in problems:
        name = problem.split(":", 1)[0]
        reports.setdefault(name, [])
        entry = reports[name]
        assert isinstance(entry, list)
        entry.append(problem)
    everyone = [(name, s) for name, s in loaded.items() if name not in reports]
    if everyone:
        unreachable = connect(state)
        for host in hosts:
            if host.name in reports:
                continue
            if host not in state.activated_hosts:
                reports[host.name] = unreachable.get(host.name, "could not connect")
                continue
            with ctx_host.use(host):
                reports[host.name] = plan_for_host(host, loaded[host.name], everyone)
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


def inventory_arguments(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line shared by the commands that read an inventory as pyinfra does."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("inventory")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = inventory_arguments("python -m operations.plan", __doc__)
    parser.add_argument(
        "--why", action="store_true", help="also every decision's reason and sources"
    )
    args = parser.parse_args(argv)
    try:
        reports, ok = run(args.inventory, parse_data(args.data))
    except SystemExit as exc:  # a user's mistake, said in one line (no traceback)
        if isinstance(exc.code, str):
            print(f"error: {exc.code}", file=sys.stderr)
            return 1
        raise
    if args.json:
        json.dump(to_json(reports), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from operations.report import print_reports

        # Human output, refusals included, goes to stdout: `plan | less` and grep see it all.
        settings_errors = {k: v for k, v in reports.items() if isinstance(v, list)}
        for problems in settings_errors.values():
            for line in problems:
                print(f"error: {line}")
        print_reports({k: v for k, v in reports.items() if not isinstance(v, list)}, why=args.why)
    return 0 if ok else 1


if __name__ == "__main__":
    from operations.closed_pipe import quiet

    sys.exit(quiet(main))
