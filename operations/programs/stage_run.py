"""The staging script's run (programs/stage_model.py, which the host gets with this inlined:
operations/render/host_scripts.py): `plan`, what a stage run would do (the ModelStaging fact), and
`stage`, the run: leftovers removed, what changed copied beside (or in place), verified,
switched to."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from typing import NamedTuple, Required, TypedDict

from operations.programs.stage_copy import (
    Progress,
    _copy_file,
    _own_dir,
    _own_path,
    _workers,
    free_bytes,
    verify_full,
)
from operations.programs.stage_manifest import (
    EXIT_REFUSED,
    HUB_MARKER,
    MANIFEST,
    FileEntry,
    Key,
    Manifest,
    Scan,
    StageError,
    _key,
    _read_text,
    _reusable,
    hub_commit,
    read_manifest,
    scan,
)
from operations.programs.stage_tree import (
    Layout,
    Survey,
    _install,
    _lock,
    _switch,
    freed_bytes,
    open_models,
    remove,
    survey,
)


class Summary(TypedDict):
    """A manifest in three numbers (a plan's source and staged copy, `scan`'s answer)."""

    digest: str
    bytes: int
    files: int


class Plan(TypedDict, total=False):
    """`plan`'s answer (stage_model.py prints it as JSON; the ModelStaging fact parses it,
    operations/facts/model.py parse_staging). A refusal or an unreadable source answers only
    what was known by then."""

    source: Required[Summary | None]  # None: the source could not be scanned (error says why)
    error: Required[str | None]
    staged: Summary | None  # the current copy's manifest; None: no complete copy
    leftovers: list[str]  # what a stage run removes first
    current: str | None  # the copy SLUG points at
    hub_revision: str | None  # the hub download marker's revision (hf:// sources)
    hub_commit: str | None  # the commit the hub resolved it to (its metadata of config.json)
    leftover_bytes: int  # what removing the leftovers frees
    copy_bytes: int  # what a stage run would copy
    changed_files: list[str]
    mismatched: list[str]  # verify full: staged files whose bytes differ from the source's
    up_to_date: bool  # a stage run would change nothing


class Staged(TypedDict, total=False):
    """`stage`'s answer (stage_model.py prints it as JSON); the copied_* keys when it copied."""

    changed: Required[bool]
    digest: Required[str]
    bytes: Required[int]
    copied_bytes: int
    copied_files: int


def plan(
    source: str,
    stage_dir: str,
    slug: str,
    verify: str = "manifest",
    key: str | None = None,
    keep: tuple[str, ...] = (),
) -> Plan:
    """What `stage` would do with the same key and keep, without changing anything: its
    leftovers, and up_to_date when it would change nothing (survey: the same rule)."""
    layout = Layout(stage_dir, slug, keep)
    result: Plan = {"source": None, "error": None}
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
    result["hub_commit"] = hub_commit(source)
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
) -> Staged:
    """Make SLUG point at a complete, verified copy of source, named .SLUG@KEY (key: what the
    rank units name; the digest when None). Copies named by `keep` are not removed.
    headroom: the free bytes a copied byte needs, the deploy's capacity rule
    (operations/plan/capacity.py STAGE_HEADROOM, passed as --headroom): this script applies it,
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
) -> Staged:
    """The run, under the lock: tidy up, keep a fresh copy, or copy what changed and switch."""
    src = scan(source)
    seen, changed = _tidy(layout, key, src, remove_path)
    current, staged = seen.current, seen.staged
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
        _replace_in_place(layout, current, copy_bytes, free, remove_path)
        current, reuse = None, set()
        copy, copy_bytes = src["files"], src["bytes"]
        free = measure_free(layout.models)
    need = int(copy_bytes * headroom)
    if free < need:
        raise StageError(
            f"model needs {need} bytes ({need / 2**30:.2f} GiB) in "
            f"{layout.models}, {free} bytes ({free / 2**30:.2f} GiB) free; nothing was copied",
            EXIT_REFUSED,
        )
    new = _Copy(source, src, current, reuse, copy, copy_bytes)
    _build(layout, new, verify, progress_interval, bwlimit, seen.wanted, remove_path)
    _switch(layout, seen.wanted)
    for path in layout.leftovers():
        remove_path(path)
    return {
        "changed": True,
        "digest": src["digest"],
        "bytes": src["bytes"],
        "copied_bytes": copy_bytes,
        "copied_files": len(copy),
    }


def _tidy(
    layout: Layout, key: str | None, src: Scan, remove_path: Callable[[str], None]
) -> tuple[Survey, bool]:
    """A link to nothing complete unlinked, leftovers removed, and SLUG switched to the copy
    the units name when it is this source's: what is there then, and whether anything changed."""
    changed = False
    if os.path.islink(layout.final) and layout.current() is None:
        os.unlink(layout.final)  # points at nothing complete: no model beats a partial one
        changed = True
    seen = survey(layout, key, src)
    # We hold the lock: any temp dir is from a run that died. Superseded versions go too.
    for path in seen.leftovers:
        print(f"stage: removing leftover {path}", flush=True)
        remove_path(path)
        changed = True
    if seen.named is not None and seen.current != seen.wanted:
        # The copy the units name (a rank may still serve it) is this source: switch to it.
        _switch(layout, seen.wanted)
        changed = True
        seen = seen._replace(current=seen.wanted, staged=seen.named)
    return seen, changed


def _replace_in_place(
    layout: Layout, current: str, copy_bytes: int, free: int, remove_path: Callable[[str], None]
) -> None:
    """Too little room beside the current copy (--mode inplace or auto: every rank is
    stopped): it goes, with the copies kept for the units, before the whole source is copied."""
    print(
        f"stage: {copy_bytes / 2**30:.2f} GiB to copy, {free / 2**30:.2f} GiB free beside "
        f"the current copy: replacing it in place",
        flush=True,
    )
    os.unlink(layout.final)
    remove_path(current)
    for kept in sorted(layout.keep):  # every rank is stopped: no unit needs them now
        remove_path(kept)


class _Copy(NamedTuple):
    """What a new copy is made of: the source and its scan, the current copy whose unchanged
    files (`reuse`) are linked, and the files to copy."""

    source: str
    src: Scan
    current: str | None
    reuse: set[Key]
    files: list[FileEntry]
    bytes: int


def _build(
    layout: Layout,
    new: _Copy,
    verify: str,
    progress_interval: float,
    bwlimit: float | None,
    version: str,
    remove_path: Callable[[str], None],
) -> None:
    """The new copy, complete and verified, installed as `version`: unchanged files linked
    from the current copy, the others copied; a failure removes what was made."""
    source, src, current, reuse, copy, copy_bytes = new
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
        import concurrent.futures  # a copy's only: see stage_copy.verify_full

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
        manifest: Manifest = {"source": source, "staged_at": time.time(), **src}
        with open(os.path.join(temp, MANIFEST), "w") as fh:
            json.dump(manifest, fh)
        _install(temp, version, remove_path)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
