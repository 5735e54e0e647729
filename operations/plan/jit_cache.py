"""Whether an engine installs FlashInfer's prebuilt JIT modules, decided once: engine_spec pins
it (so it is in the engine's lock, name and wheelhouse like any pin) and the plan explains it
(`plan --why`, "prebuilt kernels").

flashinfer-jit-cache is one wheel per CUDA lane on FlashInfer's own index (not on PyPI),
versioned `<FlashInfer's version>+<lane>` and requiring nothing; an installed one is where
flashinfer loads a module from instead of compiling it, after checking at import that its
version starts with FlashInfer's (knowledge/caches.yaml, sources jit-cache-wheel and
jit-cache-runtime). It is installed exactly when the knowledge base lists that build as
`available` (a cited index page names it) and the setting flashinfer_jit_cache is on.
"""

from __future__ import annotations

from dataclasses import dataclass

from operations.kb import Knowledge
from operations.kb.caches import JitCache, load_caches
from operations.settings import Settings

INDEX = "flashinfer"  # the Pin.index of its pin: read from flashinfer_index_url


@dataclass(frozen=True)
class JitCacheChoice:
    """flashinfer-jit-cache for one release on one lane: whether it is installed, and why."""

    project: str  # flashinfer-jit-cache
    flashinfer: str | None  # the FlashInfer the release pins (None: it pins none exactly)
    lane: str
    status: JitCache | None  # the knowledge base's; None: no entry for that FlashInfer
    wanted: bool  # setting flashinfer_jit_cache
    sources: tuple[str, ...]  # the URLs the status and the wheel's behaviour are read from
    download_gb: str | None  # the lane's wheel size, as read

    @property
    def used(self) -> bool:
        return self.wanted and self.flashinfer is not None and self.status == "available"

    @property
    def version(self) -> str:
        """`0.6.8.post1+cu128`: the version FlashInfer's release workflow gives the lane's build
        (and the one flashinfer's import check accepts: it starts with FlashInfer's)."""
        return f"{self.flashinfer}+{self.lane}"

    @property
    def value(self) -> str:
        if self.used:
            return f"{self.project}=={self.version}"
        return "none"

    @property
    def why(self) -> str:
        said = f"FlashInfer {self.flashinfer}'s {self.project} for {self.lane}"
        if self.flashinfer is None:
            return "the release pins no exact FlashInfer: no prebuilt JIT modules are installed"
        if self.used:
            size = f" (a {self.download_gb} GB wheel, downloaded once)" if self.download_gb else ""
            return (
                f"{said} is published on FlashInfer's index{size}: the ranks load FlashInfer's "
                "attention modules from it instead of compiling them on their first start; "
                "flashinfer_jit_cache: false turns it off"
            )
        if self.status is None:
            reason = "is not in the knowledge base"
        elif self.status == "available":
            reason = "is published, but flashinfer_jit_cache is false"
        elif self.status == "absent":
            reason = "is not published"
        else:
            reason = "is unverified (no index page read lists it)"
        return f"{said} {reason}: the first start of each engine compiles FlashInfer's modules"


def jit_cache_choice(settings: Settings, kb: Knowledge, release: str, lane: str) -> JitCacheChoice:
    """The choice for `release` on `lane` (both in the knowledge base: the resolver has refused
    any other before an engine is planned)."""
    caches = load_caches(kb)
    fi = kb.releases[release].pin("flashinfer-python")
    entry = caches.flashinfer.get(fi) if fi is not None else None
    status = entry.jit_cache.get(lane) if entry is not None else None
    project = caches.jit_cache
    listed = entry.jit_cache_source if entry is not None else ()
    # The index page of this lane (each names its lanes), then what the wheel is and does.
    cites = [c for c in listed if lane in caches.sources[c]["what"]] or list(listed)
    cites += project.source
    if status == "available":
        cites += project.download_source
    return JitCacheChoice(
        project=project.project,
        flashinfer=fi,
        lane=lane,
        status=status,
        wanted=settings.flashinfer_jit_cache,
        sources=tuple(dict.fromkeys(caches.sources[c]["url"] for c in cites)),
        download_gb=project.download_gb.get(lane),
    )
