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
    put_file(name="...", src=unit_text, dest="/etc/systemd/system/x.service",
             sha256_now=serving.files.get(path))   # a bulk fact read it: no round trip

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
  sha256 when a bulk fact stands in for the FileAt fact), never the content;
- a destination (or directory) that is a symlink or not a plain file is refused, not followed.

`secret=True` adds what a secret needs: the FileAt fact is always read (so a file made
world-readable is rewritten), and the directory's mode, owner root and group are enforced on
every run, not only when it is created. Without it an existing
directory is never changed (it may be /etc/systemd/system) and a bulk fact may stand in for the
FileAt fact (`sha256_now=`), which saves a round trip per file on a converged run.

+ src: the content (str is written as UTF-8), or a pathlib.Path of a file on the controller
+ dest: the absolute path on the target
+ owner/group/mode: the file's (mode in octal digits, "600")
+ dir_mode: the directory's mode when it is created (or, for a secret, enforced); owner root
+ dir_group: the directory's group (default: root)
+ secret: the content is a secret (see above)
+ sha256_now: what a bulk fact read of dest (None: absent); False: read the FileAt fact
"""

from __future__ import annotations

import base64
import shlex
from pathlib import Path
from typing import Any, Literal

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.context import state as run_state
from pyinfra.facts.files import FileContents

from operations.facts.files import FileAt, PathState
from operations.plan.planned_files import PlannedFile, content_bytes, sha256
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


def _show_diff(dest: str, data: bytes, exists: bool, secret: bool) -> None:
    """Under `--diff`, what a write changes, as pyinfra's files.put shows it: the lines of a
    unit, a script or a config (none holds a secret). A secret is named, never shown."""
    verb = "modify" if exists else "create"
    if secret:
        logger.info(f"{host.print_prefix}Will {verb} {dest} (a secret: its content is not shown)")
        return
    try:
        desired = data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        logger.info(f"{host.print_prefix}Will {verb} {dest} (binary content)")
        return
    current: list[str] = []
    if exists:
        found = host.get_fact(FileContents, path=dest) or []
        current = [line + "\n" for line in found]
    logger.info(f"{host.print_prefix}Will {verb} {dest}")
    for line in color_diff(current, desired):
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
    sha256_now: str | Literal[False] | None = False,
) -> Commands:
    """
    Write a file: final owner and mode before the first byte, content never shown, unique temp
    name, links refused; no change when it is already there. See the module's docstring.

    + src: the content (str or bytes), or a pathlib.Path of a file on the controller
    + dest: absolute path on the target
    + owner/group/mode: the file's owner, group and octal mode
    + dir_mode: the directory's octal mode (owner root), when created or (secret) every run
    + dir_group: the directory's group
    + secret: always read the FileAt fact, compare mode and owners, enforce the directory
    + sha256_now: dest's sha256 as a bulk fact read it (None: absent), instead of the FileAt
      fact (not for a secret); False (default): read the FileAt fact
    """
    if not dest.startswith("/") or dest.endswith("/"):
        raise OperationError(f"put_file: dest must be an absolute file path, got {dest!r}")
    if secret and sha256_now is not False:
        raise OperationError(f"put_file: {dest} is a secret: its mode and owners must be read")
    data = content_bytes(src)
    digest = sha256(data)
    directory = dest.rsplit("/", 1)[0] or "/"

    if sha256_now is not False:
        if sha256_now == digest:
            host.noop(f"{dest} is up to date")
            return
        if run_state.config.DIFF:
            _show_diff(dest, data, sha256_now is not None, secret)
        yield _directory_command(directory, dir_mode, dir_group, enforce=False)
    else:
        state = host.get_fact(FileAt, path=dest)
        found_dir, found_file = state["dir"], state["file"]
        _refuse_links(directory, dest, found_dir, found_file, "a secret" if secret else "a file")
        if secret:
            dir_ok = _matches(found_dir, "directory", dir_mode, "root", dir_group)
        else:
            dir_ok = found_dir is not None
        file_ok = _matches(found_file, "file", mode, owner, group) and (
            found_file is not None and found_file.get("sha256") == digest
        )
        if dir_ok and file_ok:
            host.noop(f"{dest} is up to date (sha256, mode {mode}, {owner}:{group})")
            return
        if not dir_ok:
            yield _directory_command(directory, dir_mode, dir_group, enforce=secret)
        if file_ok:
            return
        if run_state.config.DIFF and not (found_file and found_file.get("sha256") == digest):
            _show_diff(dest, data, found_file is not None, secret)
    yield StringCommand(
        "sh",
        "-c",
        QuoteString(_write_script(dest, owner, group, mode, len(data))),
        _stdin=base64.b64encode(data).decode(),
    )


def line_writer(
    src: str | bytes | Path,
    dest: str,
    owner: str = "root",
    group: str = "root",
    mode: str = "644",
    diff: bool = False,
) -> tuple[str, str]:
    """For a host command that writes a file among other steps (files/roll_batch.py): the
    shell text that writes dest from its stdin, with put_file's guarantees (final owner and mode
    before the first byte, a unique temp name, a rename, its temp removed on failure, a killed
    write's temp removed, the byte count checked), and that stdin, the content as one base64
    line. `diff` (the deploy's `--diff`, in an operation's context): the change is shown as
    put_file shows it. The caller decides that dest changes (the plan's digests); it is not a
    secret (a command's stdin is not a secret's place)."""
    data = content_bytes(src)
    if diff:
        _show_diff(dest, data, True, secret=False)
    script = _write_script(dest, owner, group, mode, len(data))
    return script, base64.b64encode(data).decode() + "\n"


def put_planned(file: PlannedFile, name: str | None = None) -> OperationMeta:
    """put_file of the plan's file: a converged run rewrites nothing (the fact's digest stands
    in for the FileAt fact, but for a secret, whose mode and owners are read). `name`: the
    operation's, when the step says why (a rank unit's "(start)")."""
    checked = file.read and not file.secret
    return put_file(
        name=name or file.name,
        src=file.data,
        dest=file.path,
        owner=file.owner,
        group=file.group,
        mode=file.mode,
        dir_mode=file.dir_mode,
        dir_group=file.dir_group,
        secret=file.secret,
        sha256_now=file.sha256_now if checked else False,
    )
