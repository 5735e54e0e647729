"""TEST DOUBLE of SGLang's POST /v1/completions, generating tokens at a configured rate.

Each request decodes `max_tokens` tokens (ignore_eos, as the benchmark client asks) at
SGLANG_DOUBLE_TOKENS_PER_S tokens per second per request (default 2000; set in a unit drop-in,
it makes a rank, or a "release", slower), after its prompt's tokens (one word one token).
Shapes from the 0.5.11 wheel, sglang/srt/entrypoints/openai/protocol.py: CompletionResponse
:368-377 (id, object "text_completion", created, model, choices [{index, text, logprobs,
finish_reason, matched_stop}], usage), CompletionStreamResponse :402-409 and UsageInfo :131-137
(prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details, reasoning_tokens).
- `"stream": true`: one `data: {...}` chunk per token (a CompletionStreamResponse, text one
  token), the last with finish_reason "length", then, when the request's stream_options asks
  include_usage, a chunk with `choices: []` and the usage (serving_completions.py:399-417), then
  `data: [DONE]`;
- not streamed: one CompletionResponse with the whole text and its usage.
What it generated is counted in the rank's counters and gauges (Gen, read by metrics_text):
sglang:prompt_tokens_total, sglang:generation_tokens_total (TokenizerMetricsCollector,
0.5.11 srt/observability/metrics_collector.py:1212-1213), sglang:gen_throughput ("The
generation throughput (token/s).", :218-222: here the tokens of the last WINDOW_S seconds)
and sglang:token_usage ("The token usage.", :240-244: here the running requests' tokens over
MAX_TOTAL_TOKENS).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

TOKENS_PER_S_ENV = "SGLANG_DOUBLE_TOKENS_PER_S"
WINDOW_S = 5.0
MAX_TOTAL_TOKENS = 262144


class Gen:
    """What the completions generated, for /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generated = 0
        self.requests = 0
        self.running_tokens = 0
        self.recent: deque[float] = deque()
        self.tokens_per_s = float(os.environ.get(TOKENS_PER_S_ENV, "2000") or 2000)

    def token(self) -> None:
        now = time.monotonic()
        with self.lock:
            self.generated += 1
            self.running_tokens += 1
            self.recent.append(now)

    def gen_throughput(self) -> float:
        now = time.monotonic()
        with self.lock:
            while self.recent and self.recent[0] < now - WINDOW_S:
                self.recent.popleft()
            return len(self.recent) / WINDOW_S

    def token_usage(self) -> float:
        with self.lock:
            return min(1.0, self.running_tokens / MAX_TOTAL_TOKENS)


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt or "").split()) or 1


def _chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    # HTTP/1.0 (the double's server): the stream's body ends when the connection closes.
    handler.wfile.write(data)
    handler.wfile.flush()


def complete(
    handler: BaseHTTPRequestHandler, gen: Gen, request: dict[str, Any], model: str
) -> None:
    """Answer one /v1/completions request (see the docstring)."""
    prompt = _prompt_tokens(request.get("prompt"))
    count = max(1, int(request.get("max_tokens") or 16))
    created, rid = int(time.time()), f"cmpl-double-{time.monotonic_ns()}"
    usage = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + count,
        "completion_tokens": count,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    with gen.lock:
        gen.prompt_tokens += prompt
        gen.running_tokens += prompt
    step = 1.0 / gen.tokens_per_s
    stream = bool(request.get("stream"))
    try:
        if stream:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
        start = time.monotonic()
        for n in range(count):
            # The double's decode time, paced from the start (not synchronisation).
            time.sleep(max(0.0, start + (n + 1) * step - time.monotonic()))
            gen.token()
            if stream:
                choice = {
                    "index": 0,
                    "text": "tok ",
                    "logprobs": None,
                    "finish_reason": "length" if n == count - 1 else None,
                    "matched_stop": None,
                }
                body = {"id": rid, "object": "text_completion", "created": created}
                body.update(model=model, choices=[choice])
                _chunk(handler, f"data: {json.dumps(body)}\n\n".encode())
        if stream:
            options = request.get("stream_options") or {}
            if isinstance(options, dict) and options.get("include_usage"):
                body = {"id": rid, "object": "text_completion", "created": created}
                body.update(model=model, choices=[], usage=usage)
                _chunk(handler, f"data: {json.dumps(body)}\n\n".encode())
            _chunk(handler, b"data: [DONE]\n\n")
            return
        choice = {
            "index": 0,
            "text": "tok " * count,
            "logprobs": None,
            "finish_reason": "length",
            "matched_stop": None,
        }
        data = json.dumps(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        ).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    finally:
        with gen.lock:
            gen.requests += 1
            gen.running_tokens -= prompt + count
