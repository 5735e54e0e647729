"""Shared builders for the pure-logic tests: settings from plain dicts, facts from fixtures."""

from __future__ import annotations

from functools import cache

from operations.facts.gpu import NvidiaSmi, parse_nvidia_smi
from operations.facts.host import Model
from operations.plan.resolver import Facts
from operations.settings import Layer, Settings, load
from tests.doubles.ct200 import nvidia_smi_output

BASE = {"model_source": "/mnt/models/Qwen3.6-27B"}


def make_settings(**overrides: object) -> Settings:
    return load("ct200", [Layer("test", {**BASE, **overrides})])


@cache
def gpu_facts(scenario: str) -> NvidiaSmi:
    """Parse what the real fact command prints on a host showing this fixture."""
    return parse_nvidia_smi(nvidia_smi_output(scenario))


QWEN36 = Model(
    exists=True, size_bytes=53_800_000_000, architecture="Qwen3_5ForConditionalGeneration"
)


def facts(scenario: str = "rtx-pro-6000-x8", model: Model | None = QWEN36) -> Facts:
    return Facts(gpu=gpu_facts(scenario), model=model)
