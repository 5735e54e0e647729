"""The staging script's source side (programs/stage_model.py, which the host gets with this
inlined: operations/render/host_scripts.py): a model directory's manifest, read by stat only, its
files opened by the one link rule (resolve), and a staged copy's manifest read back.

The link rule (docs/how-it-works/model.md, "Hugging Face cache snapshots and links in the source"):
a link in the source is resolved here,
component by component (readlink, never the kernel's following), inside the source's root: the
source itself, or for a Hugging Face cache snapshot (models--ORG--NAME/snapshots/REV, where every
file is a relative link into ../../blobs/) the repository's cache folder. A link that resolves
inside the root to a regular file is staged as a regular file with that content; one that leaves
the root, resolves to anything else (a directory, a FIFO, a device), dangles or loops is refused
naming the link. Every component is opened with O_NOFOLLOW from its parent's descriptor, so a
link swapped in after the check is refused too, and nothing outside the root is ever opened."""

from __future__ import annotations

import errno
import os
import stat

from operations.programs.tokenizer_files import tokenizer_files

# typing only for the checker: importing it costs the ModelSource fact (stage_source.py, every
# deploy) more than its scan (~40 ms on the 2-core testbed); mypy takes the name as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NotRequired, TypedDict

    class FileEntry(TypedDict):
        """One served file of a manifest (entries); a manifest's digest covers each one."""

        path: str  # below the source (or the copy)
        size: int
        mtime_ns: int
        sha256: NotRequired[str]  # the hub's LFS sha256, while its metadata is trustworthy

    class Scan(TypedDict):
        """A source's manifest (scan): its files, their bytes and their digest."""

        files: list[FileEntry]
        bytes: int
        digest: str

    class Manifest(Scan):
        """A staged copy's MANIFEST (stage_run.stage writes it): the scan it was copied from."""

        source: str
        staged_at: float  # time.time() when it was written

    # An entry as the copies compare it: (path, size, mtime_ns, sha256 or "").
    Key = tuple[str, int, int, str]
else:
    # What the checker reads above, plain dicts when the script runs: the other parts import
    # these names (host_scripts.py inlines this module whole, both branches bind them).
    FileEntry = Scan = Manifest = dict
    Key = tuple

MANIFEST = ".staged-manifest.json"
# The hub's --local-dir metadata and our download marker live in .cache; never served.
SKIP_DIRS = {".cache", ".git"}
HUB_MARKER = ".cache/sglang-hub-complete"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# A Hugging Face cache: models--ORG--NAME/snapshots/REV/FILE, each FILE a relative link to
# ../../blobs/ETAG (huggingface_hub 0.34.4 file_download.py: repo_folder_name, line 775;
# blob_path, line 1124; _get_pointer_path, line 1806; _create_symlink's os.path.relpath,
# line 704). Its links resolve inside the repository's folder, two levels above the snapshot.
HUB_REPO_PREFIX = "models--"
HUB_SNAPSHOTS = "snapshots"
# Linux's MAXSYMLINKS (include/linux/namei.h): a longer chain of links is taken as a loop.
MAX_LINKS = 40
# The ModelSource fact's answer (stage_source.py): the config.json lines follow it.
CONFIG_MARKER = "@@config.json"
# describe's line before the scan's refusal (a link it will not follow, an unreadable file).
SCAN_ERROR_MARKER = "@@scan-error"
# describe's line naming the tokenizer files at the top of the source (programs/
# tokenizer_files.py), after the size; absent when the scan refused.
TOKENIZER_MARKER = "@@tokenizer"
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


def hub_commit(root: str) -> str | None:
    """The commit the hub CLI resolved the revision to, as its --local-dir metadata of
    config.json records it (huggingface_hub's `.cache/huggingface/download/F.metadata`: the
    commit, the etag, the time); None when absent or not a 40-hex commit."""
    text = _read_text(
        root, os.path.join(".cache", "huggingface", "download", "config.json.metadata")
    )
    commit = text.splitlines()[0].strip() if text else ""
    hexdigits = "0123456789abcdef"
    return commit if len(commit) == 40 and all(c in hexdigits for c in commit) else None


