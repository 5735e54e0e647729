"""The one writer of files on the host: units, shipped scripts, locks, and files with a secret.

    from operations.steps.host_files import put_file

    put_file(
        name="Serve: API key file",
        src="api-key: \"...\"\\n",       # the content (str or bytes), or a Path on the controller
        dest="/etc/sglang/secrets.yaml",
        owner="root", group="sglang", mode="640",
        dir_mode="750", dir_group="sglang",
        secret=True,                     # see below
    )
    put_planned(plan.unit)   # the plan's file: its facts read the digest, no round trip

What every file gets, whoever connects (root, or a user with `_sudo=True`):

- its final owner, group and mode before its first byte: a fresh temp file is made by `mktemp`
  (mode 600, root, under umask 077) in the destination's directory, chowned and chmodded, and
  only then is the content written into it; a rename puts it in place, so readers (systemd, a
  rank) see the old file or the new one, never a part;
- the content reaches the host base64-encoded on the command's stdin: it never appears in a
  command line, a log, a diff or an error, and no SFTP temp file lands in /tmp (which a sudo
  upload would need, and which another user could have prepared);
- the temp name is unique per write (`mktemp`), and a failed write removes its temp file; a
  write killed before it could (the controller killed, the SSH session dropped) leaves it,
  and the next write of that file removes it first (a root-owned plain file named
  `.NAME.XXXXXXXXXX` beside it: only root can have made it);
- the content is renamed into place only when all of it arrived (its byte count checked):
  a stdin cut short by a dropped connection still decodes, and is never trusted;
- no change when the host already has it: sha256, mode, owner and group compared (only the
  sha256 when the plan's facts read it: write_planned), never the content;
- a destination (or directory) that is a symlink or not a plain file is refused, not followed.

`secret=True` adds what a secret needs: the FileAt fact is always read (so a file made
world-readable is rewritten), and the directory's mode, owner root and group are enforced on
every run, not only when it is created. Without it an existing
directory is never changed (it may be /etc/systemd/system).

One mode per operation: put_file always reads the FileAt fact (as pyinfra's files.put reads
its own); write_planned gets the plan's PlannedFile, whose digest the plan's facts read (a
bulk fact: a converged run makes no round trip per file), and asks nothing. put_planned picks
by what the plan holds; an operation that writes a file it knows to be new `yield from`s
new_file.

+ src: the content (str is written as UTF-8), or a pathlib.Path of a file on the controller
+ dest: the absolute path on the target
+ owner/group/mode: the file's (mode in octal digits, "600")
+ dir_mode: the directory's mode when it is created (or, for a secret, enforced); owner root
+ dir_group: the directory's group (default: root)
+ secret: the content is a secret (see above)
"""

from __future__ import annotations

import base64
import shlex
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.context import state as run_state
from pyinfra.facts.files import FileContents

from operations.facts.files import FileAt, PathState
from operations.plan.planned_files import PlannedFile, sha256
from operations.runtime.host_call import Commands
from operations.runtime.pyinfra_internals import color_diff


def _same_mode(found: str, want: str) -> bool:
    try:
        return int(found, 8) == int(want, 8)
    except ValueError:
        return False


def _matches(state: PathState | None, kind: str, mode: str, owner: str, group: str) -> bool:
    return (
        state is not None
        and state["type"] == kind
        and _same_mode(state["mode"], mode)
        and (state["owner"], state["group"]) == (owner, group)
    )


def _directory_command(directory: str, mode: str, group: str, enforce: bool) -> StringCommand:
    # install -d creates it (parents root-only under umask 077) or, enforced, fixes its mode
    # and owners; not enforced, an existing directory is left exactly as it is.
    words: list[Any] = ["install", "-d", "-m", mode, "-o", "root", "-g", QuoteString(group)]
    words.append(QuoteString(directory))
    if enforce:
        return StringCommand("umask 077 &&", *words)
    return StringCommand("[ -d", QuoteString(directory), "] || { umask 077 &&", *words, "; }")


# mktemp's template replaces these with as many letters and digits (coreutils mktemp(1)).
TEMP_SUFFIX = "XXXXXXXXXX"


