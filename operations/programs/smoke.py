#!/usr/bin/env python3
"""Ask each SGLang rank (and the router) a chat question as a client does, and judge the answer.

Shipped to the host by the deploy (operations/steps/smoke.py) and run there by an engine
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

Each chat request asks a question whose answer is known here and differs every request (issue
27): "What is A + B? Reply with the number only.", A and B two 3-digit integers drawn on the
host (`secrets`), `temperature: 0`, thinking disabled through the chat template
(`chat_template_kwargs: {"enable_thinking": false}`: SGLang's ChatCompletionRequest has the
field, python/sglang/srt/entrypoints/openai/protocol.py, and `_apply_jinja_template` passes it
to the tokenizer's apply_chat_template, serving_chat.py: 0.5.10 wheel lines 618 and 481-482,
0.5.11 lines 646 and 585-586, 0.5.23 lines 1020 and 2166-2167; sglang-router 0.3.2 forwards it,
src/protocols/chat.rs:353). The reply's content must hold the sum (judge_sum): a fluent answer
with a wrong number fails the target, naming the question and the answer, masked as journals
are. Keep the contract exactly this shape (two integers joined by `+`, the sum the answer): the
server double answers it (tests/doubles/packages/sglang/_server_double.py).

    smoke.py --model NAME --timeout S --service-user USER [--key-file FILE] [--json] [--journal]
        [--unit NAME=UNIT]... [--router-worker UNIT=URL]... NAME=URL[*COUNT]...

NAME is a unit (`sglang@3.service`) or `router` (its /v1/models is its own, not a rank's: only
its chat answers are judged); URL is the OpenAI base URL
(`http://127.0.0.1:30003/v1`). The key is read from FILE (SGLang's --config file, `api-key:`),
never from the command line, and never printed. --json prints one `smoke {...}` line per target
(status); --journal prints a failed unit's journal tail (the deploy). Exit status 1 when any
target did not answer right.

Before every request, nothing is sent (neither the key nor the question) unless the TCP listener
on the target's address and port belongs to USER (its uid in /proc/net/tcp or tcp6, the name
resolved here) and the target's unit (--unit NAME=UNIT; a NAME that is a unit names itself) is
active; through the router, also each --router-worker of this host that listens. Otherwise the
target fails naming the port and its owner (docs/how-it-works/security.md, "Who is sent the API
key").
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from operations.programs.api_key_file import read_api_key
from operations.programs.hostsafe import (
    JOURNAL_LINES,
    journal,
    listening,
    mask_journal,
    owner_problem,
    read_listeners,
    state_problem,
    units_active,
)
from operations.programs.smoke_answers import chat_request, judge_chat, judge_models, operands

# The router answers GET /v1/models itself, not from a worker (sglang-router 0.3.2 lists
# "unknown": seen in tests/e2e/test_smoke.py), so through it only the chat answers are judged.
ROUTER = "router"
AT_ONCE = 8  # a target's chat requests in flight together (smoke_router_requests: up to 64)


@dataclass(frozen=True)
class Verdict:
    target: str
    answered: bool
    latency_s: float | None = None
    tokens: int | None = None
    requests: int = 0
    why: str | None = None


def parse_target(word: str) -> tuple[str, str, int]:
    """NAME=URL[*COUNT] -> (name, base URL, count)."""
    name, sep, rest = word.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"not NAME=URL[*COUNT]: {word!r}")
    url, star, count = rest.partition("*")
    return name, url.rstrip("/"), int(count) if star else 1


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


def _no_guard() -> str | None:
    return None


def ask(
    name: str,
    base: str,
    count: int,
    model: str,
    key: str | None,
    timeout: float,
    guard: Callable[[], str | None] = _no_guard,
) -> Verdict:
    """`guard` runs before every request: a reason from it ends the target's turn, and nothing
    (no key, no question) is sent to it."""

    def refused() -> Verdict | None:
        why = guard()
        if why is None:
            return None
        return Verdict(name, False, why=f"nothing sent (the API key stays here): {why}")

    if (stop := refused()) is not None:
        return stop
    client = _client(key, timeout)  # made once the listener is known to be the service user's
    if name != ROUTER:
        status, body = _raw(lambda: client.get(f"{base}/models"))
        why = judge_models(status, body, model)
        if status is None:
            why = f"GET /v1/models: no answer ({body})"
        if why is not None:
            return Verdict(name, False, why=why)

    def one(index: int) -> tuple[float | None, int, Verdict | None]:
        """One chat request: (its latency or None when nothing was sent, its tokens, the
        target's failed verdict or None)."""
        # The router's first request follows the guard made above, at once.
        if (index or name != ROUTER) and (stop := refused()) is not None:
            return None, 0, stop
        asked = operands()
        request = chat_request(model, *asked)
        started = time.monotonic()
        status, body = _raw(lambda: client.post(f"{base}/chat/completions", json=request))
        latency = time.monotonic() - started
        why, got = judge_chat(status, body, model, asked)
        if status is None:
            why = f"POST /v1/chat/completions: no answer ({body})"
        if why is not None:
            return latency, 0, Verdict(name, False, round(latency, 3), why=why)
        return latency, got or 0, None

    # COUNT requests (the router's) go at once (AT_ONCE at a time), as clients send them:
    # each is guarded and judged alone, and the target's time is one answer's, not COUNT of
    # them. An httpx Client may be shared between threads (its docstring, encode/httpx
    # httpx/_client.py, PR #2380).
    with ThreadPoolExecutor(max(1, min(count, AT_ONCE))) as pool:
        answers = list(pool.map(one, range(count)))
    sent = sum(1 for latency, _, _ in answers if latency is not None)
    for _, _, failed in answers:
        if failed is not None:
            return replace(failed, requests=sent)
    latencies = [latency for latency, _, _ in answers if latency is not None]
    tokens = sum(got for _, got, _ in answers)
    latency = round(max(latencies), 3) if latencies else None
    return Verdict(name, True, latency, tokens, len(latencies))


def describe(v: Verdict) -> str:
    if v.answered:
        return f"{v.target}: answered {v.requests} request(s), {v.latency_s}s, {v.tokens} tokens"
    return f"{v.target}: did NOT answer as a client expects: {v.why}"


def guard_for(name: str, base: str, args: argparse.Namespace) -> Callable[[], str | None]:
    """The check made before each request to a target: its listener is the service user's and
    its unit (`--unit NAME=UNIT`, or NAME itself when it is a unit) is active. Through the
    router, the key reaches its workers too: every rank of this host it may forward to
    (`--router-worker UNIT=URL`) is, when something listens there, the service user's and
    active. (Workers on other hosts are checked by their own host's deploy.) One check reads
    the listeners once and asks systemd once, for the target's unit and the workers' together
    (a `systemctl show` each was most of a router request's time: bench/roll_bench.py)."""
    units = dict(word.split("=", 1) for word in args.unit)
    unit = units.get(name, name if name.endswith(".service") else "")
    workers = [word.split("=", 1) for word in args.router_worker] if name == ROUTER else []

    def check() -> str | None:
        if not unit:
            return f"no unit named for {name!r} (--unit NAME=UNIT)"
        listeners = read_listeners()
        where, reaching = listening(base, listeners)
        why = owner_problem(where, reaching, args.service_user)
        if why is not None:
            return why
        forwarded: list[tuple[str, str]] = []
        for worker_unit, url in workers:
            at, reaching = listening(url, listeners)
            if reaching:
                why = owner_problem(at, reaching, args.service_user)
                if why is not None:
                    return f"the router forwards to {at}: {why}"
                forwarded.append((worker_unit, at))
        states = units_active([unit, *(u for u, _ in forwarded)])
        why = state_problem(unit, where, states[unit])
        if why is not None:
            return why
        for worker_unit, at in forwarded:
            why = state_problem(worker_unit, at, states[worker_unit])
            if why is not None:
                return f"the router forwards to {at}: {why}"
        return None

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--key-file")
    # Whose listeners may be asked (and sent the key): a name, resolved to a uid here.
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--unit", action="append", default=[], metavar="NAME=UNIT")
    parser.add_argument("--router-worker", action="append", default=[], metavar="UNIT=URL")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--journal", action="store_true")
    parser.add_argument("targets", nargs="+", metavar="NAME=URL[*COUNT]")
    args = parser.parse_args(argv)
    targets = [parse_target(word) for word in args.targets]
    key = read_api_key(args.key_file)

    def one(target: tuple[str, str, int]) -> Verdict:
        name, base, count = target
        try:
            guard = guard_for(name, base, args)
            return ask(name, base, count, args.model, key, args.timeout, guard)
        except Exception as error:  # one target's failure is its verdict, not a traceback
            return Verdict(name, False, why=f"{type(error).__name__}: {error}")

    with ThreadPoolExecutor(max(1, len(targets))) as pool:
        # A reply is the model's text, shown as a journal is: masked, the key included.
        known = (key,) if key else ()
        verdicts = [
            replace(v, why=mask_journal(v.why, known)) if v.why else v
            for v in pool.map(one, targets)
        ]
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
                print(journal(verdict.target, (key,) if key else ()), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
