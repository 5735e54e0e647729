#!/usr/bin/env python3
"""Ask each SGLang rank (and the router) a chat question as a client does, and judge the answer.

Shipped to the host by the deploy (operations/smoke.py) and run there by an engine
environment's python: the ranks may listen on addresses only the host reaches, and the API key
is in a root-only file there. The client is httpx, which that environment has as the OpenAI
client's own transport (SGLang requires openai), sending the OpenAI API's documented requests
as the openai client does: `Authorization: Bearer KEY`, POST BASE/chat/completions with a JSON
body {model, messages, max_tokens, temperature}. (The openai package itself takes 0.5 s to
import, more than every request here together: bench/smoke_bench.py.) For each target it asks
GET /v1/models (the served name must be listed) and then COUNT times POST /v1/chat/completions
(`model` = the served name), and judges the raw answer: a 200 with an empty or malformed body,
another model's name, or no answer at all fails that target. The deploy's smoke step and
`python -m operations.status --probe` both run it.

    smoke.py --model NAME --timeout S [--key-file FILE] [--json] [--journal] NAME=URL[*COUNT]...

NAME is a unit (`sglang@3.service`) or `router` (its /v1/models is its own, not a rank's: only
its chat answers are judged); URL is the OpenAI base URL
(`http://127.0.0.1:30003/v1`). The key is read from FILE (SGLang's --config file, `api-key:`),
never from the command line, and never printed. --json prints one `smoke {...}` line per target
(status); --journal prints a failed unit's journal tail (the deploy). Exit status 1 when any
target did not answer right.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

JOURNAL_LINES = 40

# ---- masking: an exact copy of operations/redact.py's block (test_redact.py pins it) ----
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
# The router answers GET /v1/models itself, not from a worker (sglang-router 0.3.2 lists
# "unknown": seen in tests/e2e/test_smoke.py), so through it only the chat answers are judged.
ROUTER = "router"
QUESTION = "Reply with one word: ready?"
MAX_TOKENS = 16
BODY_SHOWN = 120  # characters of a bad body quoted in the verdict


@dataclass(frozen=True)
class Verdict:
    target: str
    answered: bool
    latency_s: float | None = None
    tokens: int | None = None
    requests: int = 0
    why: str | None = None


# -- judging raw answers (pure) --------------------------------------------------------------


def _quote(body: str) -> str:
    text = body.strip().replace("\n", " ")
    return repr(text[:BODY_SHOWN] + ("..." if len(text) > BODY_SHOWN else ""))


def _json_object(status: int | None, body: str, what: str) -> tuple[dict[str, Any] | None, str]:
    if status is None:
        return None, f"{what}: no answer"
    if status != 200:
        return None, f"{what}: HTTP {status} {_quote(body)}"
    if not body.strip():
        return None, f"{what}: 200 with an empty body"
    try:
        data = json.loads(body)
    except ValueError:
        return None, f"{what}: 200 with a malformed body {_quote(body)}"
    if not isinstance(data, dict):
        return None, f"{what}: 200 with a body that is not a JSON object {_quote(body)}"
    return data, ""


def judge_models(status: int | None, body: str, model: str) -> str | None:
    """Why a GET /v1/models answer is wrong; None when it lists `model`."""
    data, why = _json_object(status, body, "GET /v1/models")
    if data is None:
        return why
    cards = data.get("data")
    if not isinstance(cards, list):
        return f"GET /v1/models: 200 without a model list {_quote(body)}"
    ids = [card.get("id") for card in cards if isinstance(card, dict)]
    if model not in ids:
        return f"GET /v1/models: serves {ids!r}, not {model!r}"
    return None


def judge_chat(status: int | None, body: str, model: str) -> tuple[str | None, int | None]:
    """(why the chat completion answer is wrong or None, completion tokens)."""
    what = "POST /v1/chat/completions"
    data, why = _json_object(status, body, what)
    if data is None:
        return why, None
    if data.get("model") != model:
        return f"{what}: answered for model {data.get('model')!r}, not {model!r}", None
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return f"{what}: 200 without choices[0].message {_quote(body)}", None
    # A reasoning model's first tokens may all go to reasoning_content (a reasoning parser).
    text = [message.get(k) for k in ("content", "reasoning_content")]
    if not any(isinstance(t, str) and t.strip() for t in text):
        return f"{what}: 200 with an empty message {_quote(body)}", None
    usage = data.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return f"{what}: 200 without usage.completion_tokens {_quote(body)}", None
    return None, tokens


def parse_target(word: str) -> tuple[str, str, int]:
    """NAME=URL[*COUNT] -> (name, base URL, count)."""
    name, sep, rest = word.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"not NAME=URL[*COUNT]: {word!r}")
    url, star, count = rest.partition("*")
    return name, url.rstrip("/"), int(count) if star else 1


def read_key(path: str | None) -> str | None:
    """The API key from SGLang's --config file (`api-key: "..."`, operations/serve.py)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None  # no key configured: the servers do not ask for one
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "api-key":
            value = value.strip()
            parsed = json.loads(value) if value.startswith('"') else value
            return str(parsed) or None
    return None


