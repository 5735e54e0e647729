"""The ranks' API key, read on the host from SGLang's --config file (layout.SECRETS_FILE,
`api-key: "KEY"`: operations/plan/serve_plan.py secrets_text writes it, JSON string syntax).

One reader for every host program that needs the key: the smoke (a client's request), the
router launcher (smg's --api-key, from its credential copy) and the drain script (the key smg
sends a re-added rank). Never printed, never on a command line.
"""

from __future__ import annotations

import json


def read_api_key(path: str | None) -> str | None:
    """The key in `path`; None when no path is given, the file is absent (no key configured: the
    ranks ask for none) or it holds no `api-key:` line. Other OSErrors are raised."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "api-key":
            value = value.strip()
            parsed = json.loads(value) if value.startswith('"') else value
            return str(parsed) or None
    return None
