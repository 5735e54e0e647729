#!/usr/bin/env python3
"""Stage a model directory into a tmpfs: manifest-compared, atomic, resumable.

The one staging code path: the deploy runs it over SSH and the boot unit
(sglang-stage-model.service) runs it at boot. It runs with the host's python3 and the standard
library only, because it must work on a bare container before any engine is installed.

Layout under STAGE_DIR/models (SLUG is the served name made path-safe):
  SLUG               symlink -> .SLUG@KEY: the newest complete copy
  .SLUG@KEY/         a complete copy (KEY: the deploy's --key, else the digest); each rank unit
                     names one by path, and copies a unit names are kept (--keep)
  .SLUG.tmp-PID/     a copy in progress; never visible under SLUG, removed by the next run
  .SLUG.lock         flock: the boot unit and a deploy never stage at the same time

Subcommands (output is JSON on the last stdout line; progress lines go before it):
  scan SOURCE                               the source's manifest summary
  plan SOURCE STAGE_DIR SLUG [--verify V] [--key K] [--keep KEY ...]
                                            what a stage run with that key and keep would do
                                            (read only; the ModelStaging fact)
  stage SOURCE STAGE_DIR SLUG [...]         copy what changed, verify, switch, clean up
  prune STAGE_DIR SLUG [--keep KEY ...]     remove the copies no rank unit names any more
  fetch-hub --cli HF --repo R --revision V --dest DIR [--token-file F]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

MANIFEST = ".staged-manifest.json"
# The hub's --local-dir metadata and our download marker live in .cache; never served.
SKIP_DIRS = {".cache", ".git"}
HUB_MARKER = ".cache/sglang-hub-complete"
CHUNK = 64 * 1024 * 1024
MODELS_MODE = 0o755  # STAGE_DIR/models: root's, listable, nobody else writes in it
# With --group (the servers' group), copies are root:GROUP, dirs 0750, files 0640: the servers
# read the weights, other users on the host do not. Set once by main().
DIR_MODE, FILE_MODE = 0o750, 0o640
GROUP_ID: int | None = None
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
EXIT_REFUSED = 3  # does not fit, source missing: the message says why; nothing was copied
EXIT_CHANGED = 4  # a source file changed during the copy: staged nothing, re-run later
# Set by SIGTERM/SIGHUP: copy threads stop at their next chunk, so the temp copy goes at once.
STOP = threading.Event()


class StageError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------- manifest


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


# --------------------------------------------------------------------------------- layout


def _who(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _check_stage_dir(stage_dir: str) -> None:
    """STAGE_DIR may be writable by others only if sticky (like /dev/shm): then nobody else can
    rename or replace the root-owned models directory in it."""
    try:
        st = os.stat(stage_dir)
    except OSError:
        raise StageError(f"stage directory {stage_dir} does not exist", EXIT_REFUSED) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StageError(f"stage directory {stage_dir} is not a directory", EXIT_REFUSED)
    writable_by_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (0, os.geteuid()) or writable_by_others:
        raise StageError(
            f"stage directory {stage_dir} is owned by {_who(st.st_uid)} with mode "
            f"{stat.S_IMODE(st.st_mode):o}: another user could replace what is staged there; "
            "use a root-owned tmpfs (like /dev/shm) for model_stage_dir",
            EXIT_REFUSED,
        )


def open_models(stage_dir: str, create: bool) -> int | None:
    """A descriptor of STAGE_DIR/models, made (when create) and checked by us: a directory
    (O_NOFOLLOW: never a link), owned by our uid (root), mode 0755. None when it does not
    exist and create is False. One made by anybody else is refused, never reused.

    Once it is checked, nobody else can add, rename or replace anything in it (0755, ours, in
    a sticky or root-only STAGE_DIR), so what this script then opens inside is its own."""
    _check_stage_dir(stage_dir)
    models = os.path.join(stage_dir, "models")
    parent = os.open(stage_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir("models", MODELS_MODE, dir_fd=parent)
        try:
            fd = os.open("models", os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            st = os.stat("models", dir_fd=parent, follow_symlinks=False)
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise StageError(
                f"{models} is {kind} (owned by {_who(st.st_uid)}): someone else made it; "
                f"refusing to use it. Remove it (rm -rf {models}) and run again",
                EXIT_REFUSED,
            ) from exc
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise StageError(
            f"{models} is owned by {_who(st.st_uid)}, not by {_who(os.geteuid())}: someone else "
            f"made it; refusing to use it. Remove it (rm -rf {models}) and run again",
            EXIT_REFUSED,
        )
    if stat.S_IMODE(st.st_mode) != MODELS_MODE:
        os.fchmod(fd, MODELS_MODE)  # ours: only its mode drifted
    return fd


def freed_bytes(paths: list[str]) -> int:
    """What removing these entries frees: blocks of files no other name links to (a superseded
    copy shares its unchanged files with the current one). Never follows a link."""
    total = 0
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                total += freed_bytes([os.path.join(path, n) for n in os.listdir(path)])
        elif st.st_nlink == 1:
            total += st.st_blocks * 512
    return total


def _install(temp: str, final: str, remove_path: Callable[[str], None]) -> None:
    """Rename a complete copy to its final name. When that name is taken (a damaged copy of the
    same digest, maybe served right now), the two are exchanged atomically, so the name always
    holds a complete copy; the old one is then removed."""
    if not os.path.lexists(final):
        os.rename(temp, final)
        return
    if _exchange(temp, final):
        remove_path(temp)  # now the old copy
        return
    aside = f"{temp}.old"
    os.rename(final, aside)
    os.rename(temp, final)
    remove_path(aside)


def _exchange(a: str, b: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two names in one step (tmpfs supports it)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) == 0)


class Layout:
    def __init__(self, stage_dir: str, slug: str, keep: tuple[str, ...] = ()) -> None:
        self.models = os.path.join(stage_dir, "models")
        self.slug = slug
        self.final = os.path.join(self.models, slug)
        self.lock = os.path.join(self.models, f".{slug}.lock")
        # Copies (by key) a rank unit names: kept until the serve step prunes them.
        self.keep = {self.version(key) for key in keep}

    def version(self, key: str) -> str:
        """A complete copy's directory: .SLUG@KEY (the deploy's key, else the digest)."""
        return os.path.join(self.models, f".{self.slug}@{key}")

    def temp(self) -> str:
        return os.path.join(self.models, f".{self.slug}.tmp-{os.getpid()}")

    def current(self) -> str | None:
        """The complete copy SLUG points at, or None."""
        try:
            target = os.readlink(self.final)
        except OSError:
            return None
        path = os.path.join(self.models, target)
        return path if os.path.isfile(os.path.join(path, MANIFEST)) else None

    def leftovers(self, spare: str | None = None) -> list[str]:
        """Interrupted copies and superseded versions: ours to delete. Never the current copy,
        one a rank unit names (keep), or `spare` (see survey)."""
        try:
            names = os.listdir(self.models)
        except OSError:
            return []
        current = self.current()
        out = []
        for name in names:
            path = os.path.join(self.models, name)
            if name.startswith(f".{self.slug}.tmp-") or (
                name.startswith(f".{self.slug}@")
                and path not in (current, spare)
                and path not in self.keep
            ):
                out.append(path)
        return sorted(out)


class Survey(NamedTuple):
    """What the stage tree holds against the source: the one rule `plan` reports and `stage`
    acts on (both call survey)."""

    # The copy SLUG points at and its manifest (None: none complete).
    current: str | None
    staged: dict[str, Any] | None
    # The copy the rank units name: .SLUG@KEY (--key, else the source's digest), and its
    # manifest when it holds the source (then it is no leftover: a stage run switches to it).
    wanted: str
    named: dict[str, Any] | None
    leftovers: list[str]

    @property
    def fresh(self) -> bool:
        """The current copy is the wanted one and holds the source's manifest."""
        return self.named is not None and self.current == self.wanted


