"""How busy a rank is (operations/programs/rank_metrics.py): the one reading of a rank's /metrics
page that the status's probe (serving_probe.py) and the roll's drain (router_workers.py) share,
checked on prometheus_client's text as SGLang serves it and on every name SGLang 0.5.11 exports
(tests/fixtures/sglang-metrics/0.5.11.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from operations.programs.rank_metrics import request_gauges, requests_in_flight, series, total

EXPORTED = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-metrics" / "0.5.11.txt"

# As prometheus_client writes SGLang's gauges: HELP and TYPE lines, a series per label set.
PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",priority="0"} 3.0
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",priority="1"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3.6-27B",priority="0"} 5.0
sglang:num_requests_total{model_name="Qwen/Qwen3.6-27B"} 42.0
"""


def exported_names() -> list[str]:
    lines = EXPORTED.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_each_gauge_is_the_sum_of_its_series() -> None:
    assert request_gauges(PAGE) == (4.0, 5.0)
    assert requests_in_flight(PAGE) == 9.0


# With priority scheduling SGLang writes the total under priority="" beside one series per
# priority (0.5.11 wheel, srt/observability/metrics_collector.py:891-903).
PRIORITY_PAGE = """\
sglang:num_running_reqs{engine_type="unified",model_name="m",priority=""} 7.0
sglang:num_running_reqs{engine_type="unified",model_name="m",priority="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="m",priority="1"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",priority=""} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",priority="1"} 2.0
"""


def test_with_priority_series_only_the_total_counts_once() -> None:
    assert request_gauges(PRIORITY_PAGE) == (7.0, 2.0)
    assert requests_in_flight(PRIORITY_PAGE) == 9.0


def test_series_reads_each_label_with_its_escapes() -> None:
    line = 'smg_worker_cb_outcomes_total{outcome="success",worker="http://h:1/a}\\"b"} 5'
    assert series(line) == [
        ("smg_worker_cb_outcomes_total", {"outcome": "success", "worker": 'http://h:1/a}"b'}, 5.0)
    ]
    assert total(line, "smg_worker_cb_outcomes_total") == 5.0
    assert total(line, "absent") is None


def test_only_the_two_gauges_count_among_every_name_sglang_exports() -> None:
    """Names that share a prefix or a word with the gauges (num_grammar_queue_reqs,
    routing_key_running_req_count, num_prefill_inflight_queue_reqs, ...) are not them."""
    names = exported_names()
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs"} <= set(names)
    page = "".join(f'{name}{{model_name="m"}} {i + 10}.0\n' for i, name in enumerate(names))
    running = names.index("sglang:num_running_reqs") + 10.0
    queued = names.index("sglang:num_queue_reqs") + 10.0
    assert request_gauges(page) == (running, queued)


def test_a_page_without_the_gauges_reads_none() -> None:
    assert request_gauges("# nothing of SGLang's\nprocess_cpu_seconds_total 1.0\n") == (None, None)
    assert requests_in_flight("") is None
    only_running = "sglang:num_running_reqs 0.0\n"
    assert request_gauges(only_running) == (0.0, None)
    assert requests_in_flight(only_running) == 0.0  # drained: 0, not "unknown"


@pytest.mark.parametrize(
    ("line", "read"),
    [
        ('sglang:num_running_reqs{model_name="a b"} 2.0', ("sglang:num_running_reqs", 2.0)),
        # A label value may hold `}`, spaces and escaped quotes (the text format allows them).
        ('x{l="} 9",m="say \\"hi\\""} 2', ("x", 2.0)),
        ("x 2.5 1767225600000", ("x", 2.5)),  # with a timestamp
        ("x\t3", ("x", 3.0)),
        ("x{} 1", ("x", 1.0)),
        ("x NaN", ("x", pytest.approx(float("nan"), nan_ok=True))),
        ("# TYPE x gauge", None),
        ("", None),
        ('x{l="open} 2', None),  # the label set never closes
        ("x", None),
        ("x two", None),
        ("x 1 2 3", None),
    ],
)
def test_a_sample_line_is_read_by_the_text_format(line: str, read: object) -> None:
    found = [(name, value) for name, _, value in series(line)]
    assert found == ([] if read is None else [read])
