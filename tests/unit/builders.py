"""Shared builders for the pure-logic tests: settings from plain dicts, facts from fixtures."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from operations.facts.gpu import NvidiaSmi, parse_nvidia_smi
from operations.facts.host import Model
from operations.plan.resolver import Facts
from operations.settings import Layer, Settings, load
from tests.doubles.ct200 import nvidia_smi_output

BASE = {"model_source": "/mnt/models/Qwen3.6-27B"}
# The router's control-plane key a run would have made beside the engine locks (a test key).
ROUTER_KEY = Path(__file__).parents[1] / "fixtures" / "router-control-plane.key"


def make_settings(**overrides: object) -> Settings:
    """Settings from plain values; a router given no control_plane_key_file reads the test key
    (a run makes one beside the engine locks: tests/unit/test_drain.py tests that)."""
    router = overrides.get("router")
    if isinstance(router, dict) and "control_plane_key_file" not in router:
        overrides["router"] = {**router, "control_plane_key_file": str(ROUTER_KEY)}
    return load("ct200", [Layer("test", {**BASE, **overrides})])


@cache
def gpu_facts(scenario: str) -> NvidiaSmi:
    """Parse what the real fact command prints on a host showing this fixture."""
    return parse_nvidia_smi(nvidia_smi_output(scenario))


QWEN36 = Model(
    exists=True,
    size_bytes=53_800_000_000,
    architecture="Qwen3_5ForConditionalGeneration",
    tokenizer=("tokenizer.json", "tokenizer_config.json"),
)


def facts(scenario: str = "rtx-pro-6000-x8", model: Model | None = QWEN36) -> Facts:
    return Facts(gpu=gpu_facts(scenario), model=model)
