"""FlashInfer's prebuilt JIT modules (issue 38): an engine pins flashinfer-jit-cache exactly when
the knowledge base lists the build of the release's FlashInfer for the lane (caches.yaml,
`available`, cited) and the setting flashinfer_jit_cache is on; it comes only from
flashinfer_index_url; offline the wheelhouse must hold it; `plan --why` says whether it is used,
with its sources, or why not."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from operations import kb
from operations.kb.caches import load_caches
from operations.plan.engine_spec import (
    EngineSpec,
    engine_spec,
    indexes,
    missing_wheels,
    project_toml,
)
from operations.plan.jit_cache import jit_cache_choice
from operations.plan.resolver import resolve
from tests.unit.builders import facts, make_settings

KB = kb.load()
CACHES = load_caches(KB)
BUILDS = [
    pytest.param(release, build.lane.name, id=f"{release}-{build.lane.name}")
    for release, entry in sorted(KB.releases.items(), key=lambda item: kb.version(item[0]))
    for build in entry.builds
]


def spec(**settings: Any) -> EngineSpec:
    return engine_spec(make_settings(**settings), KB, "3.11")


@pytest.mark.parametrize(("release", "lane"), BUILDS)
def test_the_pin_is_there_exactly_when_the_build_is_listed_and_the_setting_is_on(
    release: str, lane: str
) -> None:
    fi = KB.releases[release].pin("flashinfer-python")
    assert fi is not None
    status = CACHES.flashinfer[fi].jit_cache[lane]
    on = spec(sglang_version=release, cuda_lane=lane)
    off = spec(sglang_version=release, cuda_lane=lane, flashinfer_jit_cache=False)
    pin = on.pin("flashinfer-jit-cache")
    if status == "available":
        assert pin is not None
        # FlashInfer's own version with the lane as local tag: what flashinfer's import check
        # accepts (the jit-cache's version must start with flashinfer's).
        assert (pin.version, pin.index, pin.index_lane) == (f"{fi}+{lane}", "flashinfer", lane)
        assert pin.version.startswith(fi)
        assert on.name != off.name  # another set, another engine
    else:
        assert pin is None and on.name == off.name
    assert off.pin("flashinfer-jit-cache") is None


def test_what_the_knowledge_base_says_decides_it() -> None:
    assert spec().pin("flashinfer-jit-cache") is not None  # 0.5.11 cu128: 0.6.8.post1, listed
    # 0.5.19 on cu128: FlashInfer 0.6.18's cu128 build is unverified; on cu129 it is listed.
    assert spec(sglang_version="0.5.19").pin("flashinfer-jit-cache") is None
    cu129 = spec(sglang_version="0.5.19", cuda_lane="cu129").pin("flashinfer-jit-cache")
    assert cu129 is not None and cu129.version == "0.6.18+cu129"
    # 0.5.23 (FlashInfer 0.7.2: split into per-architecture wheels) is unverified on cu130.
    assert spec(sglang_version="0.5.23", cuda_lane="cu130").pin("flashinfer-jit-cache") is None


def test_it_comes_only_from_flashinfer_index_url_filled_with_the_lane() -> None:
    settings = make_settings(flashinfer_index_url="https://mirror.example/fi/{lane}/")
    s = engine_spec(settings, KB, "3.11")
    found = {i.name: i.url for i in indexes(settings, s)}
    assert found["flashinfer-cu128"] == "https://mirror.example/fi/cu128/"
    data = tomllib.loads(project_toml(settings, s, None))
    named = {i["name"]: i for i in data["tool"]["uv"]["index"]}
    assert named["flashinfer-cu128"]["explicit"] is True
    assert data["tool"]["uv"]["sources"]["flashinfer-jit-cache"] == {"index": "flashinfer-cu128"}
    assert "flashinfer-jit-cache==0.6.8.post1+cu128" in data["project"]["dependencies"]
    # Where it comes from never names the engine: a mirror is the same engine.
    assert s.name == spec().name


def test_turned_off_no_pin_no_index() -> None:
    settings = make_settings(flashinfer_jit_cache=False)
    s = engine_spec(settings, KB, "3.11")
    assert all("flashinfer-jit-cache" not in r for r in s.requirements)
    assert "flashinfer-cu128" not in {i.name for i in indexes(settings, s)}
    assert "flashinfer" not in project_toml(settings, s, None).split("[[tool.uv.index]]", 1)[-1]


def test_offline_the_wheelhouse_must_hold_it() -> None:
    s = spec()
    data = tomllib.loads(project_toml(make_settings(), s, "/opt/sglang/wheelhouse"))
    assert "flashinfer-jit-cache===0.6.8.post1+cu128" in data["project"]["dependencies"]
    wheel = "flashinfer_jit_cache-0.6.8.post1+cu128-cp39-abi3-manylinux_2_28_x86_64.whl"
    others = [
        "sglang-0.5.11-py3-none-any.whl",
        "torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torchvision-0.26.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torchaudio-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",
        "sglang_kernel-0.4.2+cu129-cp310-abi3-manylinux2014_x86_64.whl",
    ]
    assert missing_wheels(s.requirements, others) == ["flashinfer-jit-cache==0.6.8.post1+cu128"]
    assert missing_wheels(s.requirements, [*others, wheel]) == []
    # Another lane's build is not this one.
    cu130 = wheel.replace("+cu128", "+cu130")
    assert missing_wheels(s.requirements, [*others, cu130]) == [
        "flashinfer-jit-cache==0.6.8.post1+cu128"
    ]


def why(**settings: Any) -> tuple[str, str]:
    plan = resolve(make_settings(**settings), facts("rtx-pro-6000-x8"))
    assert plan.errors == [], plan.errors
    (shown,) = [d for d in plan.decisions if d.what == "prebuilt kernels"]
    return shown.value, shown.why


def test_plan_why_says_it_is_used_with_its_sources() -> None:
    value, reason = why()
    assert value == "flashinfer-jit-cache==0.6.8.post1+cu128"
    assert "published on FlashInfer's index (a 1.3 GB wheel, downloaded once)" in reason
    assert "instead of compiling them on their first start" in reason
    # The lane's index page as read, what the wheel is, how flashinfer loads it, its size.
    assert "flashinfer-ai/whl/blob/0d4607bec2167913df112b73d3fdc3f65f9ba086/cu128/" in reason
    assert "/cu130/" not in reason  # only this lane's page
    assert "flashinfer-jit-cache/pyproject.toml" in reason
    assert "flashinfer/jit/core.py" in reason
    assert "sourceforge.net/projects/flashinfer.mirror" in reason


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"flashinfer_jit_cache": False}, "is published, but flashinfer_jit_cache is false"),
        ({"sglang_version": "0.5.19"}, "is unverified (no index page read lists it)"),
    ],
)
def test_plan_why_says_why_not(settings: dict[str, Any], said: str) -> None:
    value, reason = why(**settings)
    assert value == "none"
    assert said in reason and "compiles FlashInfer's modules" in reason, reason
    assert "source: " in reason


def test_a_build_that_is_not_published_says_so() -> None:
    choice = jit_cache_choice(make_settings(), KB, "0.5.23", "cu128")
    assert (choice.status, choice.used) == ("absent", False)
    assert "is not published" in choice.why
    assert any("pull/4469" in url for url in choice.sources), choice.sources


def test_an_existing_engine_is_another_engine_with_it_and_the_same_one_without() -> None:
    """The pin is in the engine's name (its digest covers the requirements): a host serving
    0.5.11 from before the pin gets a new engine, installed beside the serving one; turned off,
    the name is the one engines had before (0.5.11 on cu128 for Python 3.11, docs of main)."""
    assert spec(flashinfer_jit_cache=False).name == "0.5.11-cu128-cp311-7267b59f"
    assert spec().name == "0.5.11-cu128-cp311-d04a952f"
