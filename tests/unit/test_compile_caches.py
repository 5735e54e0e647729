"""Compile caches per engine, kept (issue 38): each rank's environment points every compiler and
tuner into its engine's own directory (layout.EngineTree.compile_cache), decided from the
knowledge base with its source; the rank's sandbox may write there; the engine step makes it
the service user's and prunes it with its environment."""

from __future__ import annotations

from typing import Any

import pytest

from operations import kb, layout
from operations.facts.engine import parse_engine_state
from operations.plan.engine_plan import EngineFacts, caches_to_prune
from operations.plan.resolver import resolve
from operations.plan.resolver.caches import cache_environment
from operations.render import units
from tests.unit.builders import facts, make_settings
from tests.unit.test_engine_plan import name_of, plan, state

KB = kb.load()
REDIRECTED = {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"}


def rank_env(release: str, **settings: Any) -> tuple[str, dict[str, str], list[str]]:
    p = resolve(make_settings(sglang_version=release, **settings), facts("rtx-pro-6000-x8"))
    assert p.errors == [], p.errors
    tree = layout.EngineTree(make_settings().engine_root)
    cache = tree.compile_cache(tree.name_of(layout.env_of_python(p.ranks[0].argv[0]) or "") or "")
    shown = [f"{d.value} {d.why}" for d in p.decisions if d.what == "compile cache"]
    return cache, p.ranks[0].env, shown


@pytest.mark.parametrize("release", ["0.5.11", "0.5.17", "0.5.19"])
def test_every_cache_is_under_the_engines_own_directory(release: str) -> None:
    cache, env, shown = rank_env(release)
    assert cache.startswith("/opt/sglang/caches/") and release in cache
    assert env["FLASHINFER_WORKSPACE_BASE"] == cache
    assert env["TRITON_CACHE_DIR"] == f"{cache}/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{cache}/inductor"
    assert env["CUDA_CACHE_PATH"] == f"{cache}/nv"
    assert env["TRITON_CACHE_AUTOTUNING"] == "1"  # every release's Triton reads it (>= 3.4)
    # Each shown in `plan --why` with its source.
    names = {line.split("=", 1)[0] for line in shown}
    assert (
        names
        == {"SGLANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_AUTOTUNING"} | REDIRECTED
    )
    assert all("source: " in line for line in shown), shown


def test_the_release_decides_sglangs_own_cache_and_tilelangs() -> None:
    _, old, _ = rank_env("0.5.10")
    assert "SGLANG_CACHE_DIR" not in old  # 0.5.10 has no such variable
    cache, mid, shown = rank_env("0.5.19")
    assert mid["SGLANG_CACHE_DIR"] == cache
    assert "TILELANG_CACHE_DIR" not in mid
    # 0.5.18+ redirects under SGLANG_CACHE_DIR: the source is the release's own environ.py.
    assert any("sglang 0.5.19 wheel, sglang/srt/environ.py" in line for line in shown), shown
    # 0.5.21+ redirects TileLang's too (a cu130-only release: asked of the knowledge base).
    new = {v.variable: v.value for v in cache_environment(KB, "0.5.23", "/c")}
    assert new["TILELANG_CACHE_DIR"] == "/c/tilelang" and new["SGLANG_CACHE_DIR"] == "/c"
    assert cache_environment(KB, "0.4.0", "/c") == []  # a release the kb does not know


def test_a_rank_may_write_its_engines_caches_and_nothing_else_of_the_engine() -> None:
    p = resolve(make_settings(), facts("rtx-pro-6000-x8"))
    cache = p.ranks[0].env["FLASHINFER_WORKSPACE_BASE"]
    lines = p.ranks[0].unit.splitlines()
    assert f"ReadWritePaths=-{layout.service_home('sglang')} -{cache}" in lines
    assert not cache.startswith(("/tmp", "/dev/shm"))  # PrivateTmp empties /tmp; tmpfs at boot


def test_the_check_sandbox_takes_the_cache_too() -> None:
    found = dict(units.check_sandbox("sglang", 2, None, "/opt/sglang/caches/e"))
    assert found["ReadWritePaths"].endswith(" -/opt/sglang/caches/e")


def test_the_fact_reads_each_cache_and_its_owner() -> None:
    host = parse_engine_state(["cache=0.5.11-cu128-aa sglang", "cache=old root"])
    assert host.get("caches") == {"0.5.11-cu128-aa": "sglang", "old": "root"}


def test_the_engine_plan_makes_the_cache_once_and_prunes_it_with_its_environment() -> None:
    name = name_of()
    st = state((name, True, 9), ("0.5.1-cu128-00000001", True, 1), current=name)
    _, fresh = plan(EngineFacts(state=st))
    assert not fresh.cache_ready and fresh.to_json()["compile_cache"]["make"]
    st["caches"] = {name: "sglang", "0.5.1-cu128-00000001": "sglang", "gone-env": "sglang"}
    _, kept = plan(EngineFacts(state=st), engine_keep=1)
    assert kept.cache_ready
    assert kept.prune == ("0.5.1-cu128-00000001",)
    assert kept.prune_caches == ("0.5.1-cu128-00000001", "gone-env")
    # Owned by another user (made by hand as root): made the service user's again.
    st["caches"] = {name: "root"}
    _, wrong = plan(EngineFacts(state=st))
    assert not wrong.cache_ready


def test_a_kept_engines_cache_is_never_pruned() -> None:
    st = state(("a", True, 1), ("b", True, 2))
    st["caches"] = {"a": "sglang", "b": "sglang", "c": "sglang"}
    assert caches_to_prune(st, ["a"], "b") == ["a", "c"]
    assert caches_to_prune(st, [], "c") == []


def test_the_compact_plan_says_the_caches_in_one_row() -> None:
    """Each cache variable is a decision of its own (--why gives each its source); the compact
    plan names the directory once and the variables that point under it."""
    from operations.cli.report import _cache_row
    from operations.plan.vocabulary import Decision

    decisions = [
        Decision("compile cache", "SGLANG_CACHE_DIR=/opt/sglang/caches/e", "why"),
        Decision("compile cache", "TRITON_CACHE_DIR=/opt/sglang/caches/e/triton", "why"),
        Decision("compile cache", "TRITON_CACHE_AUTOTUNING=1", "why"),
        Decision("CUDA lane", "cu128", "why"),
    ]
    assert _cache_row(decisions) == [("caches", "/opt/sglang/caches/e, 3 variables")]