def entries(root: str) -> list[FileEntry]:
    """Every served file under root with size and mtime (stat only: never reads contents); a
    link by the link rule (what it resolves to), or refused (StageError)."""
    if not os.path.isdir(root):
        raise StageError(f"model source {root}: no such directory", EXIT_REFUSED)
    if not os.access(root, os.R_OK | os.X_OK):
        raise StageError(f"model source {root}: not readable", EXIT_REFUSED)
    files: list[FileEntry] = []
    anchor = link_root(root)

    def walk_error(exc: OSError) -> None:
        raise StageError(f"model source: cannot read {exc.filename}: {exc.strerror}", EXIT_REFUSED)

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        dirnames.sort()
        for name in dirnames:  # os.walk lists a link to a directory as a dirname
            if os.path.islink(os.path.join(dirpath, name)):
                # Refused by the rule (a link to a directory), naming the link.
                _resolve(root, os.path.relpath(os.path.join(dirpath, name), root), anchor)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel == MANIFEST:
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                # The file it resolves to (or refused by name): its size and mtime are the
                # content's, so a snapshot and the same files copied plainly have one digest.
                st = _resolve(root, rel, anchor)[1]
            elif not stat.S_ISREG(st.st_mode):
                continue  # a FIFO, socket or device node is no weight file
            elif not os.access(full, os.R_OK):
                raise StageError(f"model source: {full} is not readable", EXIT_REFUSED)
            entry: FileEntry = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            sha = _hub_sha256(root, rel, st.st_mtime_ns)
            if sha:
                entry["sha256"] = sha
            files.append(entry)
    files.sort(key=lambda e: e["path"])
    return files


def scan(root: str) -> Scan:
    """Every served file under root with size and mtime (stat only: never reads contents), their
    bytes and the manifest's digest."""
    files = entries(root)
    return {"files": files, "bytes": sum(e["size"] for e in files), "digest": digest(files)}


def link_root(source: str) -> tuple[str, tuple[str, ...]]:
    """The root the links under `source` may resolve within, and source's own path below it:
    for a Hugging Face cache snapshot (detected by its layout, models--ORG--NAME/snapshots/REV)
    the repository's folder and ("snapshots", REV); else source itself and (). The path of
    source itself is the operator's, followed as ever; nothing below it is."""
    real = os.path.realpath(source)
    snapshots, revision = os.path.split(real)
    repo, name = os.path.split(snapshots)
    if name == HUB_SNAPSHOTS and revision and os.path.basename(repo).startswith(HUB_REPO_PREFIX):
        return repo, (HUB_SNAPSHOTS, revision)
    return source, ()


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse_link(link: str, target: str, why: str) -> StageError:
    """The refusal of a link by the rule, naming it: never followed."""
    return StageError(
        f"model source: {link} is a symbolic link (to {target}) {why}; the staging copy follows "
        "a link only to a regular file inside the source (a hub snapshot: inside its "
        "models--ORG--NAME folder): replace it with the file itself",
        EXIT_REFUSED,
    )


