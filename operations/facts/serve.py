"""What runs now: the rank units, their state, and when the engine and the model last changed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

_UNIT_RE = re.compile(r"^sglang@(\d+)\.service$")


@dataclass(frozen=True)
class RankState:
    unit_sha256: str | None = None
    active: str | None = None
    # When the running process started (epoch seconds); None when it is not running.
    started_at: int | None = None
    restarts: int | None = None


@dataclass(frozen=True)
class Serving:
    ranks: dict[int, RankState] = field(default_factory=dict)
    # ctime of ENGINE_ROOT/current and of the staged model path (links or directories): a rank
    # that started before either changed runs an old engine or model.
    engine_changed_at: int | None = None
    model_changed_at: int | None = None
    # sha256 of each other managed file (target unit, scripts, secrets); absent when missing.
    files: dict[str, str] = field(default_factory=dict)
    # Whether the service user exists.
    user_exists: bool = False
    # ActiveState of sglang-router.service ("inactive" when there is none).
    router_active: str | None = None

    def stale(self, rank: int) -> bool:
        state = self.ranks.get(rank)
        if state is None or state.started_at is None:
            return False
        changes = [t for t in (self.engine_changed_at, self.model_changed_at) if t is not None]
        return any(state.started_at < t for t in changes)


def _int(text: str) -> int | None:
    text = text.strip().lstrip("@")
    return int(text) if text.isdigit() else None


def _rank_block(block: dict[str, str]) -> tuple[int, dict[str, object]] | None:
    """One unit's `systemctl show` properties -> (rank, RankState fields)."""
    match = _UNIT_RE.match(block.get("Id", "").strip())
    if match is None:
        return None
    values: dict[str, object] = {"active": block.get("ActiveState", "").strip() or None}
    if "ExecMainStartTimestamp" in block:
        values["started_at"] = _int(block["ExecMainStartTimestamp"])
    if "NRestarts" in block:
        values["restarts"] = _int(block["NRestarts"])
    return int(match.group(1)), values


def parse_serving(lines: list[str]) -> Serving:
    ranks: dict[int, dict[str, object]] = {}
    # `systemctl show` prints one block of KEY=VALUE per unit, blocks separated by a blank line,
    # in its own property order (Id is not first): a block is complete at its end, not at Id.
    block: dict[str, str] = {}
    blocks: list[dict[str, str]] = []
    top: dict[str, int | None] = {}
    files: dict[str, str] = {}
    user_exists = False
    router_active: str | None = None
    for line in lines:
        word, _, rest = line.partition(" ")
        key, eq, value = line.partition("=")
        if eq and " " not in key and key[:1].isupper():
            if key in block:  # a block without the blank line after it
                blocks.append(block)
                block = {}
            block[key] = value
            continue
        if block:
            blocks.append(block)
            block = {}
        if word == "unit":
            name, _, sha = rest.partition(" ")
            match = _UNIT_RE.match(name)
            if match:
                ranks.setdefault(int(match.group(1)), {})["unit_sha256"] = sha.strip() or None
        elif word in ("engine", "model"):
            top[word] = _int(rest)
        elif word == "router":
            router_active = rest.strip() or None
        elif word == "user":
            user_exists = rest.strip() == "yes"
        elif word == "file":
            path, _, sha = rest.partition(" ")
            if sha.strip():
                files[path] = sha.strip()
    if block:
        blocks.append(block)
    for found in blocks:
        parsed = _rank_block(found)
        if parsed is not None:
            ranks.setdefault(parsed[0], {}).update(parsed[1])
    return Serving(
        ranks={
            rank: RankState(**values)  # type: ignore[arg-type]
            for rank, values in sorted(ranks.items())
        },
        engine_changed_at=top.get("engine"),
        model_changed_at=top.get("model"),
        files=files,
        user_exists=user_exists,
        router_active=router_active,
    )


class ServingState(FactBase[Serving]):
    """
    Returns the rank units present in /etc/systemd/system with their checksum, state, start
    time and restart count, when ENGINE_ROOT/current and the staged model last changed, and
    the checksums of other managed files. One round trip whatever the number of ranks.

    + engine_root: ENGINE_ROOT (its `current` link is timed)
    + model_path: the staged model path the servers read
    + paths: other files to checksum
    + user: the service user
    """

    def command(
        self, engine_root: str, model_path: str, paths: list[str], user: str
    ) -> StringCommand:
        checksums: list[str | QuoteString] = []
        for path in paths:
            checksums += ['echo "file', QuoteString(path), "$(sha256sum", QuoteString(path)]
            checksums += ['2>/dev/null | cut -c1-64)";']
        return StringCommand(
            # One `systemctl show` for every rank unit, not one per rank.
            "set --; cd /etc/systemd/system 2>/dev/null && for u in sglang@*.service; do",
            '[ -f "$u" ] || continue;',
            'echo "unit $u $(sha256sum "$u" | cut -c1-64)"; set -- "$@" "$u"; done;',
            '[ $# -eq 0 ] || systemctl show "$@" --timestamp=unix -p Id -p ActiveState',
            "-p ExecMainStartTimestamp -p NRestarts 2>/dev/null;",
            'echo "engine $(stat -c %Z',
            QuoteString(f"{engine_root}/current"),
            '2>/dev/null)";',
            'echo "model $(stat -c %Z',
            QuoteString(model_path),
            '2>/dev/null)";',
            *checksums,
            'echo "user $(id -u',
            QuoteString(user),
            '>/dev/null 2>&1 && echo yes || echo no)";',
            'echo "router $(systemctl show sglang-router.service -p ActiveState --value',
            '2>/dev/null)"; true',
        )

    @staticmethod
    def default() -> Serving:
        return Serving()

    def process(self, output: list[str]) -> Serving:
        return parse_serving(output)
