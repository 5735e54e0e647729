"""settings.schema.json: its reading, each setting's default, and one schema error in the words
a refusal uses (the key, and what is accepted)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import jsonschema

SCHEMA_PATH = Path(__file__).parent / "settings.schema.json"


# One setting's entry in settings.schema.json, the keys read here (jsonschema reads them all).
PropertySchema = TypedDict(
    "PropertySchema",
    {
        "type": str | list[str],
        "default": Any,
        "description": str,
        "x-accepts": str,
        "properties": dict[str, object],
    },
    total=False,
)


class SettingsSchema(TypedDict):
    """settings.schema.json, as this package and its tests read it."""

    required: list[str]
    properties: dict[str, PropertySchema]


@cache
def schema() -> SettingsSchema:
    loaded: SettingsSchema = json.loads(SCHEMA_PATH.read_text())
    return loaded


def defaults() -> dict[str, object]:
    """Each setting's default, as settings.schema.json spells it (JSON: converted by load)."""
    return {k: p["default"] for k, p in schema()["properties"].items() if "default" in p}


def describe(
    error: jsonschema.ValidationError, props: Mapping[str, PropertySchema]
) -> tuple[str, str]:
    """(key, what is accepted) for one schema error."""
    if error.validator == "required":
        missing = str(error.message).split("'")[1]
        return missing, props[missing].get("x-accepts", "a value")
    key = str(error.absolute_path[0]) if error.absolute_path else "?"
    prop = props.get(key, {})
    accepts = prop.get("x-accepts", error.message)
    path = ".".join(map(str, error.absolute_path))
    sub = _sub_accepts(prop, error.absolute_path[1]) if len(error.absolute_path) > 1 else None
    if sub is not None:
        # A mapping whose keys say what they accept (rollout): that key's words, and its value.
        accepts = f"{path}: {sub}; found {error.instance!r}"
    elif len(error.absolute_path) > 1:
        accepts = f"{accepts} ({path}: {error.message})"
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(_sub_properties(prop))
        unknown = sorted(str(k) for k in error.instance if k not in known)
        accepts = f"{accepts} ({', '.join(f'{key}.{k}' for k in unknown)}: not a key of it)"
    return key, accepts


def _sub_properties(prop: PropertySchema) -> dict[str, object]:
    found = prop.get("properties")
    return found if isinstance(found, dict) else {}


def _sub_accepts(prop: PropertySchema, sub_key: object) -> str | None:
    """What a mapping's key accepts, when its schema says (its own "x-accepts")."""
    sub = _sub_properties(prop).get(str(sub_key))
    accepts = sub.get("x-accepts") if isinstance(sub, dict) else None
    return accepts if isinstance(accepts, str) else None
