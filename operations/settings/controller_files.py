"""The files on the controller that settings name, read once, by the settings loader (`load`):
the API key (api_key_file), the router's control-plane key (router.control_plane_key_file) and
NVIDIA's redistrib manifest (cuda_redist_manifest).

What was read travels with the settings (`Settings.controller_files`) into the plan, which reads
no file itself (tests/unit/test_plan_is_pure.py). A key's text is in no repr, no `plan --json`,
no log and no error; the `*_problem`s judge what was read, before any host is asked.
"""

from __future__ import annotations

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

    @property
    def key(self) -> str | None:
        """The key it holds (one line, stripped); None: not read."""
        return self.text.strip() if self.text is not None else None


def read(path: str, *, expand: bool = True) -> ControllerFile:
    """The file's UTF-8 text (`expand`: a leading ~ is the controller user's home)."""
    where = Path(path).expanduser() if expand else Path(path)
    try:
        return ControllerFile(path, where.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return ControllerFile(
            path, error=str(exc), missing=isinstance(exc, FileNotFoundError), reason=reason
        )


@dataclass(frozen=True)
class ControllerFiles:
    """Each controller file the settings name, as read; None: the setting names none."""

    api_key: ControllerFile | None = None
    control_plane_key: ControllerFile | None = None
    redist_manifest: ControllerFile | None = None


def read_all(
    api_key_file: str | None, control_plane_key_file: str | None, redist_manifest: str | None
) -> ControllerFiles:
    """Every file the settings name, each read once."""
    return ControllerFiles(
        api_key=read(api_key_file) if api_key_file else None,
        control_plane_key=read(control_plane_key_file) if control_plane_key_file else None,
        # Opened as given (no ~), as the engine's own reading of it always did.
        redist_manifest=read(redist_manifest, expand=False) if redist_manifest else None,
    )


def _unreadable(file: ControllerFile) -> str:
    if file.missing:
        return "no such file on the controller"
    return f"cannot be read on the controller ({file.reason})"


def api_key_problem(file: ControllerFile) -> str | None:
    """What is wrong with the API key file as read (None: one non-empty key)."""
    key = file.key
    if key is None:
        why = _unreadable(file)
    elif not key:
        why = (
            "the file is empty: SGLang turns authentication off for an empty key; put the "
            "key in it, or set api_key_file: null to serve without one"
        )
    elif control_characters(key):
        why = "the key holds control characters (more than one line?)"
    else:
        return None
    return f"{why}; accepted: a readable file holding one non-empty API key"


def control_plane_key_problem(file: ControllerFile) -> str | None:
    """What is wrong with the control-plane key file as read (None: one key the router's
    parser takes)."""
    key = file.key
    if key is None:
        why = _unreadable(file)
    elif len(key) < 16:
        why = "the key is empty or shorter than 16 characters"
    elif control_characters(key) or any(c.isspace() for c in key):
        why = "the key holds whitespace or control characters (more than one line?)"
    else:
        return None
    return f"{why}; accepted: a readable file holding one key of 16 or more characters, no spaces"
