"""Credentials out of anything shown: the one place URLs and logs are made fit for a log, an
error, status output or JSON.

A package index URL may carry a token (`https://user:token@mirror/simple`, a token as a path
segment, `?token=`): settings errors, the engine's log line and `status --json` all pass what
they show through `redact_text`. Journal text (a failed rank's last lines, which hold SGLang's
`server_args=ServerArgs(..., api_key='...')`) goes through `mask_journal`. The host scripts that
print a journal (files/wait_healthy.py, files/smoke.py) run with the standard library only and
carry the block below as an exact copy; tests/unit/test_redact.py pins each copy to this one.
"""

from __future__ import annotations

import re
from typing import Any

# ---- masking: copied verbatim into files/wait_healthy.py and files/smoke.py ----
MASK = "***"
_URL = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>[^\s'\"<>`]+)")
# USERINFO@ at the start of what follows "://". A password may hold '/' or '@' (`user:pa/ss@h`,
# `user:p@ss@h`): it runs to the '@' that a host and the end of the authority follow. Userinfo
# without ':' (a bare token) stops at the first '/', '?' or '#'; hf://org/name@rev has none.
_USERINFO = re.compile(
    r"^(?:[^/@?#:]*:.*?|[^/@?#:]*)@(?=[A-Za-z0-9.\-\[\]:]+(?:[/?#),;]|$))", re.DOTALL
)
# A token as a path segment of an http(s) URL: after /t/ (anaconda.org), or a long random
# segment (Gemfury, Cloudsmith: https://dl.cloudsmith.io/TOKEN/org/repo/python/simple/).
_PATH_TOKEN = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_~-]{20,}$")
# name=value fields (ServerArgs' repr, an environment dump) and flags, in any log line.
_SECRET_FIELD = re.compile(
    r"(?P<name>\b(?:[a-z_]*api_key|[a-z_]*hf_token|HF_TOKEN|token|password|secret)\s*[=:]\s*)"
    r"(?!None\b)(?:'[^']*'|\"[^\"]*\"|[^\s,)'\"]+)"
)
_SECRET_FLAG = re.compile(r"(?P<name>(?:--[a-z-]*api-key|--token|Bearer)[ =]+)[^\s'\",)]+")


def _mask_url(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    rest = _USERINFO.sub(MASK + "@", rest, count=1)
    if scheme.lower() not in ("http", "https"):
        return f"{scheme}://{rest}"
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    head, slash, tail = path.partition("/")
    parts = tail.split("/") if slash else []
    for i, part in enumerate(parts):
        if (i > 0 and parts[i - 1] == "t") or _PATH_TOKEN.match(part):
            parts[i] = MASK
    if question:
        pairs = query.split("&")
        query = "&".join(p.split("=", 1)[0] + "=" + MASK if "=" in p else p for p in pairs)
    return f"{scheme}://{head}{slash}{'/'.join(parts)}{question}{query}{hash_}{fragment}"


def mask_journal(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Text with every credential masked: each of `secrets` (the key itself, where it is
    known) wherever it appears, URL userinfo, query values and path tokens, fields such as
    api_key='...' (SGLang logs its ServerArgs at start) and --api-key/Bearer values."""
    for secret in secrets:
        if secret.strip():
            text = text.replace(secret.strip(), MASK)
    text = _URL.sub(_mask_url, text)
    text = _SECRET_FIELD.sub(lambda m: m.group("name") + repr(MASK), text)
    return _SECRET_FLAG.sub(lambda m: m.group("name") + MASK, text)


# ---- end of the copied block ----


def redact(url: str) -> str:
    """One URL with its credentials (user:token@, query values, path tokens) replaced by ***;
    anything else unchanged.

    >>> redact("https://user:tok@mirror.example/simple")
    'https://***@mirror.example/simple'
    """
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL's credentials in a free text (an error line, a repr) replaced by ***."""
    return _URL.sub(_mask_url, text)


def redact_data(value: Any) -> Any:
    """A JSON-like value with every string passed through redact_text (dict keys too)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    return value
