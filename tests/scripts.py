"""The project's capture scripts (scripts/*.py), imported by tests and doubles for the tables
and rules they hold; never run from here (nothing in a test reaches a registry)."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@cache
def script_module(name: str) -> ModuleType:
    """scripts/NAME.py as the module NAME, once per process."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
