"""How plans and preflight results look on a terminal (rich). No decisions here."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from operations.host_plan import HostReport
from operations.preflight import Failure
from operations.resolver import RouterPlan
from operations.settings import Router


def failures_table(host: str, failures: list[Failure]) -> Table:
    table = Table(title=f"{host}: preflight failed, nothing will be changed", title_justify="left")
    # fold: a fix is only useful whole, also when the output goes to a log 80 columns wide.
    table.add_column("check", style="bold", overflow="fold")
    table.add_column("expected", overflow="fold")
    table.add_column("found", style="red", overflow="fold")
    table.add_column("how to fix", overflow="fold")
    for f in failures:
        table.add_row(f.check, f.expected, f.found, f.fix)
    return table


def _common_options(argv: list[str], keep_port: bool = False) -> str:
    """A rank's options without its port, one option (with its values) a line: the part every
    rank shares, readable however narrow the terminal."""
    options = argv[3:]
    if keep_port:
        return "\n".join("  " + shlex.join(line) for line in _option_lines(options))
    if "--port" in options:
        at = options.index("--port")
        options = options[:at] + options[at + 2 :]
    lines = _option_lines(options)
    return "\n".join("  " + shlex.join(line) for line in [*lines, ["--port", "PORT"]])


def _option_lines(options: list[str]) -> list[list[str]]:
    """One option with its values a line."""
    lines: list[list[str]] = []
    for word in options:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return lines


def router_text(router: RouterPlan, settings: Router | None) -> Text:
    """The router this host runs: where it listens, its workers, its command line."""
    text = Text()
    where = f" on {settings.bind}:{settings.port}, policy {settings.policy}" if settings else ""
    text.append(
        f"router: sglang-router {router.version}{where}, {len(router.workers)} worker(s); "
        f"health {router.health_url}\n",
        style="bold",
    )
    text.append(f"  {shlex.join(router.argv[:3])}\n")
    text.append(_common_options(router.argv, keep_port=True) + "\n")
    return text


def host_panel(name: str, report: HostReport) -> Panel:
    s = report.settings
    parts: list[Table | Text] = []
    head = Text()
    head.append(f"sglang {s.sglang_version} ({s.cuda_lane})  model {s.model_name}\n")
    if report.gpu is not None and report.gpu.ok:
        names = sorted({g.name for g in report.gpu.gpus})
        head.append(
            f"{len(report.gpu.gpus)} x {', '.join(names)}  driver {report.gpu.driver_version}"
            f"  CUDA {report.gpu.cuda_version or 'N/A'}\n"
        )
    parts.append(head)
    if report.failures:
        parts.append(failures_table(name, report.failures))
    if report.plan.decisions:
        decisions = Table(show_header=True, box=None, title="decisions", title_justify="left")
        # fold, never cut: a value or a source URL is only useful whole (80-column logs too).
        decisions.add_column("what", style="bold", overflow="fold")
        decisions.add_column("value", style="cyan", overflow="fold")
        decisions.add_column("why", overflow="fold")
        for d in report.plan.decisions:
            decisions.add_row(d.what, d.value, d.why)
        parts.append(decisions)
    router_warnings = report.router.warnings if report.router is not None else []
    for warning in [*report.plan.warnings, *router_warnings]:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    # Every reason to refuse but preflight's, which the table above shows (errors lists
    # preflight first): the resolver's, the router's, the staging decision's.
    for error in report.errors[len(report.failures) :]:
        parts.append(Text(f"error: {error}", style="red"))
    if report.router is not None and not report.router.errors:
        parts.append(router_text(report.router, report.settings.router))
    if report.plan.ranks:
        first = report.plan.ranks[0]
        parts.append(Text(f"every rank runs: {' '.join(first.argv[:3])}", style="bold"))
        parts.append(Text(f"{_common_options(first.argv)}\n"))
        ranks = Table(title="ranks", title_justify="left")
        ranks.add_column("rank", justify="right")
        ranks.add_column("GPU (CUDA_VISIBLE_DEVICES)", justify="right", overflow="fold")
        ranks.add_column("port", justify="right")
        ranks.add_column("unit", overflow="fold")
        for r in report.plan.ranks:
            ranks.add_row(
                str(r.rank), r.env.get("CUDA_VISIBLE_DEVICES", ""), str(r.port), r.unit_name
            )
        parts.append(ranks)
    style = "green" if report.ok else "red"
    status = "ready" if report.ok else "refused"
    return Panel(Group(*parts), title=f"{name}: {status}", border_style=style, expand=False)


def print_reports(reports: Mapping[str, HostReport | str], console: Console | None = None) -> None:
    """Every host's panel; on stdout unless `console` says otherwise (the deploy's go to
    stderr, beside pyinfra's log)."""
    console = console or Console()
    for name, report in reports.items():
        if isinstance(report, str):
            console.print(Panel(Text(report, style="red"), title=f"{name}: unreachable"))
        else:
            console.print(host_panel(name, report))
