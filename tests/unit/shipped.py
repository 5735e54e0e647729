"""The host scripts as the host gets them (operations/render/host_scripts.py), for tests that run
them as the deploy does: each written once per test run to a private directory, removed at exit."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from operations.render.host_scripts import script_text


@cache
def _directory() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="shipped-scripts-"))
    atexit.register(shutil.rmtree, directory, True)
    return directory


@cache
def script_path(main: str) -> Path:
    """operations/programs/MAIN bundled, as put_file writes it to the host (mode 755)."""
    path = _directory() / main
    path.write_text(script_text(main))
    path.chmod(0o755)
    return path
