"""How plans and preflight results look on a terminal (rich). No decisions here.

The plan is compact by default, in the order a user reads it: errors and warnings first, then
the host's release, lane, backend, engine, model copy, ranks with their command line, ports and
what this run changes, one line per item. The reasons and the sources of every decision are
shown with `why=True` (`python -m operations.plan INVENTORY --why`) and are always in `--json`.

Every string that comes from a user's settings, a package, the host or the knowledge base
reaches rich as `Text` or escaped: rich reads `[cu13]` in `flashinfer-python[cu13]` as markup
and swallows it otherwise.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from operations.cli.wrapping import unbroken
from operations.plan.host_plan import HostReport
from operations.plan.preflight import Failure
from operations.plan.resolver import RouterPlan
from operations.plan.vocabulary import Decision
from operations.redact import redact
from operations.settings import Router

# The decisions the compact view shows in its own rows; any other is shown as "what  value".
_SHOWN = {
    "monitoring",  # the files it writes: --why and --json
    "roll drain",  # a router's drain, or why there is none: --why and --json
    "CUDA lane",
    "engine python",
    "engine pin",
    "engine override",
    "engine exclude",
    "engine compiler",
    "prebuilt kernels",  # its pin is in the engine row; why (or why not): --why
    "attention backend",
    "model staging",
    "compile cache",  # one row for the engine's caches (_cache_row); each with its why: --why
    # The start-up levers: the command line shows what is written; the rest is --why's.
    "watchdog timeout",
    "weight load mode",
    "graph batch size",
    # The throughput levers (operations/plan/resolver/throughput.py), the same way.
    "max running requests",
    "chunked prefill",
    "schedule conservativeness",
    "memory fraction",
    "speculative decoding",
    "weights",
}
# What the compact view calls the other decisions (short labels keep the value column wide).
_LABELS = {"rank environment": "env", "throughput check": "bench"}
# The command line's options are packed into lines this wide (an 80-column panel's inside).
PACK_WIDTH = 72
# "(source: URL; URL)" at the end of a reason: behind --why in the compact view.
_SOURCES = re.compile(r"\s*\(source: [^()]*(?:\([^()]*\)[^()]*)*\)")


def without_sources(text: str) -> str:
    """A warning or error as the compact plan shows it: its "(source: ...)" parts left out
    (they stay in --why and --json)."""
    return _SOURCES.sub("", text)


def failures_table(host: str, failures: list[Failure]) -> Table:
    table = Table(
        title=f"{escape(host)}: preflight failed, nothing will be changed", title_justify="left"
    )
    # fold: a fix is only useful whole, also when the output goes to a log 80 columns wide.
    table.add_column("check", style="bold", overflow="fold")
    table.add_column("expected", overflow="fold")
    table.add_column("found", style="red", overflow="fold")
    table.add_column("how to fix", overflow="fold")
    for f in failures:
        table.add_row(Text(f.check), Text(f.expected), Text(f.found), Text(f.fix))
    return table


def _option_lines(options: list[str]) -> list[list[str]]:
    """One option with its values a line."""
    lines: list[list[str]] = []
    for word in options:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return lines


def _packed(lines: list[list[str]], width: int = PACK_WIDTH) -> list[str]:
    """Options packed into lines of at most `width` characters, broken only between options
    (an option and its values always stay whole on one line)."""
    packed: list[str] = []
    for option in lines:
        text = shlex.join(option)
        if packed and len(packed[-1]) + 1 + len(text) <= width:
            packed[-1] += " " + text
        else:
            packed.append(text)
    return packed


def _common_options(argv: list[str], keep_port: bool = False) -> str:
    """A rank's options without its port, broken between options only: the part every rank
    shares, readable however narrow the terminal."""
    options = argv[3:]
    if keep_port:
        return "\n".join("  " + line for line in _packed(_option_lines(options)))
    if "--port" in options:
        at = options.index("--port")
        options = options[:at] + options[at + 2 :]
    lines = [*_option_lines(options), ["--port", "PORT"]]
    return "\n".join("  " + line for line in _packed(lines))


def router_text(router: RouterPlan, settings: Router | None) -> Text:
    """The router this host runs: where it listens, its workers, its command line."""
    text = Text()
    where = f" on {settings.bind}:{settings.port}, policy {settings.policy}" if settings else ""
    text.append(
        f"router: {router.package} {router.version}{where}, {len(router.workers)} worker(s); "
        f"health {router.health_url}\n",
        style="bold",
    )
    text.append(f"  {shlex.join(router.argv[:3])}\n")
    text.append(_common_options(router.argv, keep_port=True) + "\n")
    return text


def _span(numbers: list[int]) -> str:
    """0-7 for consecutive numbers, else 0, 2, 5."""
    if len(numbers) > 1 and numbers == list(range(numbers[0], numbers[0] + len(numbers))):
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(map(str, numbers))


def _values(decisions: list[Decision], what: str) -> list[str]:
    return [d.value for d in decisions if d.what == what]


def _cache_row(decisions: list[Decision]) -> list[tuple[str, str]]:
    """The engine's compile caches as one row: the directory they share, the variables that
    point there, and the others (TRITON_CACHE_AUTOTUNING=1) as they are."""
    values = _values(decisions, "compile cache")
    paths = [v.split("=", 1) for v in values if "=/" in v]
    if not paths:
        return [("caches", v) for v in values]
    home = os.path.commonpath([path for _, path in paths])
    # One line: the directory and how many variables point there (each by name: --why).
    others = [v.split("=", 1)[0] for v in values if "=/" not in v]
    return [("caches", f"{home}, {len(paths) + len(others)} variables")]


def summary_rows(report: HostReport) -> list[tuple[str, str]]:
    """(label, value) of the compact plan, in reading order; plain strings (never markup)."""
    s = report.settings
    plan = report.plan
    decisions = plan.decisions
    rows: list[tuple[str, str]] = []
    lane = ", ".join(_values(decisions, "CUDA lane")) or s.cuda_lane
    python = _values(decisions, "engine python")
    release = f"sglang {s.sglang_version}, lane {lane}"
    if python:
        release += f", Python {python[0].split(' ', 1)[0]}"
    for backend in _values(decisions, "attention backend"):
        release += f", backend {backend}"
    rows.append(("release", release))
    if report.gpu is not None and report.gpu.ok:
        names = sorted({g.name for g in report.gpu.gpus})
        rows.append(
            (
                "GPUs",
                f"{len(report.gpu.gpus)} x {', '.join(names)}, driver {report.gpu.driver_version}",
            )
        )
    if plan.engine is not None:
        pins = [*_values(decisions, "engine pin")]
        rows.append(("engine", ", ".join(p for p in pins if not p.startswith("sglang="))))
        for override in _values(decisions, "engine override"):
            rows.append(("", f"override {override}"))
        for exclude in _values(decisions, "engine exclude"):
            rows.append(("", f"exclude {exclude}"))
        tools = plan.engine.toolkit
        for compiler in _values(decisions, "engine compiler"):
            rows.append(("compiler", compiler))
            if tools is not None:  # the archives' names and URLs: --why and --json
                rows.append(("", f"from {redact(tools.url)}"))
    model = s.model_name
    if report.model is not None and report.model.architecture:
        model += f", config.json: {report.model.architecture}"
    rows.append(("model", model))
    mode = report.staging.plan.mode if report.staging is not None else None
    for d in decisions:
        if d.what == "model staging":
            # The mode by the word the model step's operation and log line use ("beside").
            said = (mode or "").replace("inplace", "in place")
            value = d.value if not mode or d.value.startswith(said) else f"{mode}, {d.value}"
            rows.append(("copy", f"{value}: {d.why}"))
    rows += _cache_row(decisions)
    for d in decisions:
        if d.what not in _SHOWN:
            rows.append((_LABELS.get(d.what, d.what), d.value))
    source = report.serve.control_plane_key_source if report.serve is not None else None
    if source is not None:
        how = "made by this run" if source.made else "read"
        rows.append(("router key", f"{source.path} on the controller ({how})"))
    return rows


def rank_rows(report: HostReport) -> list[tuple[str, str]]:
    """The ranks in one line when they are regular (rank i on GPU i, port base + i)."""
    ranks = report.plan.ranks
    if not ranks:
        return []
    gpus = [r.env.get("CUDA_VISIBLE_DEVICES", "") for r in ranks]
    numbers = [r.rank for r in ranks]
    ports = [r.port for r in ranks]
    regular = gpus == [str(n) for n in numbers] and ports == list(
        range(ports[0], ports[0] + len(ports))
    )
    if regular:
        units = ranks[0].unit_name.replace(f"@{numbers[0]}.", f"@{{{_span(numbers)}}}.")
        return [
            (
                "ranks",
                f"{len(ranks)}, rank N on GPU N ({_span(numbers)}), ports {_span(ports)}, {units}",
            )
        ]
    return [
        ("ranks" if i == 0 else "", f"{r.rank}: GPU {g}, port {r.port}, {r.unit_name}")
        for i, (r, g) in enumerate(zip(ranks, gpus, strict=True))
    ]


def _grid(rows: list[tuple[str, str]]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    # fold, never cut: a value or a URL is only useful whole (80-column logs too).
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(Text(label), Text(value))
    return grid


def why_lines(report: HostReport, width: int) -> list[Text]:
    """Every decision with its reason and sources (--why), then the compiler's archives with
    the URL each is fetched from: printed below the host's box, wrapped at spaces only, so no URL
    is ever broken across lines or a border (a URL longer than the terminal runs on and the
    terminal wraps it: it stays one line to click or copy)."""
    lines: list[Text] = []
    router_warnings = report.router.warnings if report.router is not None else []
    said = [f"error: {e}" for e in report.errors[len(report.failures) :]]
    said += [f"warning: {w}" for w in [*report.plan.warnings, *router_warnings]]
    said = [s for s in said if s != without_sources(s)]
    if said:
        lines.append(Text("sources of the errors and warnings", style="bold underline"))
        for s in said:
            lines += [Text(line) for line in unbroken(s, width, "")]
        lines.append(Text(""))
    lines.append(Text("decisions", style="bold underline"))
    for d in report.plan.decisions:
        # "what: value", wrapped at spaces only as the reasons are (a long path stays whole).
        lines += [Text(line, style="bold") for line in unbroken(f"{d.what}: {d.value}", width, "")]
        lines += [Text(line) for line in unbroken(d.why, width, "    ")]
    spec = report.plan.engine
    tools = spec.toolkit if spec is not None else None
    if tools is not None:
        lines += [Text(""), Text("compiler archives", style="bold underline")]
        for a in tools.archives:
            lines.append(Text(a.file_name, style="bold"))
            lines.append(Text("    " + redact(f"{tools.url}/{a.path}")))
    return lines


def host_panel(name: str, report: HostReport, why: bool = False, changes: bool = True) -> Panel:
    """One host's plan. `changes`: the row of what this run does to the ranks (the deploy
    leaves it out: the serve step says it in its own line, beside pyinfra's table)."""
    s = report.settings
    parts: list[RenderableType] = []
    # Sources stay out of the box: under --why they follow it, where no URL is broken.
    shown = without_sources
    # Errors and warnings first: what a user must read before anything else.
    if report.failures:
        parts.append(failures_table(name, report.failures))
    # Every reason to refuse but preflight's, which the table above shows (errors lists
    # preflight first): the resolver's, the router's, the staging decision's.
    for error in report.errors[len(report.failures) :]:
        parts.append(Text(f"error: {shown(error)}", style="red"))
    router_warnings = report.router.warnings if report.router is not None else []
    for warning in [*report.plan.warnings, *router_warnings]:
        parts.append(Text(f"warning: {shown(warning)}", style="yellow"))
    rows = summary_rows(report)
    rows += rank_rows(report)
    if report.serve is not None and changes and report.ok:
        rows.append(("changes", report.serve.summary()))
    parts.append(_grid(rows))
    if report.plan.ranks:
        first = report.plan.ranks[0]
        parts.append(Text(f"every rank runs: {shlex.join(first.argv[:3])}", style="bold"))
        parts.append(Text(_common_options(first.argv)))
    if report.router is not None and not report.router.errors:
        parts.append(router_text(report.router, s.router))
    style = "green" if report.ok else "red"
    status = "ready" if report.ok else "refused"
    return Panel(
        Group(*parts),
        title=f"{escape(name)}: {status}",
        subtitle="reasons and sources: below" if why else "reasons and sources: plan --why",
        border_style=style,
        expand=False,
    )


def print_reports(
    reports: Mapping[str, HostReport | str], console: Console | None = None, why: bool = False
) -> None:
    """Every host's panel; on stdout unless `console` says otherwise (the deploy's go to
    stderr, beside pyinfra's log)."""
    console = console or Console()
    for name, report in reports.items():
        if isinstance(report, str):
            console.print(Panel(Text(report, style="red"), title=f"{escape(name)}: unreachable"))
        else:
            console.print(host_panel(name, report, why=why))
            if why and report.plan.decisions:
                for line in why_lines(report, console.width):
                    console.print(line, soft_wrap=True, highlight=False)
