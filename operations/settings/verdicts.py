"""Schema checks, with the passes remembered: a document a schema accepted once is accepted
again without importing jsonschema.

Importing jsonschema (with attrs and referencing) and validating the knowledge base and the
settings cost ~70 ms of a converged re-run that changes nothing (bench/serve_bench.py), for
verdicts that cannot have changed. A pass is recorded under a digest of everything it depends
on: the schema, the document (its exact types: a tuple is not the list JSON would make of it),
the checking code and the installed jsonschema. Any change to one is another digest and a fresh
check; failures are never recorded, so every error is reported by jsonschema itself.

Recorded beside Python's bytecode cache when Python writes bytecode there, and trusted as
bytecode is: whoever can write there can change the code the controller runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jsonschema

# The newest passes kept: settings differ per host, and an inventory of a few hundred hosts
# should not check each again on every run.
KEEP = 512
# Beside this package's bytecode.
RECORD = Path(importlib.util.cache_from_source(__file__)).parent / "schema-verdicts.json"


def errors(schema: Mapping[str, object], document: object) -> list[jsonschema.ValidationError]:
    """Every error of `document` against the Draft 2020-12 `schema`, sorted by path; none,
    without importing jsonschema, when this schema passed this very document before."""
    key = digest("schema", _encoded(schema), _encoded(document))
    if key is not None and passed(key):
        return []
    import jsonschema

    found = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(document),
        key=lambda e: list(e.absolute_path),
    )
    if not found and key is not None:
        remember(key)
    return found


def digest(kind: str, *parts: str | bytes | None) -> str | None:
    """The key of a verdict on `parts` (None: one of them cannot be told apart exactly)."""
    if any(part is None for part in parts):
        return None
    sha = hashlib.sha256(kind.encode())
    for part in (checker(), *parts):
        data = part.encode() if isinstance(part, str) else part
        assert isinstance(data, bytes)
        sha.update(len(data).to_bytes(8, "big") + data)
    return sha.hexdigest()[:40]


def passed(key: str) -> bool:
    return key in _recorded(RECORD)


def remember(key: str) -> None:
    recorded = _recorded(RECORD)
    if key in recorded:
        return
    recorded.append(key)
    del recorded[:-KEEP]
    if sys.dont_write_bytecode:
        return
    with contextlib.suppress(OSError):
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        # Renamed into place: a reader never sees half a file, two runs at once lose a pass
        # at worst (it is checked again next time).
        temp = RECORD.with_name(f".{RECORD.name}.{os.getpid()}")
        temp.write_text(json.dumps(recorded))
        temp.replace(RECORD)


def _encoded(value: object) -> str | None:
    """`value` as text that tells apart everything a schema tells apart (None: a type we do
    not know how to write exactly, never recorded)."""
    out: list[str] = []

    def walk(v: object) -> bool:
        if v is None or isinstance(v, (bool, int, float, str)):
            # Exact types only: True is not 1 to a schema; a subclass is never recorded.
            out.append(f"{type(v).__qualname__}:{v!r}")
            return type(v) in (type(None), bool, int, float, str)
        if type(v) is list:
            out.append(f"[{len(v)}")
            return all(walk(item) for item in v)
        if type(v) is dict:
            out.append(f"{{{len(v)}")
            for k in sorted(v, key=repr):
                if type(k) is not str:
                    return False
                out.append(repr(k))
                if not walk(v[k]):
                    return False
            return True
        return False

    return "\n".join(out) if walk(value) else None


@cache
def checker() -> bytes:
    """What the verdicts depend on besides schema and document: this module and the installed
    jsonschema (its files' sizes and times: an upgrade replaces them)."""
    parts = [Path(__file__).read_bytes()]
    spec = importlib.util.find_spec("jsonschema")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        for name in ("__init__.py", "validators.py", "_keywords.py"):
            stat = (package / name).stat()
            parts.append(f"{package / name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return b"\0".join(parts)


@cache
def _recorded(path: Path) -> list[str]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(found, list) or not all(isinstance(k, str) for k in found):
        return []
    return found
