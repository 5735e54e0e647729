"""The release's start-up levers in the plan: an explicit watchdog timeout on every rank, the
weight-load overlap decided (never enabled for a model SGLang refuses it for), the graph batch
size option only when a setting asks, each shown with its source."""

from __future__ import annotations

from typing import Any

import pytest

from operations import kb as kbmod
from operations.plan.resolver import ResolvedHost, resolve
from tests.unit.builders import facts, make_settings

RELEASES = kbmod.load().supported_releases()


def plan(**settings: Any) -> ResolvedHost:
    return resolve(make_settings(**settings), facts("rtx-pro-6000-x8"))


def decision(p: ResolvedHost, what: str) -> tuple[str, str]:
    found = [(d.value, d.why) for d in p.decisions if d.what == what]
    assert len(found) == 1, p.decisions
    return found[0]


def test_the_watchdog_timeout_is_written_explicitly_with_the_releases_default_and_source() -> None:
    p = plan()
    argv = p.ranks[0].argv
    assert argv[argv.index("--watchdog-timeout") + 1] == "300"
    value, why = decision(p, "watchdog timeout")
    assert value == "--watchdog-timeout 300"
    assert "sglang 0.5.11's default 300 s (sglang/srt/server_args.py:" in why
    assert "caches.yaml sglang-watchdog-default" in why


def test_a_watchdog_timeout_in_extra_server_args_is_theirs_and_not_written_twice() -> None:
    p = plan(extra_server_args=["--watchdog-timeout", "900"])
    assert p.ranks[0].argv.count("--watchdog-timeout") == 1
    assert decision(p, "watchdog timeout")[0] == "extra_server_args"


@pytest.mark.parametrize("release", ["0.5.21", "0.5.23"])
def test_the_hybrid_model_keeps_the_serial_weight_load_with_the_reason(release: str) -> None:
    p = plan(sglang_version=release, cuda_lane="cu130")
    assert not p.ranks or "--startup-weight-load-mode" not in p.ranks[0].argv
    value, why = decision(p, "weight load mode")
    assert value.startswith("serial")
    assert "Qwen3_5ForConditionalGeneration is not one SGLang admits" in why
    assert "hybrid Gated DeltaNet" in why and "caches.yaml sglang-startup-overlap" in why


def test_a_release_without_the_option_says_so() -> None:
    assert "has no --startup-weight-load-mode" in decision(plan(), "weight load mode")[1]


def test_the_graph_batch_size_is_written_only_when_a_setting_asks() -> None:
    unset = plan()
    assert not any(a.startswith("--cuda-graph-max-bs") for a in unset.ranks[0].argv)
    assert decision(unset, "graph batch size")[0] == "the release's own (no option written)"
    asked = plan(sglang_version="0.5.19", cuda_graph_max_bs=64)
    assert decision(asked, "graph batch size")[0] == "--cuda-graph-max-bs-decode 64"


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_accepts_the_levers_it_is_given(release: str) -> None:
    p = resolve(make_settings(sglang_version=release), facts("rtx-pro-6000-x8"))
    assert not [e for e in p.errors if "watchdog" in e or "weight-load" in e]
    assert decision(p, "watchdog timeout")[0] in ("--watchdog-timeout 300", "not written")
