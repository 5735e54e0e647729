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

import gevent
from pyinfra.api.facts import FactBase
from pyinfra.context import ctx_config, ctx_host, host

T = TypeVar("T")
U = TypeVar("U")

_ANSWERS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def gathered(fact: type[FactBase[T]], **kwargs: Any) -> T:
    answers = _ANSWERS.setdefault(host._get_module(), {})  # type: ignore[attr-defined]
    key = f"{fact.__module__}.{fact.__name__}:{json.dumps(kwargs, sort_keys=True, default=str)}"
    if key not in answers:
        answers[key] = host.get_fact(fact, **kwargs)
    value: T = answers[key]
    return value


def together(first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
    """`first()` and `second()` at the same time, each asking its facts of the current host:
    two commands on the host's one SSH connection (paramiko channels) instead of one after the
    other. A converged deploy waits on the host's answers more than on anything else
    (bench/serve_bench.py). An exception in either is raised here, as if called in turn."""
    target, config = ctx_host.get(), ctx_config.get()
    if not target.connected:
        # Both would connect otherwise (pyinfra's get_fact connects on first use).
        target.connect(reason="to gather facts", raise_exceptions=True)

    def in_context(call: Callable[[], Any]) -> Any:
        # pyinfra's `host` and `config` are greenlet-local: a new greenlet sees neither.
        with ctx_host.use(target), ctx_config.use(config):
            return call()

    other = gevent.spawn(in_context, second)
    try:
        one = first()
    finally:
        # Its answer or its exception; never left running past this call.
        two = other.get()
    return one, two
