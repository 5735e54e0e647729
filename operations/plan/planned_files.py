"""A file a step's plan writes: where, what (its content and digest), what the host holds now,
with what mode and owners, and whether it is a secret. Every step's plan lists one per file
its step writes (engine_plan.py, model_plan.py, serve_plan.py's ServePlan and RouterStep); `plan
--json` shows them (a secret's content and digest never) and the steps write exactly them
(host_files.put_planned for the files the controller gives).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from operations.layout import ManagedFile
from operations.plan.vocabulary import FileJson


def content_bytes(src: str | bytes) -> bytes:
    return src.encode() if isinstance(src, str) else src


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass(frozen=True)
class PlannedFile:
    path: str
    # The wanted content; repr=False: a secret's content never reaches a log or a traceback.
    content: str | bytes | None = field(default=None, repr=False)
    mode: str = "644"
    owner: str = "root"
    group: str = "root"
    secret: bool = False
    # The digest on the host as the plan's facts read it (None: absent); `read` False: the
    # facts do not read it (a secret's mode and owners are read by put_file when it writes).
    sha256_now: str | None = None
    read: bool = False
    # The wanted digest when the content is not the controller's to give (a lock uv writes).
    digest: str | None = None
    dir_mode: str = "755"
    dir_group: str = "root"
    # A file the host makes from what it holds (uv's lock, its export, the lock's copy in the
    # environment): what makes it, and no content or digest known before.
    made_by: str | None = None
    # The operation's name, where the step writes it through put_planned.
    name: str = ""
    # Its text is shown by the plan (units).
    shown: bool = False

    @property
    def data(self) -> str | bytes:
        """The content to write; a file whose content the host makes has none to give."""
        if self.content is None:
            raise ValueError(f"{self.path}: the plan holds no content for it")
        return self.content

    @property
    def text(self) -> str:
        data = self.data
        return data.decode() if isinstance(data, bytes) else data

    @property
    def sha256(self) -> str | None:
        return sha256(self.content) if self.content is not None else self.digest

    @property
    def changes(self) -> bool | None:
        """Whether writing it changes the host's content; None: not known before the write
        (the facts do not read it; its write reads the FileAt fact and may find it current)."""
        return self.sha256 != self.sha256_now if self.read else None

    def to_json(self) -> FileJson:
        # A secret's digest is not shown either: a short key or password could be guessed
        # offline from it. `changes` says whether the write changes the host.
        hidden = self.secret
        text = self.content if self.shown and not self.secret else None
        return {
            "name": self.name,
            "path": self.path,
            "mode": self.mode,
            "owner": self.owner,
            "group": self.group,
            "secret": self.secret,
            "sha256": None if hidden else self.sha256,
            "sha256_now": None if hidden or not self.read else self.sha256_now,
            "read": self.read,
            "changes": self.changes,
            "made_by": self.made_by,
            "content": text.decode() if isinstance(text, bytes) else text,
        }


def planned(
    name: str,
    entry: ManagedFile,
    src: str | bytes,
    digests: Mapping[str, str],
    *,
    shown: bool = False,
) -> PlannedFile:
    """The plan's write of a registry entry (layout.managed_files): `digests`, the ServingState
    fact's sha256s by path (Serving.files, or the rank units' by their path); the entry's
    reading is taken when the fact checksums it."""
    return PlannedFile(
        path=entry.path,
        content=content_bytes(src),
        mode=entry.mode,
        owner=entry.owner,
        group=entry.group,
        secret=entry.secret,
        sha256_now=digests.get(entry.path) if entry.checksummed else None,
        read=entry.checksummed,
        dir_mode=entry.dir_mode,
        dir_group=entry.dir_group,
        name=name,
        shown=shown,
    )
