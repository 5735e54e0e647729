"""The controller's check of an engine lock (operations/plan/engine_lock_check.py), on real uv.lock
texts.

tests/fixtures/locks/0.5.11-cu128-py3.11.lock is the lock `uv lock` made of the production
project of 0.5.11/cu128 for Python 3.11 against the index snapshot (tests/snapshot_index.py),
served on http://127.0.0.1:55361; wheelhouse-uv-only.lock is uv's lock of a project resolved
against a find-links directory (no index), as a host locks offline. Every refusal below is that
real text with one entry changed, as a hostile index or host would change it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from operations import kb as kbmod
from operations.plan.engine_lock_check import LockSources, check_lock, lock_sources
from operations.plan.engine_spec import engine_spec
from tests.unit.builders import make_settings

LOCKS = Path(__file__).resolve().parents[1] / "fixtures" / "locks"
REAL = (LOCKS / "0.5.11-cu128-py3.11.lock").read_text()
OFFLINE = (LOCKS / "wheelhouse-uv-only.lock").read_text()
BASE = "http://127.0.0.1:55361"
UV_WHEEL = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def sources(main: str = f"{BASE}/main/") -> LockSources:
    settings = make_settings(
        sglang_version="0.5.11",
        cuda_lane="cu128",
        package_index_url=main,
        torch_index_url=f"{BASE}/pytorch-{{lane}}/",
        kernel_index_url=f"{BASE}/sglang-{{lane}}/",
        flashinfer_index_url=f"{BASE}/flashinfer-{{lane}}/",
    )
    return lock_sources(settings, engine_spec(settings, kbmod.load(), "3.11"))


def package_block(text: str, name: str) -> str:
    """The text of one [[package]] table of the lock."""
    match = re.search(rf'\[\[package\]\]\nname = "{name}"\n.*?(?=\n\[\[package\]\]|\Z)', text, re.S)
    assert match, name
    return match.group(0)


def with_block(text: str, name: str, edit: str, new: str) -> str:
    block = package_block(text, name)
    assert edit in block, f"{edit!r} not in {name}'s table"
    return text.replace(block, block.replace(edit, new, 1))


def test_the_real_lock_passes() -> None:
    assert check_lock(REAL, sources()) == []


def test_credentials_in_the_settings_are_not_in_the_lock_and_still_match() -> None:
    assert check_lock(REAL, sources("http://user:s3cret@127.0.0.1:55361/main")) == []


def test_a_package_from_another_index_is_refused() -> None:
    lock = with_block(
        REAL, "aiohttp", f'registry = "{BASE}/main/"', 'registry = "https://evil.example/simple"'
    )
    assert check_lock(lock, sources()) == [
        "aiohttp 3.14.5: from https://evil.example/simple, not one of the configured indexes "
        f"({BASE}/main/, {BASE}/pytorch-cu128/, {BASE}/sglang-cu129/, "
        f"{BASE}/flashinfer-cu128/)"
    ]


def test_the_main_package_from_the_torch_index_is_accepted_only_as_configured() -> None:
    # The same host and port, another path: another index.
    lock = with_block(
        REAL, "aiohttp", f'registry = "{BASE}/main/"', f'registry = "{BASE}/main-mirror/"'
    )
    (problem,) = check_lock(lock, sources())
    assert problem.startswith(f"aiohttp 3.14.5: from {BASE}/main-mirror/, not one of")


def test_a_lock_url_with_credentials_is_another_index_and_is_shown_masked() -> None:
    lock = with_block(
        REAL,
        "aiohttp",
        f'registry = "{BASE}/main/"',
        'registry = "http://u:tok@127.0.0.1:55361/main/"',
    )
    (problem,) = check_lock(lock, sources())
    assert problem.startswith("aiohttp 3.14.5: from http://***@127.0.0.1:55361/main/, not one")
    assert "tok" not in problem


def test_a_wheel_without_a_hash_is_refused() -> None:
    block = package_block(REAL, "aiohappyeyeballs")
    digest = re.search(r'(, hash = "sha256:[0-9a-f]{64}")', block.split("wheels = [", 1)[1])
    assert digest
    lock = with_block(REAL, "aiohappyeyeballs", digest.group(1), "")
    assert check_lock(lock, sources()) == [
        "aiohappyeyeballs 2.7.1: wheel aiohappyeyeballs-2.7.1-py3-none-any.whl has no hash"
    ]


def test_a_weak_hash_is_refused() -> None:
    lock = with_block(REAL, "aiohappyeyeballs", 'hash = "sha256:9243', 'hash = "md5:9243')
    (problem,) = check_lock(lock, sources())
    assert "wheel aiohappyeyeballs-2.7.1-py3-none-any.whl has hash 'md5:9243" in problem
    assert problem.endswith("not a sha256")


def test_a_package_with_only_an_sdist_is_refused() -> None:
    block = package_block(REAL, "aiohappyeyeballs")
    wheels = block[block.index("wheels = [") :]
    lock = with_block(REAL, "aiohappyeyeballs", wheels, "")
    assert check_lock(lock, sources()) == [
        "aiohappyeyeballs 2.7.1: an sdist only; the engine never builds from source (no-build)"
    ]


def test_a_git_source_is_refused() -> None:
    lock = with_block(
        REAL,
        "aiohttp",
        f'source = {{ registry = "{BASE}/main/" }}',
        'source = { git = "https://evil.example/aiohttp.git?rev=1#abc" }',
    )
    (problem,) = check_lock(lock, sources())
    assert problem.startswith("aiohttp 3.14.5: from git https://evil.example/aiohttp.git")


def test_a_second_virtual_package_is_refused() -> None:
    lock = with_block(
        REAL,
        "aiohttp",
        f'source = {{ registry = "{BASE}/main/" }}',
        'source = { virtual = "../x" }',
    )
    (problem,) = check_lock(lock, sources())
    assert (
        problem
        == "aiohttp 3.14.5: a virtual source '../x'; only the project sglang-engine may be one"
    )


def test_what_is_not_a_lock_is_refused() -> None:
    assert check_lock("<html>login</html>", sources())[0].startswith("not a uv.lock: ")
    assert check_lock("version = 1\nrevision = 3\n", sources()) == [
        "not a uv.lock: no [[package]] table"
    ]


def test_an_offline_lock_names_the_controllers_wheels_without_hashes() -> None:
    wheelhouse = LockSources(("https://pypi.org/simple",), "/tmp/lk/fl/wh", frozenset([UV_WHEEL]))
    assert check_lock(OFFLINE, wheelhouse) == []
    other = LockSources(("https://pypi.org/simple",), "/tmp/lk/fl/wh", frozenset())
    assert check_lock(OFFLINE, other) == [
        f"uv 0.13.9: wheel {UV_WHEEL} is not in the controller's wheelhouse"
    ]
    # Made offline on a host whose engine_root differs (its wheelhouse at another path): the
    # install reads this host's wheelhouse only, so the wheels' names are what count.
    pypi = ("https://pypi.org/simple",)
    elsewhere = LockSources(pypi, "/opt/b/wheelhouse", frozenset([UV_WHEEL]))
    assert check_lock(OFFLINE, elsewhere) == []
    # Online, the same lock names a directory that is no configured index.
    (problem,) = check_lock(OFFLINE, LockSources(("https://pypi.org/simple",)))
    assert problem.startswith("uv 0.13.9: from /tmp/lk/fl/wh, not one of the configured indexes")


@pytest.mark.parametrize("registries", [[], ["https://pypi.org/simple"]])
def test_sources_round_trip_through_operation_arguments(registries: list[str]) -> None:
    made = LockSources(tuple(registries), "/opt/sglang/wheelhouse", frozenset(["a.whl"]))
    args = made.to_args()
    assert (
        LockSources.from_args(args["registries"], args["wheelhouse"], args["wheelhouse_files"])
        == made
    )