def survey(layout: Layout, key: str | None, src: dict[str, Any]) -> Survey:
    current = layout.current()
    wanted = layout.version(key or src["digest"])
    named = read_manifest(wanted)
    if named is not None and named.get("digest") != src["digest"]:
        named = None  # a stale copy under the wanted name: a leftover, replaced by the copy
    spare = wanted if named is not None else None
    return Survey(current, read_manifest(current), wanted, named, layout.leftovers(spare))


def read_manifest(version_dir: str | None) -> dict[str, Any] | None:
    if version_dir is None:
        return None
    try:
        with open(os.path.join(version_dir, MANIFEST)) as fh:
            loaded: dict[str, Any] = json.load(fh)
            return loaded
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------- hashing


def sha256_file(path: str, fd: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path if fd is None else fd, "rb") as fh:
        while block := fh.read(CHUNK // 8):
            h.update(block)
    return h.hexdigest()


def _workers() -> int:
    return max(2, min(8, os.cpu_count() or 2))


def verify_full(source: str, version_dir: str, files: list[dict[str, Any]]) -> list[str]:
    """Files whose staged bytes differ from the source's (hub sha256, else the source file).

    hashlib releases the GIL on large blocks, so threads hash files in parallel.
    """

    def bad(entry: dict[str, Any]) -> str | None:
        rel: str = entry["path"]
        try:
            got = sha256_file(os.path.join(version_dir, rel))
        except OSError:
            return rel
        want = entry.get("sha256") or sha256_file(rel, open_source(source, rel))
        return None if got == want else rel

    with concurrent.futures.ThreadPoolExecutor(_workers()) as pool:
        return sorted(p for p in pool.map(bad, files) if p)


# --------------------------------------------------------------------------------- planning


def plan(
    source: str,
    stage_dir: str,
    slug: str,
    verify: str = "manifest",
    key: str | None = None,
    keep: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What `stage` would do with the same key and keep, without changing anything: its
    leftovers, and up_to_date when it would change nothing (survey: the same rule)."""
    layout = Layout(stage_dir, slug, keep)
    result: dict[str, Any] = {"source": None, "error": None}
    try:
        fd = open_models(stage_dir, create=False)
    except StageError as exc:  # a tree someone else made: refused, never read further
        return {**result, "staged": None, "leftovers": [], "error": str(exc)}
    if fd is not None:
        os.close(fd)
    current = layout.current()
    staged = read_manifest(current)
    result["staged"] = (
        {"digest": staged["digest"], "bytes": staged["bytes"], "files": len(staged["files"])}
        if staged
        else None
    )
    result["current"] = current
    result["hub_revision"] = _read_text(source, HUB_MARKER)
    try:
        src = scan(source)
    except (StageError, OSError) as exc:
        result["error"] = str(exc)
        result["leftovers"] = layout.leftovers()
        result["leftover_bytes"] = freed_bytes(result["leftovers"])
        return result
    seen = survey(layout, key, src)
    result["leftovers"] = seen.leftovers
    # Space the stage run frees before it copies: the plan must not count it as used.
    result["leftover_bytes"] = freed_bytes(seen.leftovers)
    result["source"] = {"digest": src["digest"], "bytes": src["bytes"], "files": len(src["files"])}
    reuse = _reusable(src["files"], staged)
    result["copy_bytes"] = sum(e["size"] for e in src["files"] if _key(e) not in reuse)
    result["changed_files"] = [e["path"] for e in src["files"] if _key(e) not in reuse]
    result["mismatched"] = []
    if staged and current and staged["digest"] == src["digest"] and verify == "full":
        result["mismatched"] = verify_full(source, current, src["files"])
    result["up_to_date"] = seen.fresh and not result["mismatched"] and not seen.leftovers
    return result


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


# --------------------------------------------------------------------------------- staging


class Progress:
    """Bytes, rate and time left, one line every `interval` seconds on stdout."""

    def __init__(self, total: int, interval: float, bwlimit: float | None) -> None:
        self.total = total
        self.done = 0
        self.interval = interval
        self.bwlimit = bwlimit
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.bwlimit:
            # Rate limit: stay behind the schedule a steady bwlimit would keep.
            ahead = done / self.bwlimit - (time.monotonic() - self.started)
            if ahead > 0:
                STOP.wait(ahead)  # a signal ends the wait at once

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (
            f"stage: {self.done / 2**30:.2f}/{self.total / 2**30:.2f} GiB ({pct:.0f}%), "
            f"{rate / 2**20:.0f} MiB/s, {left:.0f}s left"
        )

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            print(self.line(), flush=True)

    def __enter__(self) -> Progress:
        if self.interval > 0 and self.total:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def _copy_file(src: tuple[str, str], dst: str, entry: dict[str, Any], progress: Progress) -> None:
    """Copy src (the source root, the file's path in it) to dst; never through a link."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(open_source(*src), "rb") as fin:
        before = os.fstat(fin.fileno())
        if (before.st_size, before.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
            raise StageError(
                f"source file {os.path.join(*src)} changed since it was scanned; nothing was "
                "switched, re-run when the source is stable",
                EXIT_CHANGED,
            )
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
        try:
            _own(fd)
            offset = 0
            # Rate-limited copies go in small steps, so the rate is smooth and a stop is quick.
            chunk = max(2**20, int(progress.bwlimit / 8)) if progress.bwlimit else CHUNK
            while offset < entry["size"]:
                if STOP.is_set():
                    raise StageError("stopped by a signal; nothing was switched")
                # sendfile copies in the kernel (no user-space buffer), like cp's copy_file_range.
                sent = os.sendfile(fd, fin.fileno(), offset, min(chunk, entry["size"] - offset))
                if sent == 0:
                    break
                offset += sent
                progress.add(sent)
            os.utime(fd, ns=(entry["mtime_ns"], entry["mtime_ns"]))
        finally:
            os.close(fd)
        after = os.fstat(fin.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or (
        offset != entry["size"]
    ):
        raise StageError(
            f"source file {os.path.join(*src)} changed during the copy ({entry['size']} bytes "
            f"expected, {offset} copied, now {after.st_size}); nothing was switched, re-run "
            "when the source is stable",
            EXIT_CHANGED,
        )


def free_bytes(directory: str) -> int:
    """What a copy may still use in directory's filesystem (statvfs)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _own(fd: int) -> None:
    """A staged file: root:GROUP 0640 with --group (else as created, 0644)."""
    if GROUP_ID is not None:
        os.fchown(fd, 0, GROUP_ID)
        os.fchmod(fd, FILE_MODE)


def _own_path(path: str) -> None:
    if GROUP_ID is not None:
        os.chown(path, 0, GROUP_ID, follow_symlinks=False)
        os.chmod(path, FILE_MODE, follow_symlinks=False)


def _own_dir(path: str) -> None:
    if GROUP_ID is None:
        os.chmod(path, 0o755)
    else:
        os.chown(path, 0, GROUP_ID, follow_symlinks=False)
        os.chmod(path, DIR_MODE)


def remove(path: str) -> None:
    """A link or file unlinked, a directory removed with its contents."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _lock(layout: Layout, timeout: float) -> int:
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise StageError(
                    f"another staging run holds {layout.lock} for {timeout:.0f}s"
                ) from None
            if not announced:
                print(f"stage: waiting for another staging run ({layout.lock})", flush=True)
                announced = True
            time.sleep(0.2)  # polling a lock held by another process, within the deadline
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _switch(layout: Layout, version_dir: str) -> None:
    """Point SLUG at a copy: a new symlink renamed over the old one; readers see old or new."""
    link_tmp = f"{layout.final}.new-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link_tmp)
    os.symlink(os.path.basename(version_dir), link_tmp)
    os.rename(link_tmp, layout.final)


def prune(
    stage_dir: str, slug: str, keep: tuple[str, ...], lock_timeout: float = 1800.0
) -> dict[str, Any]:
    """Remove the copies of SLUG no rank unit names (`keep`), once a roll has finished."""
    layout = Layout(stage_dir, slug, keep)
    models_fd = open_models(stage_dir, create=False)  # a tree someone else made: refused
    if models_fd is None:
        return {"changed": False, "removed": []}
    os.close(models_fd)
    lock_fd = _lock(layout, lock_timeout)
    try:
        removed = []
        for name in sorted(os.listdir(layout.models)):
            path = os.path.join(layout.models, name)
            if name.startswith(f".{slug}@") and path not in layout.keep:
                print(f"stage: removing {path} (no unit names it)", flush=True)
                remove(path)
                removed.append(path)
        if os.path.islink(layout.final) and layout.current() is None:
            os.unlink(layout.final)
        return {"changed": bool(removed), "removed": removed}
    finally:
        os.close(lock_fd)


def stage(
    source: str,
    stage_dir: str,
    slug: str,
    mode: str = "beside",
    verify: str = "manifest",
    progress_interval: float = 2.0,
    bwlimit: float | None = None,
    lock_timeout: float = 1800.0,
    key: str | None = None,
    keep: tuple[str, ...] = (),
    measure_free: Callable[[str], int] = free_bytes,
    remove_path: Callable[[str], None] = remove,
    headroom: float = 1.0,
) -> dict[str, Any]:
    """Make SLUG point at a complete, verified copy of source, named .SLUG@KEY (key: what the
    rank units name; the digest when None). Copies named by `keep` are not removed.
    headroom: the free bytes a copied byte needs, the deploy's capacity rule
    (operations/preflight.py STAGE_HEADROOM, passed as --headroom): this script applies it,
    it does not decide its own.
    measure_free (the models directory's free bytes) and remove_path (every removal) are the
    filesystem's: a test passes its own to play a full tmpfs or watch each removal."""
    layout = Layout(stage_dir, slug, keep)
    models_fd = open_models(stage_dir, create=True)  # made or checked: ours, 0755, no link
    if models_fd is not None:
        os.close(models_fd)
    lock_fd = _lock(layout, lock_timeout)
    try:
        return _stage_locked(
            layout,
            source,
            mode,
            verify,
            progress_interval,
            bwlimit,
            key,
            measure_free,
            remove_path,
            headroom,
        )
    finally:
        os.close(lock_fd)


def _stage_locked(
    layout: Layout,
    source: str,
    mode: str,
    verify: str,
    progress_interval: float,
    bwlimit: float | None,
    key: str | None,
    measure_free: Callable[[str], int],
    remove_path: Callable[[str], None],
    headroom: float = 1.0,
) -> dict[str, Any]:
    changed = False
    if os.path.islink(layout.final) and layout.current() is None:
        os.unlink(layout.final)  # points at nothing complete: no model beats a partial one
        changed = True
    src = scan(source)
    seen = survey(layout, key, src)
    # We hold the lock: any temp dir is from a run that died. Superseded versions go too.
    for path in seen.leftovers:
        print(f"stage: removing leftover {path}", flush=True)
        remove_path(path)
        changed = True

    current, staged = seen.current, seen.staged
    if seen.named is not None and current != seen.wanted:
        # The copy the units name (a rank may still serve it) is this source: switch to it.
        _switch(layout, seen.wanted)
        changed = True
        current, staged = seen.wanted, seen.named
        seen = seen._replace(current=current, staged=staged)
    if seen.fresh and current is not None:
        bad = verify_full(source, current, src["files"]) if verify == "full" else []
        if not bad:
            return {"changed": changed, "digest": src["digest"], "bytes": src["bytes"]}
        print(f"stage: {len(bad)} staged file(s) differ from the source: {bad[:5]}", flush=True)
        staged = None  # copy everything again rather than trust a damaged copy

    reuse = _reusable(src["files"], staged)
    copy = [e for e in src["files"] if _key(e) not in reuse]
    copy_bytes = sum(e["size"] for e in copy)
    free = measure_free(layout.models)
    if free < int(copy_bytes * headroom) and mode in ("inplace", "auto") and current:
        print(
            f"stage: {copy_bytes / 2**30:.2f} GiB to copy, {free / 2**30:.2f} GiB free beside "
            f"the current copy: replacing it in place",
            flush=True,
        )
        os.unlink(layout.final)
        remove_path(current)
        for kept in sorted(layout.keep):  # every rank is stopped: no unit needs them now
            remove_path(kept)
        current, reuse = None, set()
        copy = src["files"]
        copy_bytes = src["bytes"]
        free = measure_free(layout.models)
    need = int(copy_bytes * headroom)
    if free < need:
        raise StageError(
            f"model needs {need} bytes ({need / 2**30:.2f} GiB) in "
            f"{layout.models}, {free} bytes ({free / 2**30:.2f} GiB) free; nothing was copied",
            EXIT_REFUSED,
        )

    temp = layout.temp()
    os.mkdir(temp, 0o755)
    try:
        _own_dir(temp)
        # Unchanged files are hard links to the current copy: no bytes, no time.
        for entry in src["files"]:
            if _key(entry) in reuse and current:
                dst = os.path.join(temp, entry["path"])
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.link(os.path.join(current, entry["path"]), dst)
                _own_path(dst)  # a copy staged before --group existed gets it now
        print(
            f"stage: copying {len(copy)} file(s), {copy_bytes / 2**30:.2f} GiB "
            f"({len(src['files']) - len(copy)} unchanged)",
            flush=True,
        )
        with (
            Progress(copy_bytes, progress_interval, bwlimit) as progress,
            concurrent.futures.ThreadPoolExecutor(_workers()) as pool,
        ):
            jobs = [
                pool.submit(
                    _copy_file,
                    (source, e["path"]),
                    os.path.join(temp, e["path"]),
                    e,
                    progress,
                )
                for e in sorted(copy, key=lambda e: -e["size"])
            ]
            for job in concurrent.futures.as_completed(jobs):
                job.result()
        if verify == "full":
            bad = verify_full(source, temp, src["files"])
            if bad:
                raise StageError(f"copied files differ from the source after copy: {bad[:5]}")
        for dirpath, dirnames, _ in os.walk(temp):
            for d in dirnames:
                _own_dir(os.path.join(dirpath, d))
        manifest = {"source": source, "staged_at": time.time(), **src}
        with open(os.path.join(temp, MANIFEST), "w") as fh:
            json.dump(manifest, fh)
        final_version = seen.wanted
        _install(temp, final_version, remove_path)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _switch(layout, final_version)
    for path in layout.leftovers():
        remove_path(path)
    return {
        "changed": True,
        "digest": src["digest"],
        "bytes": src["bytes"],
        "copied_bytes": copy_bytes,
        "copied_files": len(copy),
    }


# --------------------------------------------------------------------------------- hub


def fetch_hub(cli: str, repo: str, revision: str, dest: str, token_file: str | None) -> bool:
    """Download repo@revision into dest with the hub's own CLI, once. True when it downloaded."""
    marker = os.path.join(dest, HUB_MARKER)
    if _read_text(dest, HUB_MARKER) == revision:
        return False
    os.makedirs(dest, mode=0o750, exist_ok=True)
    os.chmod(dest, 0o750)  # the hub cache is read by root's staging run only
    env = dict(os.environ)
    if token_file:
        # The token reaches the CLI through its environment only: never argv, never a log.
        env["HF_TOKEN"] = _read_text(*os.path.split(token_file)) or ""
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    argv = [cli, "download", repo, "--revision", revision, "--local-dir", dest]
    print(f"stage: downloading {repo}@{revision} into {dest}", flush=True)
    try:
        proc = subprocess.run(argv, env=env, check=False)
    except OSError as exc:
        raise StageError(f"cannot run the hub CLI {cli}: {exc.strerror}", EXIT_REFUSED) from None
    if proc.returncode != 0:
        raise StageError(f"{cli} download {repo}@{revision} failed (exit {proc.returncode})")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    temp = f"{marker}.tmp-{os.getpid()}"
    with open(temp, "w") as fh:
        fh.write(revision + "\n")
    os.rename(temp, marker)
    return True


# --------------------------------------------------------------------------------- CLI


def _may_chown() -> bool:
    """Whether this process holds CAP_CHOWN (capability 0) in its effective set."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _raise_exit(signum: int, frame: object) -> None:
    STOP.set()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stage_model.py", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("scan")
    p.add_argument("source")
    p = sub.add_parser("plan")
    for name in ("source", "stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--verify", choices=["manifest", "full"], default="manifest")
    p.add_argument("--key", help="the copy's name, .SLUG@KEY (default: its digest)")
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("stage")
    for name in ("source", "stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--mode", choices=["beside", "inplace", "auto"], default="beside")
    p.add_argument("--verify", choices=["manifest", "full"], default="manifest")
    p.add_argument("--progress-interval", type=float, default=2.0)
    p.add_argument("--bwlimit-mbps", type=float, default=None)
    p.add_argument("--lock-timeout", type=float, default=1800.0)
    p.add_argument(
        "--headroom", type=float, default=1.0, help="free bytes a copied byte needs (the plan's)"
    )
    p.add_argument("--group", help="the servers' group: copies are root:GROUP 0750/0640")
    p.add_argument("--key", help="the copy's name, .SLUG@KEY (default: its digest)")
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("prune")
    for name in ("stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("fetch-hub")
    p.add_argument("--cli", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--token-file")
    args = parser.parse_args(argv)
    group = getattr(args, "group", None)
    if group and not _may_chown():
        # A unit whose capability bounding set lacks CAP_CHOWN: the servers must still read
        # the copy, so it is staged as before (world-readable) rather than not at all.
        print(f"stage: warning: no CAP_CHOWN, the copy cannot be given to group {group!r}")
        group = None
    if args.cmd == "fetch-hub" or group:
        # Nothing made here is for other users: the hub cache, manifests, copies (the servers
        # read those through their group).
        os.umask(0o027)
    if group:
        global GROUP_ID
        try:
            import grp

            GROUP_ID = grp.getgrnam(group).gr_gid
        except KeyError:
            print(f"stage: error: group {group!r} does not exist", file=sys.stderr)
            return EXIT_REFUSED
    # A stop (systemctl stop, the deploy's SSH session closing) unwinds like an exception, so
    # the copy in progress is removed on the way out; SIGKILL leaves it for the next run.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    try:
        if args.cmd == "scan":
            out: dict[str, Any] = scan(args.source)
            out = {k: out[k] for k in ("digest", "bytes")} | {"files": len(out["files"])}
        elif args.cmd == "plan":
            out = plan(
                args.source, args.stage_dir, args.slug, args.verify, args.key, tuple(args.keep)
            )
        elif args.cmd == "stage":
            bw = args.bwlimit_mbps * 1e6 if args.bwlimit_mbps else None
            out = stage(
                args.source,
                args.stage_dir,
                args.slug,
                args.mode,
                args.verify,
                args.progress_interval,
                bw,
                args.lock_timeout,
                args.key,
                tuple(args.keep),
                headroom=args.headroom,
            )
        elif args.cmd == "prune":
            out = prune(args.stage_dir, args.slug, tuple(args.keep))
        else:
            downloaded = fetch_hub(args.cli, args.repo, args.revision, args.dest, args.token_file)
            out = {"changed": downloaded}
    except StageError as exc:
        print(f"stage: error: {exc}", file=sys.stderr, flush=True)
        return exc.code
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            print(
                f"stage: error: {exc.filename}: no space left; nothing was switched",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        print(f"stage: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