def _glob_escaped(text: str) -> str:
    """`text` as a literal in a find(1) -name pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def temp_pattern(dest: str) -> str:
    """What the temp files of `dest`'s writes are named, as a find(1) -name pattern: mktemp's
    template with each X one character (`?`)."""
    name = dest.rsplit("/", 1)[1]
    return _glob_escaped(f".{name}.") + "?" * len(TEMP_SUFFIX)


def _write_script(dest: str, owner: str, group: str, mode: str, size: int) -> str:
    directory, name = dest.rsplit("/", 1)
    directory = directory or "/"
    q = shlex.quote
    template = f"{directory}/.{name}.{TEMP_SUFFIX}"
    return (
        "set -e; umask 077; "
        # A run killed mid-write left its temp file (the trap never ran): ours only, i.e. a
        # plain file with this write's temp name, made by root (no other user can make one
        # owned by root), right in the directory. Links and other users' files stay.
        f"find {q(directory)} -maxdepth 1 -name {q(temp_pattern(dest))} -type f -user 0 -delete; "
        f"tmp=$(mktemp {q(template)}); "
        "trap 'rm -f \"$tmp\"' EXIT; "
        f'chown {q(owner + ":" + group)} "$tmp"; chmod {q(mode)} "$tmp"; '
        # Only now, with its final owner and mode, does the file get its first byte.
        'base64 -d > "$tmp"; '
        # A stdin cut short (the controller killed mid-send) still decodes: never rename a part.
        f'test "$(wc -c < "$tmp")" -eq {size}; '
        f'mv -f "$tmp" {q(dest)}; trap - EXIT'
    )


def _old_lines(dest: str) -> list[str]:
    """dest's lines now, for a diff (the FileContents fact, in the operation that writes it)."""
    return [line + "\n" for line in host.get_fact(FileContents, path=dest) or []]


def _show_diff(dest: str, data: bytes, current: list[str] | None, secret: bool) -> None:
    """Under `--diff`, what a write changes, as pyinfra's files.put shows it: the lines of a
    unit, a script or a config (none holds a secret). A secret is named, never shown.
    `current`: dest's lines now (None: absent; a secret's are not read)."""
    verb = "modify" if current is not None else "create"
    if secret:
        logger.info(f"{host.print_prefix}Will {verb} {dest} (a secret: its content is not shown)")
        return
    try:
        desired = data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        logger.info(f"{host.print_prefix}Will {verb} {dest} (binary content)")
        return
    logger.info(f"{host.print_prefix}Will {verb} {dest}")
    for line in color_diff(current or [], desired):
        logger.info("  %s", line)
    logger.info("")


def _refuse_links(directory: str, dest: str, found_dir: PathState | None,
                  found_file: PathState | None, what_file: str) -> None:  # fmt: skip
    for what, state, kind in ((directory, found_dir, "directory"), (dest, found_file, "file")):
        if state is not None and state["type"] != kind:
            raise OperationError(
                f"{what} is a {state['type']}, not a plain {kind}: refusing to write "
                f"{what_file} through it; remove it and run again"
            )


def _writes(
    data: bytes,
    dest: str,
    owner: str,
    group: str,
    mode: str,
    dir_mode: str,
    dir_group: str,
) -> Commands:
    """The commands that write `data` to dest (its directory made when missing, never
    changed); for an operation that knows dest changes."""
    yield _directory_command(dest.rsplit("/", 1)[0] or "/", dir_mode, dir_group, enforce=False)
    yield _write_command(data, dest, owner, group, mode)


def _write_command(data: bytes, dest: str, owner: str, group: str, mode: str) -> StringCommand:
    return StringCommand(
        "sh",
        "-c",
        QuoteString(_write_script(dest, owner, group, mode, len(data))),
        _stdin=base64.b64encode(data).decode(),
    )


def _check_dest(dest: str) -> None:
    if not dest.startswith("/") or dest.endswith("/"):
        raise OperationError(f"put_file: dest must be an absolute file path, got {dest!r}")


def content_bytes(src: str | bytes | Path) -> bytes:
    """The bytes to write: src's own, or a controller file's (a pathlib.Path)."""
    if isinstance(src, Path):
        return src.expanduser().read_bytes()
    return src.encode() if isinstance(src, str) else src


