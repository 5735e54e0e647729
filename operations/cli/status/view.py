"""The terminal view of status: one table per host and the verdict."""

from __future__ import annotations

import os
from typing import Any

from operations.cli.status.rows import HostResult, RankStatus
from operations.redact import redact_text

# -- the terminal view ----------------------------------------------------------------------


def _startup(r: RankStatus) -> str:
    """ "start-up N s" to healthy as the rank's journal tells it, else its last phase."""
    start = r.startup
    if start is None:
        return "-"
    if start.error:
        return start.error
    if start.healthy_s is not None:
        return f"{start.healthy_s:.0f} s"
    return start.last_phase or "-"


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _gpu_memory(r: RankStatus) -> str | None:
    """The rank's GPU memory used/total in GiB ("3.2/96"); None: no GPU seen with a name."""
    if r.gpu is None or r.gpu_name is None:
        return None
    used = (r.gpu_memory_used_mib or 0) / 1024
    total = (r.gpu_memory_total_mib or 0) / 1024
    return f"{used:.1f}/{total:.0f}"


def _gpu_cell(r: RankStatus) -> str:
    memory = _gpu_memory(r)
    if memory is None:
        return "-" if r.gpu is None else f"{r.gpu}"
    return f"{r.gpu} {r.gpu_name}, {memory} GiB"


def _probe_cells(answered: bool | None, latency_s: float | None, tokens: int | None) -> list[str]:
    if answered is None:
        return ["-", "-", "-"]
    said = "[green]yes[/]" if answered else "[red]no[/]"
    latency = "-" if latency_s is None else f"{latency_s * 1000:.0f} ms"
    return [said, latency, "-" if tokens is None else str(tokens)]


# Below this many columns the table is the narrow one (narrow_table): what every rank shares
# said once above it, short columns, every port whole.
WIDE_COLUMNS = 150


def _runs(r: RankStatus) -> str:
    version = f"{r.sglang_version or '?'} {r.lane or ''}".strip() if r.engine else "-"
    model = f"{r.model}@{r.model_revision}" if r.model_revision else f"{r.model} (not staged)"
    return f"sglang {version}, {model}"


def _short_gpu(r: RankStatus) -> str:
    memory = _gpu_memory(r)
    if memory is None:
        return "-" if r.gpu is None else f"{r.gpu}"
    return f"{r.gpu} {memory}G"


# The router's words for a rank it sends requests to (smg's ready, sglang-router 0.3.2's
# healthy) and for one it is taking out on purpose (smg's drain).
_ROUTED = ("ready", "healthy")
_LEAVING = ("draining",)


def _router_cell(r: RankStatus, narrow: bool = False) -> str:
    """The router's view of the rank, styled: ready (green), draining (yellow), anything else
    (red); a stalled veto is said beside it (narrow: instead of it, one word that keeps the
    row one line)."""
    from rich.markup import escape

    if r.router_state is None:
        return "-"
    said = r.router_state
    if r.router_stalled:
        said = r.router_stalled if narrow else f"{said}, stalled: {r.router_stalled}"
    routed = r.router_state in _ROUTED and r.router_stalled is None
    style = "green" if routed else "yellow" if r.router_state in _LEAVING else "red"
    return f"[{style}]{escape(said)}[/]"


