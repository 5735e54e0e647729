"""Schema checks: the settings and the knowledge base, each against its Draft 2020-12 schema.

jsonschema (with attrs and referencing) is imported on the first check, not with the settings:
deploy.py asks for the deploy lock before the checks' imports (tests/unit/test_lock_first.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jsonschema


def errors(schema: Mapping[str, object], document: object) -> list[jsonschema.ValidationError]:
    """Every error of `document` against the Draft 2020-12 `schema`, sorted by path."""
    import jsonschema

    return sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(document),
        key=lambda e: list(e.absolute_path),
    )


@cache
def checker() -> bytes:
    """What a check's verdict depends on besides schema and document: this module and the
    installed jsonschema (its files' sizes and times: an upgrade replaces them). The knowledge
    base's kept build is keyed by it (operations/kb/loader.py)."""
    parts = [Path(__file__).read_bytes()]
    spec = importlib.util.find_spec("jsonschema")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        for name in ("__init__.py", "validators.py", "_keywords.py"):
            stat = (package / name).stat()
            parts.append(f"{package / name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return b"\0".join(parts)