def _resolve(
    source: str,
    rel: str,
    anchor: tuple[str, tuple[str, ...]] | None = None,
    want_fd: bool = False,
) -> tuple[int | None, os.stat_result]:
    """The regular file source/rel resolves to by the link rule (the module's docstring): its
    stat, and with want_fd a read-only descriptor of it. Walked from the root's descriptor one
    component at a time: each is lstat-ed and opened with O_NOFOLLOW relative to its parent's
    descriptor, a link is read (readlink) and its target walked the same way, `..` goes back
    up the components walked (never above the root). A link that leaves the root, resolves to
    anything but a regular file, dangles or loops raises StageError naming the link."""
    root, prefix = anchor or link_root(source)
    todo = [*prefix, *rel.split("/")]
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    names: list[str] = []  # the components fds[1:] hold, below root
    link: tuple[str, str] | None = None  # the first link met (its path, its target)
    hops = 0

    def refuse(why: str) -> StageError:
        assert link is not None
        return _refuse_link(link[0], link[1], why)

    try:
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            here = os.path.join(root, *names, part)
            if part == "..":
                if not names:
                    if link is None:
                        raise StageError(f"model source: {os.path.join(source, rel)}: no such file")
                    raise refuse(f"that leaves {root}")
                os.close(fds.pop())
                names.pop()
                continue
            try:
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                if link is not None:
                    raise refuse(f"that dangles: {here} does not exist") from None
                raise
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(part, dir_fd=fds[-1])
                if link is None:
                    link = (here, target)
                hops += 1
                if hops > MAX_LINKS:
                    raise refuse(f"in a loop (more than {MAX_LINKS} links)")
                if os.path.isabs(target):
                    # Only an absolute target spelled under the root (as named, or its real
                    # path): the rest is walked again from the root's descriptor.
                    spellings = {os.path.abspath(root), os.path.realpath(root)}
                    inside = [p.rstrip("/") + "/" for p in spellings]
                    under = [p for p in inside if target.startswith(p)]
                    if not under:
                        raise refuse(f"that leaves {root}")
                    while len(fds) > 1:
                        os.close(fds.pop())
                    names.clear()
                    target = target[len(under[0]) :]
                todo[:0] = target.split("/")
                continue
            if todo:
                if not stat.S_ISDIR(st.st_mode):
                    if link is not None:
                        raise refuse(f"through {here}, which is not a directory")
                    raise StageError(f"model source: {here} is not a directory", EXIT_REFUSED)
                try:
                    fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fds[-1])
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _changed(here) from None
                    raise
                fds.append(fd)
                names.append(part)
                continue
            if not stat.S_ISREG(st.st_mode):
                if link is not None:
                    raise refuse(f"that resolves to {here}, {_kind(st.st_mode)}")
                raise StageError(f"model source: {here} is {_kind(st.st_mode)}", EXIT_REFUSED)
            if not want_fd:
                return None, st
            try:
                fd = os.open(part, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1])
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _changed(here) from None
                raise
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
                os.close(fd)
                raise _changed(here)
            return fd, now
        raise StageError(f"model source: {os.path.join(source, rel)} is not a file", EXIT_REFUSED)
    finally:
        for fd in fds:
            os.close(fd)


def _changed(path: str) -> StageError:
    return StageError(
        f"model source: {path} was replaced (by a link?) while it was opened; nothing was "
        "switched, re-run when the source is stable",
        EXIT_CHANGED,
    )


def open_source(root: str, rel: str) -> int:
    """A read-only descriptor of the regular file root/rel resolves to by the link rule
    (_resolve): a link that breaks it is refused with its path (StageError), never followed,
    even one that replaced a checked file after the scan."""
    fd, _ = _resolve(root, rel, want_fd=True)
    assert fd is not None
    return fd


def describe(source: str) -> list[str]:
    """The ModelSource fact's answer (operations/facts/host.py parse_model): "exists", the
    bytes a stage run would take (blank when the scan refuses, and then SCAN_ERROR_MARKER and
    why: preflight names it), TOKENIZER_MARKER and the tokenizer files the scan found, and
    config.json by the link rule; "missing" when source is no directory."""
    if not os.path.isdir(source):
        return ["missing"]
    refused: list[str] = []
    try:
        found = entries(source)
        size = str(sum(e["size"] for e in found))
        tokenizer = [" ".join([TOKENIZER_MARKER, *tokenizer_files([e["path"] for e in found])])]
    except (StageError, OSError) as exc:
        size, tokenizer = "", []
        refused = [SCAN_ERROR_MARKER, " ".join(str(exc).split())]
    lines = ["exists", size, *refused, *tokenizer]
    config = _read_text(source, "config.json")
    if config is not None:
        lines += [CONFIG_MARKER, *config.splitlines()]
    return lines


def _key(entry: FileEntry) -> Key:
    return (entry["path"], entry["size"], entry["mtime_ns"], entry.get("sha256", ""))


def digest(files: list[FileEntry]) -> str:
    # Imported here (and in read_manifest): the ModelSource fact (stage_source.py, every
    # deploy) needs neither, and json with re costs it ~25 ms a run.
    import hashlib
    import json

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


def _reusable(files: list[FileEntry], staged: Scan | None) -> set[Key]:
    """Entries the current copy already holds byte-identical (same path, size, mtime, hash)."""
    if not staged:
        return set()
    have = {_key(e) for e in staged["files"]}
    return {_key(e) for e in files if _key(e) in have}


def read_manifest(version_dir: str | None) -> Manifest | None:
    if version_dir is None:
        return None
    import json

    try:
        with open(os.path.join(version_dir, MANIFEST)) as fh:
            loaded: Manifest = json.load(fh)
            return loaded
    except (OSError, ValueError):
        return None
