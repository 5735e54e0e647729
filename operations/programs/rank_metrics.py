"""How busy a rank is: its running and queued requests, read from its /metrics page. The one
reading of the page for the status command's probe (serving_probe.py) and the drain of a roll
(router_workers.py out).

The gauges are SGLang's sglang:num_running_reqs and sglang:num_queue_reqs
(SchedulerMetricsCollector, 0.5.11: sglang/srt/observability/metrics_collector.py;
srt/metrics/collector.py before), one series per label set (real SGLang labels each with its
model and priority): each gauge is the sum of its series. The page is Prometheus's text format
(https://prometheus.io/docs/instrumenting/exposition_formats/, "Text format details"): a
sample is `NAME{LABELS} VALUE [TIMESTAMP]`, a label value may hold `}`, spaces and escaped
quotes, and a line starting with `#` is a comment. `series` is the one reader of that format for
every program here (the ranks' pages, the router's).

With priority scheduling a release writes a gauge's total under `priority=""` and one series per
priority class beside it (0.5.11 wheel, srt/observability/metrics_collector.py:891-903,
_log_gauge_queue_count: "Grafana queries should use priority=\"\" for totals"): `total` counts a
series with a non-empty priority label only where no total is written, so nothing is counted
twice.
"""

from __future__ import annotations

RUNNING_GAUGE = "sglang:num_running_reqs"
QUEUED_GAUGE = "sglang:num_queue_reqs"
# The counters the load client reads (TokenizerMetricsCollector, 0.5.11 metrics_collector.py).
GENERATED = "sglang:generation_tokens_total"
REQUESTS = "sglang:num_requests_total"


Series = tuple[str, dict[str, str], float]  # a sample's name, labels and value


def _labels(text: str) -> tuple[dict[str, str], int] | None:
    """The label set at the start of `text` (just past its `{`): the labels and the index
    just past the closing `}`; None when the line ends first. Escapes inside quotes are kept
    as the exposition format writes them, undone for \\, \\" and \\n."""
    labels: dict[str, str] = {}
    index = 0
    while index < len(text):
        while index < len(text) and text[index] in " ,\t":
            index += 1
        if index < len(text) and text[index] == "}":
            return labels, index + 1
        eq = text.find("=", index)
        if eq == -1 or eq + 1 >= len(text) or text[eq + 1] != '"':
            return None
        name = text[index:eq].strip()
        value: list[str] = []
        index = eq + 2
        while index < len(text) and text[index] != '"':
            if text[index] == "\\" and index + 1 < len(text):
                nxt = text[index + 1]
                value.append("\n" if nxt == "n" else nxt)
                index += 2
                continue
            value.append(text[index])
            index += 1
        if index >= len(text):
            return None
        labels[name] = "".join(value)
        index += 1
    return None


def series(text: str) -> list[Series]:
    """Every sample on a Prometheus text page: (name, labels, value); comments, blank lines
    and lines that are not samples left out."""
    found: list[Series] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cut = len(line)
        for mark in ("{", " ", "\t"):
            at = line.find(mark)
            if at != -1:
                cut = min(cut, at)
        name, rest = line[:cut], line[cut:]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            read = _labels(rest[1:])
            if read is None:
                continue
            labels, after = read
            rest = rest[1 + after :]
        words = rest.split()
        if not name or not words or len(words) > 2:
            continue
        try:
            found.append((name, labels, float(words[0])))
        except ValueError:
            continue
    return found


def total(text: str, name: str) -> float | None:
    """`name` summed over its series, a per-priority series left out where the page writes the
    total (the docstring); None when the page has no sample of it."""
    samples = [(labels, value) for n, labels, value in series(text) if n == name]
    if not samples:
        return None
    totals = [v for labels, v in samples if not labels.get("priority")]
    if totals:
        return sum(totals)
    return sum(v for _, v in samples)


def request_gauges(text: str) -> tuple[float | None, float | None]:
    """(running, queued) on a rank's /metrics page (`total` of each gauge); None for a gauge
    the page has no sample of."""
    return total(text, RUNNING_GAUGE), total(text, QUEUED_GAUGE)


def requests_in_flight(text: str) -> float | None:
    """Running plus queued requests on a rank's /metrics page; None when it has neither gauge
    (a rank started without --enable-metrics, or not SGLang's page)."""
    running, queued = request_gauges(text)
    if running is None and queued is None:
        return None
    return (running or 0.0) + (queued or 0.0)
