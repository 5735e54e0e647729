"""Credentials out of anything shown: the one place URLs are made fit for a log, an error,
status output or JSON.

A package index URL may carry a token (`https://user:token@mirror/simple`): settings errors,
the engine's log line and `status --json` all pass what they show through here.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# scheme://userinfo@ ; userinfo stops at the first '/', '@' or whitespace after '://'.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s'\"]*)@")


def redact(url: str) -> str:
    """One URL with its credentials (user:token@) replaced by ***; anything else unchanged.

    >>> redact("https://user:tok@mirror.example/simple")
    'https://***@mirror.example/simple'
    """
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL's credentials in a free text (an error line, a repr) replaced by ***."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def redact_data(value: Any) -> Any:
    """A JSON-like value with every string passed through redact_text (dict keys too)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    return value
