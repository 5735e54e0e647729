"""Where a rank's compilers and tuners keep what they make: one directory per engine environment
(layout.EngineTree.compile_cache), shared by that engine's ranks, kept across restarts and
switches back, pruned with the environment. Each variable decided from the knowledge base
(knowledge/caches.yaml and the release's start-up file), with its source.

SGLang 0.5.18+ setdefaults the third-party caches under SGLANG_CACHE_DIR when it is imported,
and not at all if FlashInfer was imported first (environ.py third_party_cache_defaults): each
variable is set here explicitly, to the very path SGLang would choose, so every release gets
the same layout and no import order can move it.
"""

from __future__ import annotations

from dataclasses import dataclass

from operations.kb.caches import load_caches, release_caches
from operations.kb.startup import load_startup
from operations.kb.types import Knowledge

# Under the engine's compile-cache directory, for a release that redirects nothing: the names
# SGLang's own redirect uses (knowledge/startup/sglang-0.5.18+.json caches.third_party).
FALLBACK_LAYOUT = {
    "TRITON_CACHE_DIR": ("{base}/triton", "triton-cache-dir"),
    "TORCHINDUCTOR_CACHE_DIR": ("{base}/inductor", "inductor-cache-dir"),
    "CUDA_CACHE_PATH": ("{base}/nv", "cuda-cache-path"),
}


@dataclass(frozen=True)
class CacheVariable:
    variable: str
    value: str
    why: str
    source: str  # a URL, or the release's wheel file and line


def cache_environment(kb: Knowledge, release: str, base: str) -> list[CacheVariable]:
    """The compile-cache variables of a rank of `release` whose engine's caches are `base`;
    [] for a release the knowledge base has no start-up data for."""
    lines = load_startup(release)
    if release not in kb.releases or lines is None:
        return []
    facts = release_caches(kb, release)
    caches = load_caches(kb)
    wheel = f"sglang {release} wheel"
    found: list[CacheVariable] = []
    if facts.sglang_cache_dir is not None:
        found.append(
            CacheVariable(
                "SGLANG_CACHE_DIR",
                base,
                f"SGLang's own JIT cache (default {facts.sglang_cache_dir}): the engine's",
                f"{wheel}, {lines.sglang_cache_dir_source}",
            )
        )
    third = lines.third_party_caches
    if third is not None:
        for variable, template in sorted(third.variables.items()):
            found.append(
                CacheVariable(
                    variable,
                    template.format(base=base),
                    "as SGLang redirects it under SGLANG_CACHE_DIR (setdefault), set explicitly",
                    f"{wheel}, {third.source}",
                )
            )
    else:
        fi = caches.sources["flashinfer-workspace"]["url"]
        found.append(
            CacheVariable(
                caches.flashinfer_workspace_variable,
                base,
                f"FlashInfer's JIT modules go to <it>/{caches.flashinfer_cache_under_base}/"
                "<version>/<arch> (default: the home directory); this release redirects nothing",
                fi,
            )
        )
        for variable, (template, source) in FALLBACK_LAYOUT.items():
            found.append(
                CacheVariable(
                    variable,
                    template.format(base=base),
                    "this release redirects nothing: the layout SGLang 0.5.18+ gives it",
                    caches.sources[source]["url"],
                )
            )
    if facts.triton_autotune_cache:
        autotune = caches.autotune
        found.append(
            CacheVariable(
                autotune.variable,
                "1",
                f"Triton {facts.triton} (torch {facts.torch}) reads it (>= {autotune.since}): "
                f"{autotune.why}",
                "; ".join(caches.sources[s]["url"] for s in autotune.source),
            )
        )
    return found
