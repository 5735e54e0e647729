"""The levers that set a rank's throughput in the plan (operations/plan/resolver/throughput.py):
each a decision with its trade-off and sources in knowledge/throughput.yaml; an option written
only where a setting asks, so a default inventory's command line is what it was; the 48 running
requests speculative decoding caps a rank at, warned about; graphs that do not cover the
concurrency, warned about; an FP8 checkpoint named by the user, said."""

from __future__ import annotations

from typing import Any

import pytest

from operations.facts.host import Model
from operations.plan.resolver import ResolvedHost, resolve
from tests.unit.builders import QWEN36, facts, make_settings

MTP = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
# Options a default inventory never wrote: these levers keep it so (a changed command line
# restarts every rank on upgrade).
LEVER_OPTIONS = (
    "--max-running-requests",
    "--chunked-prefill-size",
    "--cuda-graph-max-bs",
    "--schedule-conservativeness",
)


def plan(model: Model | None = QWEN36, **settings: Any) -> ResolvedHost:
    return resolve(make_settings(**settings), facts("rtx-pro-6000-x8", model))


def decision(p: ResolvedHost, what: str) -> tuple[str, str]:
    found = [(d.value, d.why) for d in p.decisions if d.what == what]
    assert len(found) == 1, p.decisions
    return found[0]


def option(p: ResolvedHost, name: str) -> str | None:
    argv = p.ranks[0].argv
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_default_inventory_writes_no_lever_option_and_each_lever_says_why() -> None:
    p = plan()
    assert p.errors == []
    assert not [a for a in p.ranks[0].argv if a.startswith(LEVER_OPTIONS)]
    assert option(p, "--mem-fraction-static") == "0.9"
    for what in (
        "max running requests",
        "graph batch size",
        "chunked prefill",
        "schedule conservativeness",
        "memory fraction",
        "speculative decoding",
        "weights",
    ):
        _, why = decision(p, what)
        assert "source: throughput.yaml " in why, (what, why)
    assert decision(p, "max running requests")[0].startswith("the rank's own")
    # The release's own values on a 96 GB card (0.5.11 server_args.py:1359-1368), said.
    assert "on these GPUs (90-160 GiB each): 256" in decision(p, "graph batch size")[1]
    assert "on these GPUs (90-160 GiB each): 8192" in decision(p, "chunked prefill")[1]
    assert "mem_fraction_static (its default), always written" in decision(p, "memory fraction")[1]
    assert not [w for w in p.warnings if "max_running_requests" in w or "cuda_graph" in w]


def test_speculative_decoding_without_max_running_requests_warns_of_the_48_cap() -> None:
    p = plan(speculative=MTP)
    assert p.errors == []
    assert option(p, "--max-running-requests") is None
    assert decision(p, "max running requests")[0] == "48 (speculative decoding's cap; not written)"
    (warning,) = [w for w in p.warnings if "without max_running_requests" in w]
    assert "caps every rank at 48 running requests" in warning
    assert "throughput.yaml sglang-spec-cap-0511" in warning
    assert decision(p, "speculative decoding")[0].startswith("--speculative-algorithm EAGLE")


def test_max_running_requests_is_written_and_lifts_the_cap() -> None:
    p = plan(speculative=MTP, max_running_requests=128)
    assert p.errors == []
    assert option(p, "--max-running-requests") == "128"
    assert decision(p, "max running requests")[0] == "--max-running-requests 128"
    assert not [w for w in p.warnings if "without max_running_requests" in w]


def test_a_concurrency_above_the_largest_graph_is_warned_with_the_fix() -> None:
    over = plan(max_running_requests=512)
    (warning,) = [w for w in over.warnings if w.startswith("cuda_graph_max_bs:")]
    assert "up to 512 requests but captures CUDA graphs only up to 256" in warning
    assert "set cuda_graph_max_bs to 512" in warning
    covered = plan(max_running_requests=512, cuda_graph_max_bs=512)
    assert not [w for w in covered.warnings if w.startswith("cuda_graph_max_bs:")]
    assert option(covered, "--cuda-graph-max-bs") == "512"
    assert "covers the 512 running requests" in decision(covered, "graph batch size")[1]


def test_chunked_prefill_is_written_when_set() -> None:
    p = plan(chunked_prefill_size=2048)
    assert option(p, "--chunked-prefill-size") == "2048"
    assert decision(p, "chunked prefill")[0] == "--chunked-prefill-size 2048"


def test_the_scheduler_s_conservativeness_is_written_when_set_and_the_release_s_own_said() -> None:
    p = plan(schedule_conservativeness=0.5)
    assert option(p, "--schedule-conservativeness") == "0.5"
    value, why = decision(p, "schedule conservativeness")
    assert value == "--schedule-conservativeness 0.5"
    assert "sglang-conservativeness-0511" in why and "sglang-hyperparameter-tuning" in why
    unset = decision(plan(), "schedule conservativeness")
    assert unset[0] == "the release's own (no option written)" and "own 1.0" in unset[1]


@pytest.mark.parametrize(
    ("key", "value", "extra"),
    [
        ("max_running_requests", 64, ["--max-running-requests", "32"]),
        ("chunked_prefill_size", 4096, ["--chunked-prefill-size=2048"]),
        ("schedule_conservativeness", 0.5, ["--schedule-conservativeness", "1.3"]),
    ],
)
def test_a_lever_set_both_as_a_setting_and_in_extra_server_args_is_refused(
    key: str, value: int, extra: list[str]
) -> None:
    settings: dict[str, Any] = {key: value, "extra_server_args": extra}
    p = plan(QWEN36, **settings)
    (error,) = [e for e in p.errors if e.startswith(key)]
    assert "both set" in error and "drop it from extra_server_args" in error


def test_a_lever_in_extra_server_args_alone_is_theirs_and_counts_for_the_cap() -> None:
    """An inventory that set it there before keeps working, and the cap is not warned."""
    p = plan(speculative=MTP, extra_server_args=["--max-running-requests", "96"])
    assert p.errors == []
    assert p.ranks[0].argv.count("--max-running-requests") == 1
    assert decision(p, "max running requests")[0] == "extra_server_args"
    assert not [w for w in p.warnings if "without max_running_requests" in w]
    assert "covers the 96 running requests" in decision(p, "graph batch size")[1]


def test_an_fp8_checkpoint_the_user_names_is_said_with_its_trade_off() -> None:
    fp8 = Model(
        exists=True,
        architecture=QWEN36.architecture,
        quantization="fp8",
        size_bytes=29_000_000_000,
    )
    p = plan(fp8, model_name="Qwen/Qwen3.6-27B-FP8", model_source="/srv/models/qwen36-fp8")
    assert p.errors == [], p.errors
    value, why = decision(p, "weights")
    assert value == "fp8 (from the checkpoint; no option written)"
    assert "model_source's config.json" in why and "sglang-issue-28552" in why
    assert not [a for a in p.ranks[0].argv if a.startswith("--quantization")]
    # The bf16 model's decision names the FP8 checkpoint of the same architecture.
    assert "Qwen/Qwen3.6-27B-FP8" in decision(plan(), "weights")[1]


def test_another_quantization_is_said_as_the_checkpoint_has_it() -> None:
    awq = Model(exists=True, architecture=QWEN36.architecture, quantization="awq")
    p = plan(awq, model_name="someone/Qwen3.6-27B-AWQ")
    value, why = decision(p, "weights")
    assert value == "awq (from the checkpoint; no option written)"
    assert "throughput.yaml sglang-quant-from-config" in why
