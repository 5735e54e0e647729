"""knowledge/caches.yaml and each release's cache facts (operations/kb/caches.py): loaded,
checked, and joined with the release's start-up file and CLI table. The expectations are the
values read in the wheels (file:line in caches.yaml's sources and in knowledge/startup/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from operations import kb
from operations.kb import KnowledgeError
from operations.kb.caches import CACHES_FILE, load_caches, release_caches

REDIRECT_0518 = {
    "TRITON_CACHE_DIR": "{base}/triton",
    "TORCHINDUCTOR_CACHE_DIR": "{base}/inductor",
    "CUDA_CACHE_PATH": "{base}/nv",
    "FLASHINFER_WORKSPACE_BASE": "{base}",
}


def test_every_release_has_its_cache_facts() -> None:
    knowledge = kb.load()
    for release in knowledge.releases:
        facts = release_caches(knowledge, release)
        assert facts.flashinfer is not None
        assert facts.triton is not None
        assert facts.watchdog_timeout == 300.0


@pytest.mark.parametrize(
    ("release", "redirected"),
    [
        ("0.5.17", {}),
        ("0.5.18", REDIRECT_0518),
        ("0.5.20", REDIRECT_0518),
        ("0.5.21", {**REDIRECT_0518, "TILELANG_CACHE_DIR": "{base}/tilelang"}),
        ("0.5.23", {**REDIRECT_0518, "TILELANG_CACHE_DIR": "{base}/tilelang"}),
    ],
)
def test_third_party_caches_under_sglang_cache_dir(
    release: str, redirected: dict[str, str]
) -> None:
    facts = release_caches(kb.load(), release)
    assert dict(facts.redirected) == redirected
    assert facts.sglang_cache_dir == "~/.cache/sglang"


def test_flashinfer_pins_shared_between_releases() -> None:
    knowledge = kb.load()
    by_fi: dict[str | None, list[str]] = {}
    for release in sorted(knowledge.releases, key=kb.version):
        by_fi.setdefault(release_caches(knowledge, release).flashinfer, []).append(release)
    assert by_fi["0.6.12"] == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"]
    assert by_fi["0.6.18"] == ["0.5.19", "0.5.20", "0.5.21"]


def test_cubin_and_triton_by_release() -> None:
    knowledge = kb.load()
    old, new = release_caches(knowledge, "0.5.15.post1"), release_caches(knowledge, "0.5.16")
    assert (old.flashinfer_cubin_pinned, old.flashinfer_cubin_on_pypi) == (True, True)
    assert (new.flashinfer_cubin_pinned, new.flashinfer_cubin_on_pypi) == (False, False)
    assert release_caches(knowledge, "0.5.10").triton == "3.5.1"
    assert release_caches(knowledge, "0.5.23").triton == "3.8.0"
    # every Triton a release installs reads TRITON_CACHE_AUTOTUNING (3.4.0 and later)
    assert all(release_caches(knowledge, r).triton_autotune_cache for r in knowledge.releases)
    # flashinfer-jit-cache as FlashInfer's index pages list it (caches.yaml's jit-cache-* sources)
    assert dict(release_caches(knowledge, "0.5.19").flashinfer_jit_cache) == {
        "cu128": "unverified",
        "cu129": "available",
        "cu130": "available",
    }
    assert set(release_caches(knowledge, "0.5.11").flashinfer_jit_cache.values()) == {"available"}
    assert release_caches(knowledge, "0.5.23").flashinfer_jit_cache["cu130"] == "unverified"
    assert release_caches(knowledge, "0.5.23").flashinfer_jit_cache["cu128"] == "absent"


def test_levers_by_release() -> None:
    knowledge = kb.load()
    assert release_caches(knowledge, "0.5.17").weight_load_modes == ()
    assert release_caches(knowledge, "0.5.18").weight_load_modes == ("overlap", "serial")
    assert dict(release_caches(knowledge, "0.5.13.post1").cuda_graph_max_bs) == {
        "--cuda-graph-max-bs": False
    }
    assert dict(release_caches(knowledge, "0.5.19").cuda_graph_max_bs) == {
        "--cuda-graph-max-bs": True,
        "--cuda-graph-max-bs-decode": False,
        "--cuda-graph-max-bs-prefill": False,
    }
    assert "--cuda-graph-max-bs" not in release_caches(knowledge, "0.5.20").cuda_graph_max_bs


def _broken(tmp_path: Path, edit: str, new: str) -> Path:
    text = CACHES_FILE.read_text()
    assert edit in text
    path = tmp_path / "caches.yaml"
    path.write_text(text.replace(edit, new, 1))
    yaml.safe_load(path.read_text())
    return path


@pytest.mark.parametrize(
    ("edit", "new", "named"),
    [
        ('"2.13.0": {requires: "==3.7.1"', '"2.13.1": {requires: "==3.7.1"', "pins torch 2.13.0"),
        ('resolves: "3.5.1"', 'resolves: "3.5.2"', "triton.torch_pins.2.9.1"),
        ("cu128: unverified", "cu127: unverified", "cu127 is not a lane"),
        ("cu129: unverified", "cu129: maybe", "'maybe'"),
        ('"0.7.2": {', '"0.7.3": {', "pins flashinfer-python 0.7.2"),
        ("source: triton-autotune-cache", "source: nowhere", "'nowhere'"),
        # An available (or absent) cell cites a source, and an available one a source that
        # names its version on its lane.
        (
            '"0.6.17": {cubin_on_pypi: false, jit_cache_source: [jit-cache-cu129-cu130]',
            '"0.6.17": {cubin_on_pypi: false',
            "0.6.17.jit_cache.cu129: available without a jit_cache_source",
        ),
        (
            "jit_cache: {cu128: unverified, cu129: available, cu130: available}}",
            "jit_cache: {cu128: available, cu129: available, cu130: available}}",
            "no source of jit-cache-cu129-cu130 names 0.6.17 on cu128",
        ),
        ("download_gb: {cu128:", "download_gb: {cu127:", "download_gb: cu127 is not a lane"),
    ],
)
def test_broken_data_is_named(tmp_path: Path, edit: str, new: str, named: str) -> None:
    with pytest.raises(KnowledgeError, match=named.replace(".", r"\.")):
        load_caches(kb.load(), _broken(tmp_path, edit, new))
