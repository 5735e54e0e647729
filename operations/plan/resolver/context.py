"""One host's resolution under way: the settings, facts and knowledge it reads, the plan it
writes, and the errors it collects instead of stopping at the first. Every check takes it."""

from __future__ import annotations

from operations.kb import Cites, Knowledge, cite
from operations.plan.resolver.types import Facts, ResolvedHost
from operations.settings import Settings


def src(sources: Cites) -> str:
    return f"source: {cite(sources)}"


# The origin of a value a command tried in place of the host's own (`releases` asks the plan
# for every release and lane): said as tried, never credited to the inventory.
TRIED = "tried by the releases command"


class Resolution:
    """One host's resolution: collects errors instead of stopping at the first."""

    def __init__(self, settings: Settings, facts: Facts, kb: Knowledge) -> None:
        self.s = settings
        self.facts = facts
        self.kb = kb
        self.plan = ResolvedHost()
        self.release_known = settings.sglang_version in kb.releases
        self.table = kb.cli_table("sglang", settings.sglang_version)

    def error(self, message: str) -> None:
        self.plan.errors.append(message)

    def where(self, key: str) -> str:
        origin = self.s.origin(key)
        return f"({origin})" if origin == TRIED else f"(set in {origin})"

    def driver(self) -> str | None:
        gpu = self.facts.gpu
        return gpu.driver_version if gpu is not None and gpu.ok else None

    def single_driver(self) -> str | None:
        """The driver version when every GPU reports the same one; None when not known."""
        driver = self.driver()
        return None if driver is None or "," in driver else driver
