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


def _common_options(argv: list[str]) -> str:
    """A rank's options without its port, one option (with its values) a line: the part every
    rank shares, readable however narrow the terminal."""
    options = argv[3:]
    if "--port" in options:
        at = options.index("--port")
        options = options[:at] + options[at + 2 :]
    lines: list[list[str]] = []
    for word in options:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return "\n".join("  " + shlex.join(line) for line in [*lines, ["--port", "PORT"]])


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
        decisions.add_column("what", style="bold")
        decisions.add_column("value", style="cyan")
        decisions.add_column("why")
        for d in report.plan.decisions:
            decisions.add_row(d.what, d.value, d.why)
        parts.append(decisions)
    for warning in report.plan.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for error in report.plan.errors:
        parts.append(Text(f"error: {error}", style="red"))
    if report.plan.ranks:
        first = report.plan.ranks[0]
        parts.append(Text(f"every rank runs: {' '.join(first.argv[:3])}", style="bold"))
        parts.append(Text(f"{_common_options(first.argv)}\n"))
        ranks = Table(title="ranks", title_justify="left")
        ranks.add_column("rank", justify="right")
        ranks.add_column("GPU (CUDA_VISIBLE_DEVICES)", justify="right")
        ranks.add_column("port", justify="right")
        ranks.add_column("unit")
        for r in report.plan.ranks:
            ranks.add_row(
                str(r.rank), r.env.get("CUDA_VISIBLE_DEVICES", ""), str(r.port), r.unit_name
            )
        parts.append(ranks)
    style = "green" if report.ok else "red"
    status = "ready" if report.ok else "refused"
    return Panel(Group(*parts), title=f"{name}: {status}", border_style=style, expand=False)


def print_reports(reports: Mapping[str, HostReport | str], console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    for name, report in reports.items():
        if isinstance(report, str):
            console.print(Panel(Text(report, style="red"), title=f"{name}: unreachable"))
        else:
            console.print(host_panel(name, report))