@operation()
def put_file(
    src: str | bytes | Path,
    dest: str,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
    dir_mode: str = "755",
    dir_group: str = "root",
    secret: bool = False,
) -> Commands:
    """
    Write a file: final owner and mode before the first byte, content never shown, unique temp
    name, links refused; no change when it is already there (the FileAt fact: sha256, mode,
    owners). See the module's docstring.

    + src: the content (str or bytes), or a pathlib.Path of a file on the controller
    + dest: absolute path on the target
    + owner/group/mode: the file's owner, group and octal mode
    + dir_mode: the directory's octal mode (owner root), when created or (secret) every run
    + dir_group: the directory's group
    + secret: compare mode and owners, enforce the directory, never show the content
    """
    _check_dest(dest)
    data = content_bytes(src)
    digest = sha256(data)
    directory = dest.rsplit("/", 1)[0] or "/"
    state = host.get_fact(FileAt, path=dest)
    found_dir, found_file = state["dir"], state["file"]
    _refuse_links(directory, dest, found_dir, found_file, "a secret" if secret else "a file")
    if secret:
        dir_ok = _matches(found_dir, "directory", dir_mode, "root", dir_group)
    else:
        dir_ok = found_dir is not None
    same = found_file is not None and found_file.get("sha256") == digest
    file_ok = same and _matches(found_file, "file", mode, owner, group)
    if dir_ok and file_ok:
        host.noop(f"{dest} is up to date (sha256, mode {mode}, {owner}:{group})")
        return
    if not dir_ok:
        yield _directory_command(directory, dir_mode, dir_group, enforce=secret)
    if file_ok:
        return
    if run_state.config.DIFF and not same:
        shown = [] if secret else _old_lines(dest)
        _show_diff(dest, data, shown if found_file is not None else None, secret)
    yield _write_command(data, dest, owner, group, mode)


@operation()
def write_planned(file: PlannedFile) -> Commands:
    """
    Write the plan's file when the plan found it differs: the plan's facts read its sha256
    (`PlannedFile.changes` is known), so this asks nothing of the host. Not for a secret (its
    mode and owners are read: put_file).

    + file: the plan's file (content, mode, owners, and the digest its facts read)
    """
    _check_dest(file.path)
    if file.secret or file.changes is None:
        raise OperationError(f"write_planned: the plan did not read {file.path}: put_file")
    if not file.changes:
        host.noop(f"{file.path} is up to date")
        return
    show_change(file)
    yield from _writes(
        content_bytes(file.data),
        file.path,
        file.owner,
        file.group,
        file.mode,
        file.dir_mode,
        file.dir_group,
    )


def new_file(
    src: str | bytes | Path,
    dest: str,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
) -> Commands:
    """For an operation that writes a file it knows to be new or changed (in an environment it
    just made, or as its plan says): put_file's commands, asking nothing; `yield from` it."""
    _check_dest(dest)
    data = content_bytes(src)
    if run_state.config.DIFF:
        _show_diff(dest, data, None, secret=False)
    yield from _writes(data, dest, owner, group, mode, "755", "root")


def line_writer(
    src: str | bytes | Path,
    dest: str,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
) -> tuple[str, str]:
    """For a host command that writes a file among other steps (programs/roll_batch.py): the
    shell text that writes dest from its stdin, with put_file's guarantees (final owner and mode
    before the first byte, a unique temp name, a rename, its temp removed on failure, a killed
    write's temp removed, the byte count checked), and that stdin, the content as one base64
    line. The caller decides that dest changes (the plan's digests); it is not a secret (a
    command's stdin is not a secret's place). Under `--diff`, the operation that runs the
    command shows the change (show_change)."""
    data = content_bytes(src)
    script = _write_script(dest, owner, group, mode, len(data))
    return script, base64.b64encode(data).decode() + "\n"


def show_change(file: PlannedFile) -> None:
    """Under `--diff`, inside the operation that writes the plan's file in a host command of
    its own (a roll batch): the change, as put_file shows it. Called when the operation runs,
    never to decide anything (tests/unit/test_steps_read_no_fact.py names it)."""
    if run_state.config.DIFF:
        exists = file.sha256_now is not None
        current = (_old_lines(file.path) if not file.secret else []) if exists else None
        _show_diff(file.path, content_bytes(file.data), current, file.secret)


def put_planned(file: PlannedFile, name: str | None = None) -> OperationMeta:
    """The plan's file written: by write_planned when the plan's facts read its digest (a
    converged run asks nothing), else (not read, or a secret, whose mode and owners are read)
    by put_file. `name`: the operation's, when the step says why (a rank unit's "(start)").

    One operation whichever way it writes: pyinfra orders operations by where they are called,
    so two hosts that took different ways for the same files would call two operations in
    opposite orders (pyinfra: "Cycle detected in operation ordering DAG")."""
    return planned_file(name=name or file.name, file=file)


@operation()
def planned_file(file: PlannedFile) -> Commands:
    """
    put_planned's one operation: write_planned's commands, or put_file's.

    + file: the plan's file
    """
    if file.secret or file.changes is None:
        yield from put_file._inner(
            src=file.data,
            dest=file.path,
            owner=file.owner,
            group=file.group,
            mode=file.mode,
            dir_mode=file.dir_mode,
            dir_group=file.dir_group,
            secret=file.secret,
        )
        return
    yield from write_planned._inner(file=file)
