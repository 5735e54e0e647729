"""A canary rollout's state on a host (settings `rollout`, operations/plan/canary_plan.py): the
last verdict (layout.CANARY_RECORD, which the comparison program, layout.CANARY_SCRIPT, writes
atomically) and the canary ranks' unit files as they were before the canary rewrote them
(layout.CANARY_BACKUP_DIR, one copy per unit file name, which a rollback restores).

Root restores a backup into /etc/systemd/system and the plan refuses or promotes a deploy on the
record's word, so nothing another user could have made counts: the record only as a regular
file (not a link) owned by root and writable by no one else, a backup only as such a file in
such a directory (`stat -c '%u %a'`, as facts/gpu.py checks its cache directory). The command
prints what it finds, `parse_canary` judges it (pure, pinned by tests/facts/canary.CanaryState/).

The record, one JSON object (the program's `--record`):

    {"version": 1, "target": "<the ranks' flags digest, plan/throughput_plan.flags_digest>",
     "release": "0.5.12", "engine": "0.5.12-cu128-1a2b3c4d", "canary_ranks": [0],
     "baseline_rank": 1, "at": "2026-12-06T18:00:00Z", "ok": false, "paused": false,
     "rows": [{"check": "answers: known sum", "baseline": "742", "canary": "742",
               "threshold": "exact", "pass": true}, ...],
     "rolled_back": false}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout

RECORD_VERSION = 1
# The most of the record the fact prints: a verdict is a few rows, well under 4 KiB.
MAX_BYTES = 65536


@dataclass(frozen=True)
class VerdictRow:
    """One row of the verdict table: what was compared, each side's value, the threshold."""

    check: str
    baseline: str
    canary: str
    threshold: str
    passed: bool


@dataclass(frozen=True)
class CanaryRecord:
    """The verdict of the last comparison on the host, as the program wrote it."""

    target: str
    release: str
    engine: str
    canary_ranks: tuple[int, ...]
    baseline_rank: int | None
    at: str
    ok: bool
    paused: bool
    rows: tuple[VerdictRow, ...] = ()
    rolled_back: bool = False

    def failed_rows(self) -> list[VerdictRow]:
        return [row for row in self.rows if not row.passed]


@dataclass(frozen=True)
class Canary:
    """The record (None: no file, or one not to trust: then `problem` says why) and the unit
    backups, unit file name -> sha256 (only trusted ones); `ignored`: backups left out, and
    why."""

    record: CanaryRecord | None = None
    problem: str | None = None
    backups: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)


def _trusted(uid: str, mode: str) -> str | None:
    """Why a file or directory with this owner and mode is not trusted; None: root's, and no
    one else may write it."""
    if uid != "0":
        return f"owned by uid {uid}, not root"
    try:
        bits = int(mode, 8)
    except ValueError:
        return f"mode {mode!r} unreadable"
    if bits & 0o022:
        return f"mode {mode}: writable by group or others"
    return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _row(found: Any) -> VerdictRow | None:
    if not isinstance(found, dict) or not isinstance(found.get("check"), str):
        return None
    passed = found.get("pass")
    if not isinstance(passed, bool):
        return None
    return VerdictRow(
        check=found["check"],
        baseline=_text(found.get("baseline", "")),
        canary=_text(found.get("canary", "")),
        threshold=_text(found.get("threshold", "")),
        passed=passed,
    )


