"""The staging script's tree (programs/stage_model.py, which the host gets with this inlined:
operations/render/host_scripts.py): STAGE_DIR/models made and checked, its copies (Layout), which
are leftovers (survey: the one rule plan and stage share), the lock, the switch and the prune."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Callable
from typing import NamedTuple, TypedDict

from operations.programs.stage_manifest import (
    EXIT_REFUSED,
    MANIFEST,
    NOFOLLOW,
    Manifest,
    Scan,
    StageError,
    read_manifest,
)

MODELS_MODE = 0o755  # STAGE_DIR/models: root's, listable, nobody else writes in it


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
    staged: Manifest | None
    # The copy the rank units name: .SLUG@KEY (--key, else the source's digest), and its
    # manifest when it holds the source (then it is no leftover: a stage run switches to it).
    wanted: str
    named: Manifest | None
    leftovers: list[str]

    @property
    def fresh(self) -> bool:
        """The current copy is the wanted one and holds the source's manifest."""
        return self.named is not None and self.current == self.wanted


def survey(layout: Layout, key: str | None, src: Scan) -> Survey:
    current = layout.current()
    wanted = layout.version(key or src["digest"])
    named = read_manifest(wanted)
    if named is not None and named.get("digest") != src["digest"]:
        named = None  # a stale copy under the wanted name: a leftover, replaced by the copy
    spare = wanted if named is not None else None
    return Survey(current, read_manifest(current), wanted, named, layout.leftovers(spare))


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


class Pruned(TypedDict):
    """`prune`'s answer (stage_model.py prints it as JSON)."""

    changed: bool
    removed: list[str]  # the copies removed


def prune(stage_dir: str, slug: str, keep: tuple[str, ...], lock_timeout: float = 1800.0) -> Pruned:
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
