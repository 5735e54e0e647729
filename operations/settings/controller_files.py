"""The files on the controller that settings name, read once, by the settings loader (`load`):
the API key (api_key_file), the router's control-plane key (router.control_plane_key_file, or,
unset, `router-control-plane.key` beside the engine locks: `make_key` makes it on the first run)
and NVIDIA's redistrib manifest (cuda_redist_manifest).

What was read travels with the settings (`Settings.controller_files`) into the plan, which reads
no file itself (tests/unit/test_plan_is_pure.py). A key's text is in no repr, no `plan --json`,
no log and no error; the `*_problem`s judge what was read, before any host is asked.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from operations.settings.checks import control_characters


@dataclass(frozen=True)
class ControllerFile:
    """One file as the loader read it: its text, or why it could not be read."""

    path: str
    # repr=False: a key's text never reaches a log or a traceback.
    text: str | None = field(default=None, repr=False)
    # The error as Python words it (None: read); `missing`: there is no such file.
    error: str | None = None
    missing: bool = False
    # The error in the system's words (strerror), for a refusal's line.
    reason: str | None = None
    # Who could have written it, as the read found it: its owner is neither this user nor root,
    # or its mode lets its group or anyone write it (None: read, and only we could write it).
    foreign: str | None = None
    # This run made it (make_key): the plan says so.
    made: bool = False

    @property
    def key(self) -> str | None:
        """The key it holds (one line, stripped); None: not read."""
        return self.text.strip() if self.text is not None else None


def read(path: str, *, expand: bool = True, made: bool = False) -> ControllerFile:
    """The file's UTF-8 text (`expand`: a leading ~ is the controller user's home), and who
    could have written it (the owner and mode of the file opened, not of a name looked up
    again)."""
    where = Path(path).expanduser() if expand else Path(path)
    try:
        with open(where, "rb") as opened:
            foreign = writable_by_others(os.fstat(opened.fileno()))
            text = opened.read().decode("utf-8")
        return ControllerFile(path, text, foreign=foreign, made=made)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return ControllerFile(
            path, error=str(exc), missing=isinstance(exc, FileNotFoundError), reason=reason
        )


def writable_by_others(found: os.stat_result) -> str | None:
    """Why another user could have written the file (None: only this user or root could)."""
    if found.st_uid not in (os.getuid(), 0):
        return f"it is owned by uid {found.st_uid}, not by this user ({os.getuid()}) or root"
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its mode {stat.S_IMODE(found.st_mode):03o} lets its group or anyone write it"
    return None


CONTROL_PLANE_KEY_NAME = "router-control-plane.key"


def default_control_plane_key(engine_lock_dir: str) -> str:
    """Where the router's control-plane key is kept when router.control_plane_key_file is
    unset: beside the engine locks on the controller."""
    return os.path.join(engine_lock_dir, CONTROL_PLANE_KEY_NAME)


def make_key(path: str) -> ControllerFile | None:
    """Make the key file at `path` when there is none: mode 600 from its creation (os.open's
    mode with O_CREAT|O_EXCL, never a chmod after a write), then 32 random bytes, URL-safe.
    Another host of the same run, or an earlier run, that made it first wins: its key is kept.
    None: there is a key file now (made here or found); else the file, unreadable, saying why
    it could not be made."""
    where = Path(path).expanduser()
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return None
    except OSError as exc:
        reason = f"it could not be made: {exc.strerror or exc}"
        return ControllerFile(path, error=str(exc), reason=reason)
    try:
        os.fchmod(fd, 0o600)  # the umask only takes bits away: 600 exactly, before any byte
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
    finally:
        os.close(fd)
    return ControllerFile(path, made=True)


@dataclass(frozen=True)
class ControllerFiles:
    """Each controller file the settings name, as read; None: the setting names none."""

    api_key: ControllerFile | None = None
    control_plane_key: ControllerFile | None = None
    redist_manifest: ControllerFile | None = None


def read_all(
    api_key_file: str | None,
    control_plane_key_file: str | None,
    redist_manifest: str | None,
    *,
    make_control_plane_key: bool = False,
) -> ControllerFiles:
    """Every file the settings name, each read once (`make_control_plane_key`: the key file is
    the default one, made here when missing)."""
    control = None
    if control_plane_key_file:
        made = make_key(control_plane_key_file) if make_control_plane_key else None
        if made is not None and made.error is not None:
            control = made
        else:
            control = read(control_plane_key_file, made=made is not None)
    return ControllerFiles(
        api_key=read(api_key_file) if api_key_file else None,
        control_plane_key=control,
        # Opened as given (no ~), as the engine's own reading of it always did.
        redist_manifest=read(redist_manifest, expand=False) if redist_manifest else None,
    )


def _unreadable(file: ControllerFile) -> str:
    if file.missing:
        return "no such file on the controller"
    return f"cannot be read on the controller ({file.reason})"


def _refused(file: ControllerFile) -> str | None:
    """Why the file's key is not taken before its content is judged."""
    if file.key is None:
        return _unreadable(file)
    if file.foreign is not None:
        return (
            f"another user could have written it on the controller: {file.foreign}; "
            "make it yours with mode 600 (chown, chmod 600)"
        )
    return None


def api_key_problem(file: ControllerFile) -> str | None:
    """What is wrong with the API key file as read (None: one non-empty key)."""
    key = file.key
    refused = _refused(file)
    if refused is not None or key is None:
        why = refused or _unreadable(file)
    elif not key:
        why = (
            "the file is empty: SGLang turns authentication off for an empty key; put the "
            "key in it, or set api_key_file: null to serve without one"
        )
    elif control_characters(key):
        why = "the key holds control characters (more than one line?)"
    else:
        return None
    if file.missing:
        why += f" (`make api-key API_KEY_FILE={file.path}` makes one)"
    return f"{why}; accepted: a readable file holding one non-empty API key"


def control_plane_key_problem(file: ControllerFile) -> str | None:
    """What is wrong with the control-plane key file as read (None: one key the router's
    parser takes)."""
    key = file.key
    refused = _refused(file)
    if refused is not None or key is None:
        why = refused or _unreadable(file)
    elif len(key) < 16:
        why = "the key is empty or shorter than 16 characters"
    elif control_characters(key) or any(c.isspace() for c in key):
        why = "the key holds whitespace or control characters (more than one line?)"
    else:
        return None
    return f"{why}; accepted: a readable file holding one key of 16 or more characters, no spaces"