def parse_record(text: str) -> CanaryRecord | str:
    """The record from the file's text, or why it is not one (a short line)."""
    try:
        found = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:60]!r}"
    if not isinstance(found, dict):
        return f"not a JSON object: {text[:60]!r}"
    if found.get("version") != RECORD_VERSION:
        return f"version {found.get('version')!r}, not {RECORD_VERSION}"
    strings = ("target", "release", "engine", "at")
    bad = [k for k in strings if not isinstance(found.get(k), str)]
    bad += [k for k in ("ok", "paused", "rolled_back") if not isinstance(found.get(k), bool)]
    ranks_found = found.get("canary_ranks")
    ranks: list[int] = ranks_found if isinstance(ranks_found, list) else []
    if not ranks or not all(_is_rank(r) for r in ranks):
        bad.append("canary_ranks")
    baseline = found.get("baseline_rank")
    if baseline is not None and not _is_rank(baseline):
        bad.append("baseline_rank")
    rows_found = found.get("rows")
    rows = [_row(r) for r in rows_found] if isinstance(rows_found, list) else [None]
    if any(r is None for r in rows):
        bad.append("rows")
    if bad:
        return f"missing or malformed: {', '.join(bad)}"
    return CanaryRecord(
        target=found["target"],
        release=found["release"],
        engine=found["engine"],
        canary_ranks=tuple(ranks),
        baseline_rank=baseline,
        at=found["at"],
        ok=found["ok"],
        paused=found["paused"],
        rows=tuple(r for r in rows if r is not None),
        rolled_back=found["rolled_back"],
    )


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_canary(lines: list[str]) -> Canary:
    """The fact's lines: "record file UID MODE" (or "record symlink" / "record other"), then
    "text JSON" for a regular file; "backups dir UID MODE" (or "backups symlink"/"backups
    other"), then "backup UID MODE SHA256 NAME" per unit backup; "end"."""
    record: CanaryRecord | None = None
    problem: str | None = None
    stat: list[str] = []
    text: str | None = None
    folder: list[str] = []
    found: dict[str, tuple[str, str, str]] = {}
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "record":
            stat = rest.split()
        elif word == "text":
            text = rest
        elif word == "backups":
            folder = rest.split()
        elif word == "backup":
            parts = rest.split(" ", 3)
            if len(parts) == 4:
                found[parts[3]] = (parts[0], parts[1], parts[2])
    where = layout.CANARY_RECORD
    if stat and stat[0] != "file":
        problem = f"{where} is a {stat[0]}, not a regular file: not read"
    elif len(stat) == 3:
        why = _trusted(stat[1], stat[2])
        if why is not None:
            problem = f"{where} is {why}: not trusted"
        elif text is not None:
            parsed = parse_record(text)
            if isinstance(parsed, str):
                problem = f"{where}: {parsed}"
            else:
                record = parsed
    backups: dict[str, str] = {}
    ignored: dict[str, str] = {}
    folder_why = None
    if folder and folder[0] != "dir":
        folder_why = f"{layout.CANARY_BACKUP_DIR} is a {folder[0]}"
    elif len(folder) == 3:
        folder_why = _trusted(folder[1], folder[2])
    for name, (uid, mode, digest) in sorted(found.items()):
        if layout.rank_of(name) is None:
            ignored[name] = "not a rank unit's name"
        elif folder_why is not None:
            ignored[name] = f"its directory is {folder_why}"
        elif (why := _trusted(uid, mode)) is not None:
            ignored[name] = why
        elif len(digest) != 64:
            ignored[name] = "no sha256"
        else:
            backups[name] = digest
    return Canary(record=record, problem=problem, backups=backups, ignored=ignored)


# Never follows a link: a link is reported as one and not read.
_SCRIPT = " ".join(
    (
        'if [ -L "$f" ]; then echo "record symlink";',
        'elif [ -f "$f" ]; then echo "record file $(stat -c \'%u %a\' -- "$f")";',
        f'echo "text $(head -c {MAX_BYTES} -- "$f" | tr -d \'\\n\')";',
        'elif [ -e "$f" ]; then echo "record other"; fi;',
        'if [ -L "$d" ]; then echo "backups symlink";',
        'elif [ -d "$d" ]; then echo "backups dir $(stat -c \'%u %a\' -- "$d")";',
        f'for u in "$d"/{layout.RANK_UNIT_GLOB}; do [ -f "$u" ] && [ ! -L "$u" ] || continue;',
        'echo "backup $(stat -c \'%u %a\' -- "$u") $(sha256sum < "$u" | cut -d\' \' -f1)',
        '${u##*/}"; done;',
        'elif [ -e "$d" ]; then echo "backups other"; fi;',
        "echo end",
    )
)


def canary_words(
    record: str = layout.CANARY_RECORD, backup_dir: str = layout.CANARY_BACKUP_DIR
) -> list[str | QuoteString]:
    """The fact's shell words, joined with no separator (the status fact runs them too, each
    line prefixed, operations/facts/serve_status.py)."""
    return ["f=", QuoteString(record), "; d=", QuoteString(backup_dir), "; " + _SCRIPT]


class CanaryState(FactBase[Canary]):
    """
    Returns the last canary verdict on the host and the canary ranks' unit backups.

    .. code:: python

        Canary(
            record=CanaryRecord(target="9f86...", release="0.5.12",
                                engine="0.5.12-cu128-1a2b3c4d", canary_ranks=(0,),
                                baseline_rank=1, at="2026-12-06T18:00:00Z", ok=True,
                                paused=False, rows=(VerdictRow(...), ...), rolled_back=False),
            problem=None,
            backups={"sglang@0.service": "3b1f..."},
            ignored={},
        )

    + record: the verdict file (layout.CANARY_RECORD)
    + backup_dir: the unit backups' directory (layout.CANARY_BACKUP_DIR)
    """

    def command(
        self, record: str = layout.CANARY_RECORD, backup_dir: str = layout.CANARY_BACKUP_DIR
    ) -> StringCommand:
        return StringCommand(*canary_words(record, backup_dir), _separator="")

    @staticmethod
    def default() -> Canary:
        return Canary()

    def process(self, output: list[str]) -> Canary:
        return parse_canary(output)
