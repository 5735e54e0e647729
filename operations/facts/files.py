"""What a file we write and its directory are now: type, mode, owner, group and the file's sha256.
The one file writer (operations/steps/host_files.py) compares this with what it would write: content
by hash, never by text, so a converged host reports no change and nothing secret is read back.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase


class PathState(TypedDict):
    # "directory", "file", "symlink" or "other"
    type: str
    mode: str  # octal, as stat's %a prints it: "640"
    owner: str
    group: str


class FileState(PathState, total=False):
    sha256: str


class PathStates(TypedDict):
    dir: PathState | None
    file: FileState | None


def _entry(words: list[str]) -> PathState | None:
    if len(words) == 1:
        return {"type": words[0], "mode": "", "owner": "", "group": ""}
    if len(words) != 4:
        return None
    kind, mode, owner, group = words
    return {"type": kind, "mode": mode, "owner": owner, "group": group}


def parse_states(lines: list[str]) -> PathStates:
    state: PathStates = {"dir": None, "file": None}
    sha: str | None = None
    for line in lines:
        which, _, rest = line.strip().partition(" ")
        if which == "sha256":
            sha = rest.strip() or None
        elif which in ("dir", "file"):
            state[which] = _entry(rest.split())  # type: ignore[literal-required]
    if state["file"] is not None and sha is not None:
        file_state: FileState = {**state["file"], "sha256": sha}
        state["file"] = file_state
    return state


# Never follows a link: a symlink is reported as one (and the writer refuses it).
_SCRIPT = " ".join(
    (
        'if [ -L "$d" ]; then echo "dir symlink";',
        'elif [ -d "$d" ]; then stat -c "dir directory %a %U %G" "$d";',
        'elif [ -e "$d" ]; then echo "dir other"; fi;',
        'if [ -L "$f" ]; then echo "file symlink";',
        'elif [ -f "$f" ]; then stat -c "file file %a %U %G" "$f";',
        'echo "sha256 $(sha256sum < "$f" | cut -d" " -f1)";',
        'elif [ -e "$f" ]; then echo "file other"; fi;',
        "echo end",
    )
)


class FileAt(FactBase[PathStates]):
    """
    Returns the state of a file and of its directory, without following links.

    .. code:: python

        {
            "dir": {"type": "directory", "mode": "750", "owner": "root", "group": "sglang"},
            "file": {"type": "file", "mode": "640", "owner": "root", "group": "sglang",
                     "sha256": "9f86d0..."},
        }

    + path: the file (its directory is the part before the last "/")
    """

    def command(self, path: str) -> StringCommand:
        directory = path.rsplit("/", 1)[0] or "/"
        return StringCommand(
            "d=",
            QuoteString(directory),
            "; f=",
            QuoteString(path),
            "; " + _SCRIPT,
            _separator="",
        )

    @staticmethod
    def default() -> PathStates:
        return {"dir": None, "file": None}

    def process(self, output: list[str]) -> Any:
        return parse_states(output)
