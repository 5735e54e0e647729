"""How busy a rank is: its running and queued requests, read from its /metrics page. The one
reading of the page for the status command's probe (serving_probe.py) and the drain of a roll
(router_workers.py out).

The gauges are SGLang's sglang:num_running_reqs and sglang:num_queue_reqs
(SchedulerMetricsCollector, 0.5.11: sglang/srt/observability/metrics_collector.py;
srt/metrics/collector.py before), one series per label set (real SGLang labels each with its
model and priority): each gauge is the sum of its series. The page is Prometheus's text format
(https://prometheus.io/docs/instrumenting/exposition_formats/, "Text format details"): a
sample is `NAME{LABELS} VALUE [TIMESTAMP]`, a label value may hold `}`, spaces and escaped
quotes, and a line starting with `#` is a comment.
"""

from __future__ import annotations

RUNNING_GAUGE = "sglang:num_running_reqs"
QUEUED_GAUGE = "sglang:num_queue_reqs"


def _after_labels(line: str, start: int) -> int | None:
    """The index just past the `}` that closes the label set opened at `start`; None when the
    line ends first. Quotes are skipped whole, escapes inside them included."""
    quoted = False
    index = start + 1
    while index < len(line):
        char = line[index]
        if quoted and char == "\\":
            index += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return index + 1
        index += 1
    return None


def sample(line: str) -> tuple[str, float] | None:
    """(metric name, value) of one sample line; None for a comment, a blank line or a line
    that is not a sample."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    cut = len(line)
    for mark in ("{", " ", "\t"):
        found = line.find(mark)
        if found != -1:
            cut = min(cut, found)
    name, rest_at = line[:cut], cut
    if line[cut : cut + 1] == "{":
        after = _after_labels(line, cut)
        if after is None:
            return None
        rest_at = after
    words = line[rest_at:].split()
    if not name or not words or len(words) > 2:
        return None
    try:
        return name, float(words[0])
    except ValueError:
        return None


def request_gauges(text: str) -> tuple[float | None, float | None]:
    """(running, queued) on a rank's /metrics page: each gauge summed over its series; None
    for a gauge the page has no sample of."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        read = sample(line)
        if read is not None and read[0] in (RUNNING_GAUGE, QUEUED_GAUGE):
            found[read[0]] = found.get(read[0], 0.0) + read[1]
    return found.get(RUNNING_GAUGE), found.get(QUEUED_GAUGE)


def requests_in_flight(text: str) -> float | None:
    """Running plus queued requests on a rank's /metrics page; None when it has neither gauge
    (a rank started without --enable-metrics, or not SGLang's page)."""
    running, queued = request_gauges(text)
    if running is None and queued is None:
        return None
    return (running or 0.0) + (queued or 0.0)
