"""The engine step's pure decisions: the resolved set and its name, lane -> indexes, the
configuration files, the wheelhouse check, the probe's parser and judge, what to prune."""

from __future__ import annotations

import json
import tomllib

import pytest

from operations import kb as kbmod
from operations.engine import (
    EngineSpec,
    Indexes,
    Probe,
    engine_spec,
    envs_to_prune,
    evaluate,
    lane_indexes,
    missing_wheels,
    parse_probe,
    pip_config,
    redact,
    uv_config,
)
from operations.facts.engine import EngineHost
from tests.unit.builders import make_settings

KB = kbmod.load()


def spec(**overrides: object) -> EngineSpec:
    return engine_spec(make_settings(**overrides), KB)


# -- the resolved set and its name ----------------------------------------------------------


def test_cu128_pins_torch_and_kernel_to_the_lane_build_and_sglang_to_the_release() -> None:
    s = spec(sglang_version="0.5.11", cuda_lane="cu128")

    assert s.requirements == (
        "sglang==0.5.11",
        "torch==2.11.0+cu128",
        "sglang-kernel==0.4.2+cu128",
        "flashinfer-python==0.6.8.post1",
    )
    assert (s.torch, s.cuda, s.python, s.arch) == ("2.11.0+cu128", "12.8", ">=3.10,<3.14", "sm_120")


def test_the_kernel_package_name_follows_the_release() -> None:
    assert spec(sglang_version="0.5.9").requirements[2] == "sgl-kernel==0.3.21+cu128"


def test_env_name_is_release_lane_and_a_stable_short_hash() -> None:
    a, b = spec(), spec()

    assert a.name == b.name
    release, lane, digest = a.name.split("-")
    assert (release, lane) == ("0.5.11", "cu128")
    assert len(digest) == 8 and int(digest, 16) >= 0


def test_env_name_changes_with_the_set_but_not_with_where_wheels_come_from() -> None:
    base = spec()

    assert spec(sglang_version="0.5.19").name != base.name
    assert spec(cuda_lane="cu129").name != base.name
    assert spec(package_index_url="https://mirror.example/simple").name == base.name
    assert spec(wheelhouse="/srv/wheels").name == base.name


def test_spec_round_trips_through_json() -> None:
    s = spec()
    assert EngineSpec.from_json(json.loads(json.dumps(s.to_json()))) == s


# -- lanes, indexes and configuration files -------------------------------------------------


def test_lane_indexes_fill_in_the_lane_and_default_to_the_documented_urls() -> None:
    idx = lane_indexes(make_settings(), "cu128")

    assert idx == Indexes(
        main="https://pypi.org/simple",
        torch="https://download.pytorch.org/whl/cu128",
        kernel="https://docs.sglang.io/whl/cu128",
    )


def test_redact_hides_credentials_only() -> None:
    assert redact("https://user:tok@mirror.example/simple") == "https://***@mirror.example/simple"
    assert redact("https://pypi.org/simple") == "https://pypi.org/simple"


def test_uv_config_lists_torch_then_kernel_then_main_as_default() -> None:
    idx = Indexes(main="http://m/simple", torch="http://t/cu128", kernel="http://k/cu128")

    config = tomllib.loads(uv_config(idx, None))

    assert [(i["name"], i["url"], i.get("default", False)) for i in config["index"]] == [
        ("torch", "http://t/cu128", False),
        ("kernel", "http://k/cu128", False),
        ("main", "http://m/simple", True),
    ]


def test_offline_configs_use_no_index_and_the_wheelhouse() -> None:
    assert tomllib.loads(uv_config(None, "/opt/sglang/wheelhouse")) == {
        "no-index": True,
        "find-links": ["/opt/sglang/wheelhouse"],
    }
    assert "no-index = true" in pip_config(None, "/opt/sglang/wheelhouse")
    idx = Indexes(main="http://m/simple", torch="t", kernel="k")
    assert pip_config(idx, None) == "[global]\nindex-url = http://m/simple\n"


