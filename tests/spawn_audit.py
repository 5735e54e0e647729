"""A pytest plugin for the fast layer: a test that starts a process without the `integration`
(or `e2e`) marker fails, naming what it started. It marks nothing: a test's layer is written in
its file (docs/how-it-works/faults-and-tests.md, "Tests, by layer"). `make fast` loads it:

    python -m pytest -p tests.spawn_audit -m "not e2e and not integration"

What counts: `subprocess.Popen` (so `subprocess.run`), gevent's Popen (pyinfra's local
connector), `os.fork`, `os.posix_spawn`, `os.system`. One process is allowed: the nvidia-smi
double that `tests/doubles/ct200.nvidia_smi_output` runs so that the pure tests read what the
real fact command prints (cached per GPU scenario by `tests/unit/builders.gpu_facts`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Generator
from typing import Any

import gevent.subprocess
import pytest

ALLOWED = {"nvidia_smi_output"}  # functions whose processes the fast layer may start

_started: list[str] = []
_watching = False


def _allowed() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in ALLOWED:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _note(what: object) -> None:
    if _watching and not _allowed():
        _started.append(str(what)[:200])


def _words(args: object) -> str:
    return args if isinstance(args, str) else " ".join(map(str, args))  # type: ignore[call-overload]


def _wrap_popen(cls: Any) -> None:
    original = cls.__init__

    def init(self: Any, args: object, *rest: Any, **kwargs: Any) -> None:
        _note(_words(args))
        original(self, args, *rest, **kwargs)

    cls.__init__ = init


def _wrap_os(name: str) -> None:
    original: Callable[..., Any] | None = getattr(os, name, None)
    if original is None:
        return

    def call(*args: Any, **kwargs: Any) -> Any:
        _note(f"os.{name}{args[:2]!r}")
        return original(*args, **kwargs)

    setattr(os, name, call)


_wrap_popen(subprocess.Popen)
_wrap_popen(gevent.subprocess.Popen)
for _name in ("fork", "posix_spawn", "posix_spawnp", "system"):
    _wrap_os(_name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    global _watching
    _started.clear()
    marked = any(item.get_closest_marker(m) for m in ("integration", "e2e"))
    _watching = not marked
    try:
        yield
    finally:
        _watching = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" or not _started or report.failed:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} started a process without the integration marker "
        f"(add @pytest.mark.integration, or pytestmark at the module's top): "
        + "; ".join(_started[:3])
    )
