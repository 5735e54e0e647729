"""The capacity rules, one place for each: how much memory a container needs for the model
staged in tmpfs and its ranks (pve.py sizes the container by it, preflight judges it), and how
a model copy fits the tmpfs (`stage_room`: the staging decision follows it, the staging script
applies the same headroom). Pure arithmetic over settings and the host's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from operations.facts.host import Resources
from operations.plan.vocabulary import RoomMode
from operations.settings import Settings

GIB = 1024**3
# tmpfs bookkeeping and small files beside the weights: a copy needs 2% more than its size.
STAGE_HEADROOM = 1.02


def gib(n: int | None) -> str:
    """A size in bytes as every message shows it: GiB, one decimal ("unknown": None)."""
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class StageRoom:
    """How a model copy fits the tmpfs: the plan prints it, the model step follows it.

    mode "beside": the new copy goes next to the current one, servers keep running until the
    switch; "inplace": the current copy is removed first, with the servers stopped; None: it
    does not fit either way (why says so, with the numbers).
    """

    mode: RoomMode | None
    copy_bytes: int
    why: str


def ram_per_rank(settings: Settings) -> int:
    return int(settings.ram_per_rank_gb * GIB)


# pve-container sets memory.high below the configured memory (memory.max): 128 MiB below it from
# 16 GiB up, 1016/1024 of it below 16 GiB (proxmox/pve-container src/PVE/LXC/Config.pm,
# calculate_memory_constraints). Above memory.high the container is throttled and reclaimed hard.
HIGH_MARGIN = 128 * 1024**2
HIGH_MARGIN_FROM = 16 * GIB


def memory_high(limit: int) -> int:
    """The memory.high pve-container derives from a container memory (memory.max) of limit bytes."""
    return limit - HIGH_MARGIN if limit >= HIGH_MARGIN_FROM else limit * 1016 // 1024


def memory_in_use(settings: Settings, size: int) -> int:
    """What the deploy keeps in the container's memory: the model staged in tmpfs (its pages count
    against the limit) plus dp_size ranks of ram_per_rank_gb."""
    return size + settings.dp_size * ram_per_rank(settings)


def memory_needed(settings: Settings, size: int) -> int:
    """The smallest container memory limit (memory.max) whose memory.high still holds
    memory_in_use: pve.py sizes the container by it, preflight judges the container by it."""
    use = memory_in_use(settings, size)
    if use + HIGH_MARGIN >= HIGH_MARGIN_FROM:
        return use + HIGH_MARGIN
    return -(-use * 1024 // 1016)


def stage_room(
    settings: Settings, resources: Resources, size: int, copy_bytes: int, current_bytes: int
) -> StageRoom:
    """The one capacity rule for staging: free tmpfs space and the memory limit, with headroom.

    size: the whole model; copy_bytes: what must be copied (unchanged files are hard links to
    the current copy); current_bytes: the current copy, freed by an in-place swap.
    """
    free = resources.stage_free_bytes
    limit = resources.memory_limit_bytes
    ranks = settings.dp_size * ram_per_rank(settings)
    need = int(copy_bytes * STAGE_HEADROOM)
    # Both copies and the ranks must fit under memory.high, as memory_needed's rule does.
    in_memory = current_bytes + copy_bytes + ranks
    if (free is None or free >= need) and (limit is None or memory_high(limit) >= in_memory):
        return StageRoom("beside", copy_bytes, f"{gib(copy_bytes)} to copy, {gib(free)} free")
    beside_why = (
        f"{gib(need)} needed beside the current copy ({gib(current_bytes)}), "
        f"{gib(free)} free in {settings.model_stage_dir}, memory limit {gib(limit)}"
    )
    whole = int(size * STAGE_HEADROOM)
    if current_bytes and (free is None or free + current_bytes >= whole):
        return StageRoom("inplace", size, f"{beside_why}: replacing it with the servers stopped")
    return StageRoom(
        None,
        copy_bytes,
        f"the model needs {gib(need)} = {need} bytes in {settings.model_stage_dir}; "
        f"{gib(free)} = {free} bytes free (current copy {gib(current_bytes)}); "
        "nothing was copied",
    )