# -- asking (httpx, on the host) --------------------------------------------------------------


def _httpx() -> Any:
    """The engine environment has httpx (the openai client's transport); the controller need
    not, so it is imported here, on the host."""
    return importlib.import_module("httpx")


def _client(key: str | None, timeout: float) -> Any:
    httpx = _httpx()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # The ranks are this host's own: no proxy from the environment may answer for them.
    return httpx.Client(trust_env=False, timeout=timeout, headers=headers)


def _raw(call: Any) -> tuple[int | None, str]:
    """(HTTP status or None when nothing answered, body) of one request."""
    httpx = _httpx()
    try:
        response = call()
        return response.status_code, response.text
    except httpx.TimeoutException:
        return None, "timeout"
    except httpx.HTTPError as error:
        return None, f"connection failed ({error})"


def ask(name: str, base: str, count: int, model: str, key: str | None, timeout: float) -> Verdict:
    client = _client(key, timeout)
    if name != ROUTER:
        status, body = _raw(lambda: client.get(f"{base}/models"))
        why = judge_models(status, body, model)
        if status is None:
            why = f"GET /v1/models: no answer ({body})"
        if why is not None:
            return Verdict(name, False, why=why)
    request = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    latencies, tokens = [], 0
    for _ in range(count):
        started = time.monotonic()
        status, body = _raw(lambda: client.post(f"{base}/chat/completions", json=request))
        latencies.append(time.monotonic() - started)
        why, got = judge_chat(status, body, model)
        if status is None:
            why = f"POST /v1/chat/completions: no answer ({body})"
        if why is not None:
            return Verdict(name, False, latencies[-1], requests=len(latencies), why=why)
        tokens += got or 0
    latency = round(max(latencies), 3) if latencies else None
    return Verdict(name, True, latency, tokens, len(latencies))


def journal(unit: str, key: str | None) -> str:
    """The unit's last lines, masked for the key (SGLang logs its ServerArgs at start)."""
    return mask_journal(
        subprocess.run(
            ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout,
        (key,) if key else (),
    )


def describe(v: Verdict) -> str:
    if v.answered:
        return f"{v.target}: answered {v.requests} request(s), {v.latency_s}s, {v.tokens} tokens"
    return f"{v.target}: did NOT answer as a client expects: {v.why}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--key-file")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--journal", action="store_true")
    parser.add_argument("targets", nargs="+", metavar="NAME=URL[*COUNT]")
    args = parser.parse_args(argv)
    targets = [parse_target(word) for word in args.targets]
    key = read_key(args.key_file)

    def one(target: tuple[str, str, int]) -> Verdict:
        name, base, count = target
        try:
            return ask(name, base, count, args.model, key, args.timeout)
        except Exception as error:  # one target's failure is its verdict, not a traceback
            return Verdict(name, False, why=f"{type(error).__name__}: {error}")

    with ThreadPoolExecutor(max(1, len(targets))) as pool:
        verdicts = list(pool.map(one, targets))
    for verdict in verdicts:
        if args.json:
            print("smoke", json.dumps(asdict(verdict)), flush=True)
        else:
            print(describe(verdict), flush=True)
    failed = [v for v in verdicts if not v.answered]
    if args.journal:
        for verdict in failed:
            if verdict.target.endswith(".service"):
                print(f"{verdict.target}: last {JOURNAL_LINES} journal lines:", flush=True)
                print(journal(verdict.target, key), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
