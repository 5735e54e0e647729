"""The knowledge base: its data passes its own schema, every rule names an existing source, and
broken data is caught at load time rather than producing a wrong plan."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from operations import kb
from operations.kb import KNOWLEDGE_DIR, KnowledgeError


def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KNOWLEDGE_DIR / "sglang.yaml").read_text())
    return data


def test_loads_and_every_release_has_its_cli_table() -> None:
    knowledge = kb.load()
    assert knowledge.supported_releases() == ["0.5.9", "0.5.11", "0.5.19", "0.5.23"]
    for release in knowledge.releases:
        table = knowledge.cli_table("sglang", release)
        assert table is not None and table.version == release
        assert "--model-path" in table.options and "--config" in table.options


@pytest.mark.parametrize(
    ("release", "lanes"),
    [
        ("0.5.9", ["cu128"]),
        ("0.5.11", ["cu128", "cu130"]),
        ("0.5.19", ["cu128", "cu129", "cu130"]),
        ("0.5.23", ["cu130"]),
    ],
)
def test_lanes_by_release(release: str, lanes: list[str]) -> None:
    assert kb.load().lanes_for_release(release) == lanes


def test_renamed_flags_match_each_release_parser() -> None:
    """The knowledge base's spelling must be one the release's real parser has."""
    knowledge = kb.load()
    for setting in knowledge.flags:
        for release in knowledge.releases:
            rule = knowledge.flag(setting, release)
            assert rule is not None
            table = knowledge.cli_table("sglang", release)
            assert table is not None and rule["option"] in table.options, (setting, release)


def test_backends_named_by_rules_exist_in_the_parsers() -> None:
    knowledge = kb.load()
    for release in knowledge.releases:
        table = knowledge.cli_table("sglang", release)
        assert table is not None
        option = table.get("--attention-backend")
        assert option is not None and option.choices is not None
        rule = knowledge.hybrid_backends(release)
        assert rule is not None
        for backend in rule["backends"]:
            assert backend in option.choices, (release, backend)


def test_every_source_is_cited_by_something() -> None:
    text = (KNOWLEDGE_DIR / "sglang.yaml").read_text()
    for source in kb.load().sources:
        assert text.count(source) >= 2, f"source {source} is never cited"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["lanes"]["cu128"].update(source="nowhere"), "unknown source 'nowhere'"),
        (lambda d: d["auto_attention_backend"][0]["prefer"].append("fa9"), "unknown backend 'fa9'"),
        (
            lambda d: d["releases"].update({"0.5.99": copy.deepcopy(d["releases"]["0.5.11"])}),
            "no CLI table",
        ),
        (
            lambda d: d["models"]["Qwen/Qwen3.6-27B"].update(architecture="Nope"),
            "unknown architecture",
        ),
        (lambda d: d["lanes"]["cu128"].pop("min_driver"), "'min_driver' is a required property"),
        (lambda d: d["gpus"].update({"twelve": d["gpus"]["12.0"]}), "does not match"),
        (lambda d: d["attention_backends"]["fa3"].pop("reason"), "'reason' is a dependency"),
    ],
)
def test_broken_knowledge_is_caught(mutate: Any, message: str) -> None:
    data = raw()
    mutate(data)
    with pytest.raises(KnowledgeError, match=message):
        kb.build(data)
