"""operations/runtime/stack_order.py: a frame of a file run with `exec` (as pyinfra runs deploy.py)
is
found by inspect's module lookup once the file is registered, and pyinfra's operation order
from the stack is the same either way."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import FrameType

from operations.runtime.stack_order import known_to_inspect


def frame_of(path: Path) -> FrameType:
    """A frame executing `path`'s code, run as pyinfra runs a deploy file."""
    path.write_text("import inspect\nframe = inspect.currentframe()\n")
    data: dict[str, object] = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), data)
    frame = data["frame"]
    assert isinstance(frame, FrameType)
    return frame


def test_an_exec_run_file_is_found_once_registered(tmp_path: Path) -> None:
    frame = frame_of(tmp_path / "deploy.py")
    assert inspect.getmodule(frame, str(tmp_path / "deploy.py")) is None

    name = known_to_inspect(str(tmp_path / "deploy.py"))
    try:
        assert inspect.getmodule(frame, str(tmp_path / "deploy.py")) is sys.modules[name]
        assert known_to_inspect(str(tmp_path / "deploy.py")) == name  # once
        # What pyinfra reads of the frame is unchanged: its file and line.
        info = inspect.getframeinfo(frame)
        assert (info.filename, info.lineno) == (str(tmp_path / "deploy.py"), 2)
    finally:
        del sys.modules[name]