def _router_column(result: HostResult) -> bool:
    return any(r.router_state is not None for r in result.ranks)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def narrow_table(result: HostResult) -> Any:
    """The table for a terminal narrower than WIDE_COLUMNS (80 included): what the ranks run
    and their GPU's name once in the title when they share them, else a column of its own;
    the unit's state abbreviated ("running" for active (running)); ports never cut."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    runs = {_runs(r) for r in result.ranks}
    gpus = {r.gpu_name for r in result.ranks if r.gpu_name}
    shared = len(runs) == 1
    title = [escape(next(iter(runs)))] if shared else []
    title += [escape(next(iter(gpus)))] if len(gpus) == 1 else []
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        title="; ".join(title) or None,
        title_justify="left",
    )
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("unit", overflow="fold", min_width=8)
    table.add_column("health", overflow="fold", min_width=7)
    routed = _router_column(result)
    if routed:
        table.add_column("router", overflow="fold", min_width=5)
    if not shared:
        table.add_column("runs", overflow="fold")
    table.add_column("port", justify="right", no_wrap=True, min_width=5)
    table.add_column("GPU GiB", no_wrap=True)
    table.add_column("up", justify="right", no_wrap=True)
    table.add_column("rst", justify="right", no_wrap=True)
    table.add_column("run/q", justify="right", no_wrap=True)
    if result.probed:
        table.add_column("answer", no_wrap=True)
    for r in result.ranks:
        health_style = "green" if r.healthy else ("dim" if not r.expected else "red")
        cells = [
            str(r.rank) if r.expected else f"{r.rank}+",
            "running" if r.state == "active (running)" else escape(r.state),
            f"[{health_style}]{escape(r.health)}[/]",
            *([_router_cell(r, narrow=True)] if routed else []),
            *([] if shared else [escape(_runs(r))]),
            str(r.port),
            _short_gpu(r),
            _duration(r.uptime_s),
            "-" if r.restarts is None else str(r.restarts),
            f"{_count(r.running_reqs)}/{_count(r.queued_reqs)}",
        ]
        if result.probed:
            said, latency, tokens = _probe_cells(r.answered, r.latency_s, r.tokens)
            latency = latency.replace(" ms", "ms")
            counted = f" {tokens}t" if tokens != "-" else ""
            cells.append(said if r.answered is None else f"{said} {latency}{counted}")
        table.add_row(*cells)
    if any(not r.expected for r in result.ranks):
        table.caption = "N+: a unit beyond dp_size (shown, not counted)"
    return table


def host_table(result: HostResult, width: int | None = None) -> Any:
    """The host's table: the wide one (a column per item) at WIDE_COLUMNS or more, or when
    the width is not known; narrow_table below it."""
    from rich.markup import escape
    from rich.table import Table

    if width is not None and width < WIDE_COLUMNS:
        return narrow_table(result)

    table = Table()
    table.add_column("rank", justify="right")
    routed = _router_column(result)
    columns = ("unit", "health", *(("router",) if routed else ()), "sglang", "model")
    for column in columns:
        table.add_column(column)
    table.add_column("port", justify="right")
    table.add_column("GPU")
    table.add_column("uptime", justify="right")
    table.add_column("start-up", justify="right")
    table.add_column("restarts", justify="right")
    table.add_column("running", justify="right")
    table.add_column("queued", justify="right")
    if result.probed:
        table.add_column("answered")
        table.add_column("latency", justify="right")
        table.add_column("tokens", justify="right")
    for r in result.ranks:
        version = f"{r.sglang_version or '?'} {r.lane or ''}".strip() if r.engine else "-"
        model = f"{r.model}@{r.model_revision}" if r.model_revision else f"{r.model} (not staged)"
        health_style = "green" if r.healthy else ("dim" if not r.expected else "red")
        rank = str(r.rank) if r.expected else f"{r.rank} (extra)"
        cells = [
            rank,
            escape(r.state),
            f"[{health_style}]{escape(r.health)}[/]",
            *([_router_cell(r)] if routed else []),
            escape(version),
            escape(model),
            str(r.port),
            escape(_gpu_cell(r)),
            _duration(r.uptime_s),
            escape(_startup(r)),
            "-" if r.restarts is None else str(r.restarts),
            "-" if r.running_reqs is None else str(r.running_reqs),
            "-" if r.queued_reqs is None else str(r.queued_reqs),
        ]
        if result.probed:
            cells += _probe_cells(r.answered, r.latency_s, r.tokens)
        table.add_row(*cells)
    return table


def print_results(results: list[HostResult], console: Any = None) -> None:
    from rich.console import Console
    from rich.text import Text

    if console is None:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            # cron mail and log files: wide enough that rows do not wrap; a width the user
            # gave (COLUMNS) is kept, as on a terminal.
            console = Console(width=260)
    for result in results:
        if not result.reachable or result.error is not None:
            console.print(Text(redact_text(result.summary()), style="bold red"))
            continue
        console.print(Text(result.name, style="bold"))
        console.print(host_table(result, console.width))
        style = "bold green" if result.healthy else "bold red"
        console.print(Text(result.summary(), style=style))
        console.print(Text(f"  {result.deployed_by()}"))
        for line in result.throughput.lines() if result.throughput is not None else []:
            console.print(Text(line))
        for line in result.canary.lines() if result.canary is not None else []:
            console.print(Text(line))
        for line in result.tune.lines() if result.tune is not None else []:
            console.print(Text(line))
        if result.router is not None:
            router = result.router
            answered = ""
            if result.probed:
                latency = "-" if router.latency_s is None else f"{router.latency_s * 1000:.0f} ms"
                answered = (
                    f", answered ({latency}, {router.tokens} tokens)"
                    if router.answered
                    else f", did NOT answer: {router.answer}"
                )
            console.print(
                Text(
                    f"  router {router.url}: {router.state}, {router.health}, "
                    f"up {_duration(router.uptime_s)}, restarts {router.restarts}{answered}"
                    + (
                        f"; its worker list {router.workers}"
                        if router.workers not in (None, "ok")
                        else ""
                    ),
                    style="green" if router.healthy else "red",
                )
            )
    healthy = all(r.healthy for r in results) and bool(results)
    bad = [r.name for r in results if not r.healthy]
    console.print(
        Text("all healthy", style="bold green")
        if healthy
        else Text(f"NOT healthy: {', '.join(bad) or 'no hosts'}", style="bold red")
    )
