"""What the smoke step reads of the serve step, and nothing more.

operations/smoke.py runs after the serve step and asks what the serve step's plan says it
(re)started; operations/serve.py asks a rolled batch with smoke.py's operation before it rejoins
the router. So serve.py imports smoke.py, and smoke.py names the serve step by this protocol
alone (`ServeStep` in operations/serve.py has both attributes): no import circle
(tests/unit/test_import_graph.py).
"""

from __future__ import annotations

from typing import Protocol

from operations.facts.serve import Serving
from operations.roll import ServePlan


class ServeResult(Protocol):
    """The serve step as the smoke step sees it: the fact it read and the plan it carried out."""

    @property
    def serving(self) -> Serving: ...

    @property
    def decided(self) -> ServePlan: ...
