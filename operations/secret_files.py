"""The one writer of files that hold a secret (API key, hub token, index credentials).

    from operations.secret_files import put_secret

    put_secret(
        name="Serve: API key file",
        src="api-key: \"...\"\\n",       # the content (str or bytes), or a Path on the controller
        dest="/etc/sglang/secrets.yaml",
        owner="root", group="sglang", mode="640",
        dir_mode="750", dir_group="sglang",   # the directory, enforced on every run
    )

What it guarantees, whoever connects (root, or a user with `_sudo=True`):

- the file exists with its final owner, group and mode before its first byte is written: a
  fresh temp file is made by `mktemp` (mode 600, root, under umask 077) in the destination's
  directory, chowned and chmodded, and only then is the content written into it; a rename puts
  it in place, so readers see the old file or the new one, never a part;
- the directory (a symlink is refused) has its mode, owner root and its group on every run, not
  only when the file changes;
- the content never appears in a command line, a log, a diff or an error: it reaches the host
  base64-encoded on the command's stdin (no SFTP temp file in /tmp, which a sudo upload would
  need); pyinfra prints neither stdin nor a diff for it;
- the temp name is unique per run (`mktemp`), and a failed write removes its temp file;
- a host that already has it reports no change: the SecretFile fact's sha256, mode, owner and
  group are compared, never the content.

+ src: the content (str is written as UTF-8), or a pathlib.Path of a file on the controller
+ dest: the absolute path on the target
+ owner/group/mode: the file's (mode in octal digits, "600")
+ dir_mode: the directory's mode ("700"); its owner is always root
+ dir_group: the directory's group (default: root)
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from pathlib import Path
from typing import Any

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from operations.facts.secret import PathState, SecretFile


def content_bytes(src: str | bytes | Path) -> bytes:
    if isinstance(src, Path):
        return src.expanduser().read_bytes()
    return src.encode() if isinstance(src, str) else src


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


def _directory_command(directory: str, mode: str, group: str) -> StringCommand:
    # install -d creates it (parents root-only under umask 077) or fixes mode and owners.
    return StringCommand(
        "umask 077 &&", "install", "-d", "-m", mode, "-o", "root", "-g", QuoteString(group),
        QuoteString(directory),
    )  # fmt: skip


def _write_script(dest: str, owner: str, group: str, mode: str) -> str:
    directory, name = dest.rsplit("/", 1)
    q = shlex.quote
    template = f"{directory}/.{name}.XXXXXXXXXX"
    return (
        "set -e; umask 077; "
        f"tmp=$(mktemp {q(template)}); "
        "trap 'rm -f \"$tmp\"' EXIT; "
        f'chown {q(owner + ":" + group)} "$tmp"; chmod {q(mode)} "$tmp"; '
        # Only now, with its final owner and mode, does the file get its first byte.
        'base64 -d > "$tmp"; '
        f'mv -f "$tmp" {q(dest)}; trap - EXIT'
    )


@operation()
def put_secret(
    src: str | bytes | Path,
    dest: str,
    owner: str = "root",
    group: str = "root",
    mode: str = "600",
    dir_mode: str = "700",
    dir_group: str = "root",
) -> Any:
    """
    Write a secret file: final owner and mode before the first byte, never shown, unique temp
    name, directory mode enforced on every run; no change when hash, mode and owners match.

    + src: the content (str or bytes), or a pathlib.Path of a file on the controller
    + dest: absolute path on the target
    + owner/group/mode: the file's owner, group and octal mode
    + dir_mode: the directory's octal mode (owner root)
    + dir_group: the directory's group
    """
    if not dest.startswith("/") or dest.endswith("/"):
        raise OperationError(f"put_secret: dest must be an absolute file path, got {dest!r}")
    data = content_bytes(src)
    digest = hashlib.sha256(data).hexdigest()
    directory = dest.rsplit("/", 1)[0] or "/"
    now = host.get_fact(SecretFile, path=dest)
    found_dir, found_file = now["dir"], now["file"]
    for what, state in ((directory, found_dir), (dest, found_file)):
        if state is not None and state["type"] not in (
            "directory" if what == directory else "file"
        ):
            raise OperationError(
                f"{what} is a {state['type']}, not a plain "
                f"{'directory' if what == directory else 'file'}: refusing to write a secret "
                "through it; remove it and run again"
            )

    dir_ok = _matches(found_dir, "directory", dir_mode, "root", dir_group)
    file_ok = _matches(found_file, "file", mode, owner, group) and (
        found_file is not None and found_file.get("sha256") == digest
    )
    if dir_ok and file_ok:
        host.noop(f"{dest} is up to date (sha256, mode {mode}, {owner}:{group})")
        return
    if not dir_ok:
        yield _directory_command(directory, dir_mode, dir_group)
    if not file_ok:
        encoded = base64.b64encode(data).decode()
        yield StringCommand(
            "sh", "-c", QuoteString(_write_script(dest, owner, group, mode)), _stdin=encoded
        )