def test_missing_wheels_matches_names_and_exact_versions() -> None:
    have = [
        "sglang-0.5.11-py3-none-any.whl",
        "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "sglang_kernel-0.4.2+cu128-cp310-abi3-manylinux2014_x86_64.whl",
        "not-a-wheel.txt",
    ]
    wanted = ("sglang==0.5.11", "torch==2.11.0+cu128", "sglang-kernel==0.4.2+cu128")

    assert missing_wheels(wanted, have) == ["torch==2.11.0+cu128"]


# -- the checks -----------------------------------------------------------------------------


def probe_line(**values: object) -> str:
    data = {
        "sglang": "0.5.11",
        "torch": "2.11.0+cu128",
        "torch_cuda": "12.8",
        "cuda_available": True,
        "arch_list": ["sm_90", "sm_120"],
        "launch_server": "ok",
        **values,
    }
    return "some import chatter\n@@probe " + json.dumps(data) + "\n"


def test_a_good_environment_passes() -> None:
    assert evaluate(parse_probe(probe_line()), spec()) == []


def test_a_cuda13_torch_is_refused_naming_what_was_found() -> None:
    problems = evaluate(parse_probe(probe_line(torch="2.11.0+cu130", torch_cuda="13.0")), spec())

    assert problems == [
        "torch build: expected 2.11.0+cu128 (the cu128 lane), found 2.11.0+cu130",
        "torch.version.cuda: expected 12.8 (the cu128 lane), found 13.0",
    ]


def test_sm120_must_be_compiled_in_when_gpus_are_visible() -> None:
    problems = evaluate(parse_probe(probe_line(arch_list=["sm_80", "sm_90"])), spec())
    assert problems == [
        "torch.cuda.get_arch_list(): expected sm_120 among them, found sm_80, sm_90"
    ]


def test_without_visible_gpus_the_arch_list_is_not_judged() -> None:
    probe = parse_probe(probe_line(cuda_available=False, arch_list=None))
    assert evaluate(probe, spec()) == []


def test_wrong_sglang_and_a_broken_launch_module_are_named() -> None:
    probe = parse_probe(
        probe_line(sglang="0.5.9", launch_server="ModuleNotFoundError('No module named x')")
    )

    assert evaluate(probe, spec()) == [
        "sglang version: expected 0.5.11, found 0.5.9",
        "python -c 'import sglang.launch_server': expected it to import, found "
        "ModuleNotFoundError('No module named x')",
    ]


def test_a_probe_that_printed_nothing_says_so() -> None:
    probe = parse_probe("Traceback (most recent call last):\n  ...\nSyntaxError: bad")
    assert probe == Probe(
        errors=(
            "the probe printed no result: Traceback (most recent call "
            "last): /   ... / SyntaxError: bad",
        )
    )
    assert evaluate(probe, spec())[0].startswith("the probe printed no result")


# -- pruning --------------------------------------------------------------------------------


def host_state(current: str | None, **envs: int | None) -> EngineHost:
    return {
        "current": current,
        "envs": {n: {"complete": t is not None, "activated_at": t} for n, t in envs.items()},
        "uv": "0.13.9",
    }


@pytest.mark.parametrize(
    ("keep", "expected"),
    [(1, ["a", "b", "c", "p"]), (2, ["a", "b", "p"]), (3, ["a", "p"]), (5, ["p"])],
)
def test_prune_keeps_the_most_recently_activated(keep: int, expected: list[str]) -> None:
    state = host_state("new", a=1, b=2, c=3, new=4, p=None)
    assert envs_to_prune(state, "new", keep) == expected


def test_prune_never_removes_the_target_or_what_was_serving() -> None:
    state = host_state("old", old=1, new=None, x=5)
    assert envs_to_prune(state, "new", 1, serving="old") == ["x"]
