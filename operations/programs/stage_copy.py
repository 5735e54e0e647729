"""The staging script's copy (programs/stage_model.py, which the host gets with this inlined:
operations/render/host_scripts.py): files copied in the kernel with progress and a rate limit, given
to the servers' group, and verified by sha256."""

from __future__ import annotations

import hashlib
import os
import threading
import time

from operations.programs.stage_manifest import (
    EXIT_CHANGED,
    NOFOLLOW,
    FileEntry,
    StageError,
    open_source,
)

CHUNK = 64 * 1024 * 1024
# With --group (the servers' group), copies are root:GROUP, dirs 0750, files 0640: the servers
# read the weights, other users on the host do not. Set once by main().
DIR_MODE, FILE_MODE = 0o750, 0o640
GROUP_ID: int | None = None
# Set by SIGTERM/SIGHUP: copy threads stop at their next chunk, so the temp copy goes at once.
STOP = threading.Event()


def set_group(gid: int | None) -> None:
    """The servers' group every staged file and directory gets (main, from --group)."""
    global GROUP_ID
    GROUP_ID = gid


def sha256_file(path: str, fd: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path if fd is None else fd, "rb") as fh:
        while block := fh.read(CHUNK // 8):
            h.update(block)
    return h.hexdigest()


def _workers() -> int:
    return max(2, min(8, os.cpu_count() or 2))


def verify_full(source: str, version_dir: str, files: list[FileEntry]) -> list[str]:
    """Files whose staged bytes differ from the source's (hub sha256, else the source file).

    hashlib releases the GIL on large blocks, so threads hash files in parallel.
    """

    def bad(entry: FileEntry) -> str | None:
        rel = entry["path"]
        try:
            got = sha256_file(os.path.join(version_dir, rel))
        except OSError:
            return rel
        want = entry.get("sha256") or sha256_file(rel, open_source(source, rel))
        return None if got == want else rel

    # Imported here: the plan (the ModelStaging fact, every deploy) hashes nothing unless
    # model_verify is full, and concurrent.futures brings logging with it (~5 ms a run).
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(_workers()) as pool:
        return sorted(p for p in pool.map(bad, files) if p)


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


def _copy_file(src: tuple[str, str], dst: str, entry: FileEntry, progress: Progress) -> None:
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
