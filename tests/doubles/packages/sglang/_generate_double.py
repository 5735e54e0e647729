"""TEST DOUBLE of SGLang's POST /v1/completions: a scheduler that decodes one running batch.

A rank runs at most MAX_RUNNING requests at once (SGLANG_DOUBLE_MAX_RUNNING, else the server's
--max-running-requests, else 32); the rest wait in its queue, counted in sglang:num_queue_reqs,
as SGLang's scheduler keeps a waiting queue beside its running batch (0.5.11 srt/managers/
scheduler.py: "#queue-req", "#running-req"). Each step gives every running request one token and
takes (1 + BATCH_COST * (batch - 1)) / TOKENS_PER_S seconds (SGLANG_DOUBLE_TOKENS_PER_S, default
100: one request's decode rate; SGLANG_DOUBLE_BATCH_COST, default 0.05): a larger batch is
slower per step and faster in all, up to the running cap, as a GPU's decode is (the public
figure for one RTX PRO 6000 rises from 1,023 to 1,523 output tok/s between 32 and 64 requests at
once: knowledge/throughput.yaml). Past the cap more in flight only queues: the rank's capacity
is MAX_RUNNING / step(MAX_RUNNING). SGLANG_DOUBLE_SPEED_JITTER (default 0) draws this start's
speed within +-that fraction, as cards and starts differ by a few percent. These are a test's
knobs, set in a unit drop-in: nothing here claims a real card's numbers.

The levers the tune moves (operations/plan/tune_plan.py) act on it as they act on SGLang, in
shape only: a running batch larger than --cuda-graph-max-bs (unset: 256, 0.5.11's value for a
90-160 GiB card, knowledge/throughput.yaml sglang-gpu-memory-defaults) decodes "without graphs",
each step EAGER_COST times as long (SGLANG_DOUBLE_EAGER_COST, default 2.0; sgl-project/sglang
#33900: eager decode past the largest captured shape, "roughly a 4x per-token latency" on a small
model); and a --mem-fraction-static above SGLANG_DOUBLE_MEM_LIMIT (default 0.93) does not start:
the double prints a line shaped as PyTorch's out-of-memory error and exits 1 (`out_of_memory`).
Three more, each off by default so a test that sets no knob sees the speeds above:
- the KV cache: with SGLANG_DOUBLE_KV_REQUESTS = K (default 0: no limit) it admits at most
  K / --schedule-conservativeness requests at once (unset: 1.0), below the running cap: a
  lower value admits more, as SGLang's scheduler reserves each running request's remaining
  output times min(0.7 x the value, 1) when it admits another (0.5.11 srt/managers/
  scheduler.py:1128-1132, schedule_policy.py:438-445; knowledge/throughput.yaml
  sglang-conservativeness-0511). A test that draws K at random cannot know the best value;
- chunked prefill: each admitted request's prompt is prefilled in ceil(prompt tokens /
  --chunked-prefill-size) chunks (unset: 8192, 0.5.11's on a 90-160 GiB card), each stalling
  the batch's next step by SGLANG_DOUBLE_CHUNK_S seconds (default 0): smaller chunks cost a
  long prompt more steps (SGLang prefills one chunk per step between decode steps);
- speculative decoding (--speculative-algorithm given): each step gives every running
  request SGLANG_DOUBLE_SPEC_ACCEPT tokens (default 2: drafts accepted plus the verified one)
  and takes (1 + SGLANG_DOUBLE_SPEC_COST x batch) times as long (default 0.02: the draft and
  verify work grows with the batch, so a full batch gains little or loses; knowledge/
  throughput.yaml speculative, sglang#39515); without --max-running-requests it runs at most
  48 requests (SPEC_CAP: 0.5.11 server_args.py:3454-3458, sglang-spec-cap-0511).

Shapes from the 0.5.11 wheel, sglang/srt/entrypoints/openai/protocol.py: CompletionResponse
:368-377 (id, object "text_completion", created, model, choices [{index, text, logprobs,
finish_reason, matched_stop}], usage), CompletionStreamResponse :402-409 and UsageInfo :131-137
(prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details, reasoning_tokens).
- `"stream": true`: one `data: {...}` chunk per token (a CompletionStreamResponse, text one
  token), the last with finish_reason "length", then, when the request's stream_options asks
  include_usage, a chunk with `choices: []` and the usage (serving_completions.py:399-417), then
  `data: [DONE]`; a client that goes away has its request aborted (SGLang aborts a request
  whose connection closed);
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
import queue
import random
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

TOKENS_PER_S_ENV = "SGLANG_DOUBLE_TOKENS_PER_S"
MAX_RUNNING_ENV = "SGLANG_DOUBLE_MAX_RUNNING"
BATCH_COST_ENV = "SGLANG_DOUBLE_BATCH_COST"
JITTER_ENV = "SGLANG_DOUBLE_SPEED_JITTER"
EAGER_COST_ENV = "SGLANG_DOUBLE_EAGER_COST"
MEM_LIMIT_ENV = "SGLANG_DOUBLE_MEM_LIMIT"
KV_REQUESTS_ENV = "SGLANG_DOUBLE_KV_REQUESTS"
CHUNK_S_ENV = "SGLANG_DOUBLE_CHUNK_S"
SPEC_ACCEPT_ENV = "SGLANG_DOUBLE_SPEC_ACCEPT"
SPEC_COST_ENV = "SGLANG_DOUBLE_SPEC_COST"
DEFAULT_GRAPH_BS = 256
DEFAULT_CHUNK = 8192
SPEC_CAP = 48
WINDOW_S = 5.0
MAX_TOTAL_TOKENS = 262144
DEFAULT_MAX_RUNNING = 32


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


class Slot:
    """One request in the scheduler: the tokens it still needs, and where each one is put."""

    def __init__(self, count: int, prompt: int = 0) -> None:
        self.left = count
        self.prompt = prompt
        self.tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.gone = False


class Gen:
    """The rank's scheduler and what it generated, for /metrics."""

    def __init__(
        self,
        max_running: int | None = None,
        graph_bs: int | None = None,
        conservativeness: float | None = None,
        chunk: int | None = None,
        speculative: bool = False,
    ) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.prompt_tokens = 0
        self.generated = 0
        self.requests = 0
        self.running_tokens = 0
        self.recent: deque[float] = deque()
        rate = _env_float(TOKENS_PER_S_ENV, 100.0)
        jitter = _env_float(JITTER_ENV, 0.0)
        self.tokens_per_s = rate * (1 + random.uniform(-jitter, jitter))
        self.batch_cost = _env_float(BATCH_COST_ENV, 0.05)
        unset = SPEC_CAP if speculative else DEFAULT_MAX_RUNNING
        cap = os.environ.get(MAX_RUNNING_ENV) or max_running or unset
        self.max_running = max(1, int(cap))
        kv = _env_float(KV_REQUESTS_ENV, 0.0)
        if kv > 0:
            admitted = int(kv / (conservativeness if conservativeness else 1.0))
            self.max_running = max(1, min(self.max_running, admitted))
        self.graph_bs = graph_bs or DEFAULT_GRAPH_BS
        self.eager_cost = _env_float(EAGER_COST_ENV, 2.0)
        self.chunk = chunk or DEFAULT_CHUNK
        self.chunk_s = _env_float(CHUNK_S_ENV, 0.0)
        self.accept = max(1, int(_env_float(SPEC_ACCEPT_ENV, 2.0))) if speculative else 1
        self.spec_cost = _env_float(SPEC_COST_ENV, 0.02) if speculative else 0.0
        self.waiting: deque[Slot] = deque()
        self.running: list[Slot] = []
        self.thread: threading.Thread | None = None

    def step_s(self, batch: int) -> float:
        step = (1 + self.batch_cost * (batch - 1)) / self.tokens_per_s
        step *= 1 + self.spec_cost * batch
        return step * (self.eager_cost if batch > self.graph_bs else 1.0)

    def prefill_s(self, prompt: int) -> float:
        """The stall one admitted request's prefill adds (the docstring); a chunk size of -1
        (SGLang's "disabling chunked prefill") prefills a prompt in one step."""
        chunks = -(-prompt // self.chunk) if self.chunk > 0 else 1
        return chunks * self.chunk_s if prompt > 0 else 0.0

    def submit(self, slot: Slot) -> None:
        with self.lock:
            self.waiting.append(slot)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True)
                self.thread.start()
            self.wake.notify()

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            with self.lock:
                while not self.running and not self.waiting:
                    self.wake.wait()
                    due = time.monotonic()
                stall = 0.0
                while self.waiting and len(self.running) < self.max_running:
                    admitted = self.waiting.popleft()
                    stall += self.prefill_s(admitted.prompt)
                    self.running.append(admitted)
                batch = len(self.running)
            # The double's step time, paced from the last step (not synchronisation).
            due = max(time.monotonic(), due + stall + self.step_s(batch))
            time.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            with self.lock:
                kept = []
                for slot in self.running:
                    if slot.gone:
                        continue
                    made = min(self.accept, slot.left)
                    slot.left -= made
                    self.generated += made
                    self.running_tokens += made
                    for _ in range(made):
                        self.recent.append(now)
                        slot.tokens.put(True)
                    if slot.left > 0:
                        kept.append(slot)
                self.running = kept

    def counts(self) -> tuple[int, int]:
        """(running, queued) requests of the completions."""
        with self.lock:
            return len(self.running), len(self.waiting)

    def gen_throughput(self) -> float:
        now = time.monotonic()
        with self.lock:
            while self.recent and self.recent[0] < now - WINDOW_S:
                self.recent.popleft()
            return len(self.recent) / WINDOW_S

    def token_usage(self) -> float:
        with self.lock:
            return min(1.0, self.running_tokens / MAX_TOTAL_TOKENS)


def out_of_memory(mem_fraction_static: object) -> str | None:
    """The line a start fails with when --mem-fraction-static is above the double's limit
    (the docstring); None when it starts."""
    try:
        wanted = float(str(mem_fraction_static)) if mem_fraction_static is not None else None
    except ValueError:
        return None
    limit = _env_float(MEM_LIMIT_ENV, 0.93)
    if wanted is None or wanted <= limit:
        return None
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
        f"(the double: mem_fraction_static {wanted:g} is above {limit:g})"
    )


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
    stream = bool(request.get("stream"))
    slot = Slot(count, prompt)
    gen.submit(slot)
    got = 0
    try:
        if stream:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
        for n in range(count):
            slot.tokens.get()
            got += 1
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
        slot.gone = True  # a client that went away: its request is aborted
        with gen.lock:
            gen.requests += 1 if got == count else 0
            gen.running_tokens -= prompt + got
