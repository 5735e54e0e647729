"""A fact gathered once per host and run, however many steps ask for it.

pyinfra 3 runs a fact's command on every `host.get_fact`; the gate, the engine, model and serve
steps ask the same questions (ServingState, ModelStaging) while the deploy is prepared, before
any change, so one answer serves them all. Keyed by the host object and the arguments.
"""

from __future__ import annotations

import json
import weakref
from typing import Any, TypeVar

from pyinfra.api.facts import FactBase
from pyinfra.context import host

T = TypeVar("T")

_ANSWERS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def gathered(fact: type[FactBase[T]], **kwargs: Any) -> T:
    answers = _ANSWERS.setdefault(host._get_module(), {})  # type: ignore[attr-defined]
    key = f"{fact.__module__}.{fact.__name__}:{json.dumps(kwargs, sort_keys=True, default=str)}"
    if key not in answers:
        answers[key] = host.get_fact(fact, **kwargs)
    value: T = answers[key]
    return value
