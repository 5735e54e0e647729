"""Credentials out of anything shown: the one place URLs and logs are made fit for a log, an
error, status output or JSON.

A package index URL may carry a token (`https://user:token@mirror/simple`, a token as a path
segment, `?token=`): settings errors, the engine's log line and `status --json` all pass what
they show through `redact_text`. Journal text (a failed rank's last lines, which hold SGLang's
`server_args=ServerArgs(..., api_key='...')`) goes through `mask_journal`. Both are the host
scripts' own masking (operations/programs/hostsafe.py, standard library only), imported here: the
host scripts that print a journal (programs/wait_healthy.py, programs/smoke.py) get it inlined
(operations/render/host_scripts.py), so there is one copy.
"""

from __future__ import annotations

from typing import Any

from operations.programs.hostsafe import mask_journal, mask_urls

__all__ = ["mask_journal", "redact", "redact_data", "redact_text"]


def redact(url: str) -> str:
    """One URL with its credentials (user:token@, query values, path tokens) replaced by ***;
    anything else unchanged.

    >>> redact("https://user:tok@mirror.example/simple")
    'https://***@mirror.example/simple'
    """
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL's credentials in a free text (an error line, a repr) replaced by ***."""
    return mask_urls(text)


def redact_data(value: Any) -> Any:
    """A JSON-like value with every string passed through redact_text (dict keys too)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    return value
