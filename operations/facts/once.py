"""A fact gathered once per host and run, however many steps ask for it; and facts that do not
depend on each other asked at the same time.

pyinfra 3 runs a fact's command on every `host.get_fact`; the gate, the engine, model and serve
steps ask the same questions (ServingState, ModelStaging) while the deploy is prepared, before
any change, so one answer serves them all. Keyed by the host object and the arguments.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pyinfra.api.facts import FactBase
from pyinfra.context import host

from operations.runtime.pyinfra_internals import at_once, current_host

T = TypeVar("T")

_ANSWERS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def gathered(fact: type[FactBase[T]], **kwargs: Any) -> T:
    answers = _ANSWERS.setdefault(current_host(), {})
    key = f"{fact.__module__}.{fact.__name__}:{json.dumps(kwargs, sort_keys=True, default=str)}"
    if key not in answers:
        answers[key] = host.get_fact(fact, **kwargs)
    value: T = answers[key]
    return value


def together(*calls: Callable[[], Any]) -> tuple[Any, ...]:
    """Every call at the same time, each asking its facts of the current host: one command
    per call on the host's one SSH connection (paramiko channels) instead of one after the
    other. A converged deploy waits on the host's answers more than on anything else
    (bench/serve_bench.py). The first exception, in the calls' order, is raised here once all
    have ended, as if called in turn."""
    if not host.connected:
        # Each would connect otherwise (pyinfra's get_fact connects on first use).
        host.connect(reason="to gather facts", raise_exceptions=True)
    return at_once(*calls)
