"""A file a step's plan writes: where, what (its content and digest), what the host holds now,
with what mode and owners, and whether it is a secret. The engine and model plans
(engine_plan.py, model_plan.py) list one per file their step writes; `plan --json` shows them
(a secret's content and digest never) and the step's operations write exactly them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from operations.host_files import sha256
from operations.layout import ManagedFile
from operations.vocabulary import PlannedFileJson


@dataclass(frozen=True)
class PlannedFile:
    path: str
    # The wanted content; repr=False: a secret's content never reaches a log or a traceback.
    content: str | bytes | None = field(default=None, repr=False)
    mode: str = "644"
    owner: str = "root"
    group: str = "root"
    secret: bool = False
    # The digest on the host as the plan's facts read it (None: absent); `read` False: unread.
    sha256_now: str | None = None
    read: bool = False
    # The wanted digest when the content is not the controller's to give (a lock uv writes).
    digest: str | None = None
    dir_mode: str = "755"
    dir_group: str = "root"
    # A file the host makes from what it holds (uv's lock, its export, the lock's copy in the
    # environment): what makes it, and no content or digest known before.
    made_by: str | None = None

    @property
    def data(self) -> str | bytes:
        """The content to write; a file whose content the host makes has none to give."""
        if self.content is None:
            raise ValueError(f"{self.path}: the plan holds no content for it")
        return self.content

    @property
    def sha256(self) -> str | None:
        return sha256(self.content) if self.content is not None else self.digest

    @property
    def changes(self) -> bool | None:
        """Whether writing it changes the host; None: not known before the write."""
        return self.sha256 != self.sha256_now if self.read else None

    def to_json(self) -> PlannedFileJson:
        # A secret's digest is not shown either: a short key or password could be guessed
        # offline from it. `changes` says whether the write changes the host.
        return {
            "path": self.path,
            "sha256": None if self.secret else self.sha256,
            "sha256_now": None if self.secret else self.sha256_now,
            "read": self.read,
            "mode": self.mode,
            "owner": self.owner,
            "group": self.group,
            "secret": self.secret,
            "changes": self.changes,
            "made_by": self.made_by,
        }


def managed(entry: ManagedFile, content: str | bytes, digests: dict[str, str]) -> PlannedFile:
    """A registry entry's file (layout.managed_files) with the digest the ServingState fact
    read when it checksums it (put_managed's rule: a secret's is never taken from there)."""
    read = entry.checksummed and not entry.secret
    return PlannedFile(
        entry.path,
        content,
        entry.mode,
        entry.owner,
        entry.group,
        entry.secret,
        digests.get(entry.path) if read else None,
        read,
        dir_mode=entry.dir_mode,
        dir_group=entry.dir_group,
    )
