"""The smoke's known-answer question and how an answer is judged, pure (no request is sent
here): the prompt contract, the chat request that asks it, and the judges of a raw answer.

Not run on its own: inlined into programs/smoke.py (which asks each target) and
programs/canary_compare.py (which asks a canary rank and a baseline rank the same question) by
operations/render/host_scripts.py. Where SGLang reads the request's fields: smoke.py's docstring.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import TypedDict

# The prompt contract (doubles of a model answer it: keep its shape): two integers joined by
# `+`, the sum the answer.
QUESTION = "What is {a} + {b}? Reply with the number only."
# "742", or an echo "317 + 425 = 742" (Qwen tokenises digits one by one): well under 32.
MAX_TOKENS = 32
# Thinking off through the chat template (smoke.py's docstring: where SGLang reads it).
TEMPLATE_KWARGS = {"enable_thinking": False}
BODY_SHOWN = 120  # characters of a bad body quoted in the verdict


# -- judging raw answers (pure) --------------------------------------------------------------


def _quote(body: str) -> str:
    text = body.strip().replace("\n", " ")
    return repr(text[:BODY_SHOWN] + ("..." if len(text) > BODY_SHOWN else ""))


def _json_object(status: int | None, body: str, what: str) -> tuple[dict[str, object] | None, str]:
    """The answer's JSON object (each field judged by the caller), else None and why not."""
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


def operands() -> tuple[int, int]:
    """Two random 3-digit integers, a new pair for every request."""
    return 100 + secrets.randbelow(900), 100 + secrets.randbelow(900)


def question(a: int, b: int) -> str:
    return QUESTION.format(a=a, b=b)


# Integers and decimals as a model writes them ("742", "1,042", "742.0", "-742"); not part of a
# longer number or word.
_NUMBER = re.compile(r"(?<![\w.,])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def answer_text(content: str) -> str:
    """What a reply's content answers, its thinking left out. Qwen3's format is
    `(<think>)*(.*)</think>` (the opening tag may be in the prompt, not the output: SGLang's
    Qwen3Detector, python/sglang/srt/parser/reasoning_parser.py): what follows the last
    </think> is the answer; an opened <think> that never closed is all thinking (cut off)."""
    if THINK_CLOSE in content:
        return content.rsplit(THINK_CLOSE, 1)[1].strip()
    if THINK_OPEN in content:
        return ""
    return content.strip()


def numbers(text: str) -> list[float]:
    return [float(m.group().replace(",", "")) for m in _NUMBER.finditer(text)]


def judge_sum(content: str, a: int, b: int) -> str | None:
    """Why `content` does not answer "What is A + B?" truthfully; None when it does.

    Right: the sum is among the answer's numbers and every other number is one of the two
    operands (an echo, "317 + 425 = 742"). Several candidates ("742 or 743"), working
    ("300 + 400 = 700, ...") or a wrong number fail: a rank that hedges has not answered."""
    found = numbers(answer_text(content))
    if not found:
        return "no number in the answer"
    total = a + b
    if total not in found:
        return f"the sum is {total}"
    others = sorted({n for n in found if n not in (total, a, b)})
    if others:
        extra = ", ".join(f"{n:g}" for n in others)
        return f"the sum is {total}, and it also says {extra}"
    return None


def judge_chat(
    status: int | None, body: str, model: str, asked: tuple[int, int] | None = None
) -> tuple[str | None, int | None]:
    """(why the chat completion answer is wrong or None, completion tokens). `asked`: the
    operands of the question (None: the answer's truth is not judged)."""
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
    if asked is not None:
        said = message.get("content")
        content = said if isinstance(said, str) else ""
        wrong = judge_sum(content, *asked)
        if wrong is not None:
            if not content.strip():
                # Only reasoning_content: thinking was not disabled (or not by this template).
                wrong += ": the content is empty, all of it reasoning (thinking not disabled)"
            asked_text = question(*asked)
            return (
                f"{what}: not a truthful answer: asked {asked_text!r}, answered "
                f"{_quote(content)} ({wrong})",
                None,
            )
    return None, tokens


class Message(TypedDict):
    role: str
    content: str


class ChatRequest(TypedDict):
    """The body of a POST /v1/chat/completions (OpenAI's chat API, as SGLang serves it)."""

    model: str
    messages: list[Message]
    max_tokens: int
    temperature: int
    chat_template_kwargs: dict[str, bool]


def chat_request(model: str, a: int, b: int) -> ChatRequest:
    """The OpenAI chat request asking "What is A + B?", greedy, thinking off."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": question(a, b)}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "chat_template_kwargs": dict(TEMPLATE_KWARGS),
    }
