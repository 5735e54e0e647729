"""The staging script's source side (files/stage_model.py, which the host gets with this
inlined: operations/host_scripts.py): a model directory's manifest, read by stat only, its files
opened without following a link, and a staged copy's manifest read back."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from typing import Any

MANIFEST = ".staged-manifest.json"
# The hub's --local-dir metadata and our download marker live in .cache; never served.
SKIP_DIRS = {".cache", ".git"}
HUB_MARKER = ".cache/sglang-hub-complete"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
EXIT_REFUSED = 3  # does not fit, source missing: the message says why; nothing was copied
EXIT_CHANGED = 4  # a source file changed during the copy: staged nothing, re-run later


class StageError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _hub_sha256(root: str, rel: str, mtime_ns: int) -> str | None:
    """The hub's LFS sha256 for a file downloaded with --local-dir, while still trustworthy."""
    meta = os.path.join(".cache", "huggingface", "download", rel + ".metadata")
    text = _read_text(root, meta)
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < 3:
        return None
    etag, stamp = lines[1].strip().strip('"'), lines[2].strip()
    try:
        # Same rule as huggingface_hub: metadata older than the file describes another file.
        if float(stamp) * 1e9 < mtime_ns - 1e9:
            return None
    except ValueError:
        return None
    if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag):
        return etag
    return None


def scan(root: str) -> dict[str, Any]:
    """Every served file under root with size and mtime (stat only: never reads contents)."""
    if not os.path.isdir(root):
        raise StageError(f"model source {root}: no such directory", EXIT_REFUSED)
    if not os.access(root, os.R_OK | os.X_OK):
        raise StageError(f"model source {root}: not readable", EXIT_REFUSED)
    files: list[dict[str, Any]] = []

    def walk_error(exc: OSError) -> None:
        raise StageError(f"model source: cannot read {exc.filename}: {exc.strerror}", EXIT_REFUSED)

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        dirnames.sort()
        for name in dirnames + filenames:  # os.walk lists a link to a directory as a dirname
            _refuse_link(os.path.join(dirpath, name))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel == MANIFEST:
                continue
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue  # a FIFO, socket or device node is no weight file
            if not os.access(full, os.R_OK):
                raise StageError(f"model source: {full} is not readable", EXIT_REFUSED)
            entry: dict[str, Any] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            sha = _hub_sha256(root, rel, st.st_mtime_ns)
            if sha:
                entry["sha256"] = sha
            files.append(entry)
    files.sort(key=lambda e: e["path"])
    return {"files": files, "bytes": sum(e["size"] for e in files), "digest": digest(files)}


def _refuse_link(path: str) -> None:
    """A link in the source is never followed: root would copy whatever it names (a root-only
    file) into a copy every rank reads. Refused with its path."""
    try:
        target = os.readlink(path)
    except OSError:
        return  # not a link (or gone: the copy's own checks see that)
    raise StageError(
        f"model source: {path} is a symbolic link (to {target}); the staging copy takes "
        "regular files only and never follows a link: replace it with the file itself",
        EXIT_REFUSED,
    )


def open_source(root: str, rel: str) -> int:
    """A read-only descriptor of the regular file root/rel, opened component by component with
    O_NOFOLLOW: a link anywhere below root is refused with its path (StageError), never
    followed, even one that replaced a checked file after the scan."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _refuse_link(os.path.join(root, *parts[: i + 1]))
                raise
            os.close(fd)
            fd = nxt
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StageError(f"model source: {os.path.join(root, rel)} is not a regular file")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _key(entry: dict[str, Any]) -> tuple[str, int, int, str]:
    return (entry["path"], entry["size"], entry["mtime_ns"], entry.get("sha256", ""))


def digest(files: list[dict[str, Any]]) -> str:
    text = json.dumps([_key(e) for e in files], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_text(root: str, rel: str) -> str | None:
    """A small regular file under root (the hub marker, the hub's metadata, the token), read
    without following a link at any component below root; None when absent, a link or not a
    regular file (a marker linked to a root-only file would show its first line in the plan)."""
    try:
        fd = open_source(root, rel)
    except (OSError, StageError):
        return None
    with open(fd, encoding="utf-8", errors="replace") as fh:
        return fh.read(1 << 20).strip() or None


def _reusable(files: list[dict[str, Any]], staged: dict[str, Any] | None) -> set[tuple[Any, ...]]:
    """Entries the current copy already holds byte-identical (same path, size, mtime, hash)."""
    if not staged:
        return set()
    have = {_key(e) for e in staged["files"]}
    return {_key(e) for e in files if _key(e) in have}


def read_manifest(version_dir: str | None) -> dict[str, Any] | None:
    if version_dir is None:
        return None
    try:
        with open(os.path.join(version_dir, MANIFEST)) as fh:
            loaded: dict[str, Any] = json.load(fh)
            return loaded
    except (OSError, ValueError):
        return None
