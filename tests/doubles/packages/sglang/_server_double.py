"""TEST DOUBLE of SGLang's HTTP server, run by `python -m sglang.launch_server`.

It behaves like the real server where a deploy can observe it, with the standard library only:
- the command line is parsed with the pinned release's real option table (knowledge/cli,
  embedded at wheel-build time): an unknown or misspelled option exits 2 with argparse's
  "unrecognized arguments", as the real parser does;
- `--config FILE.yaml` (flat `option-name: value` keys) is merged into the command line, the
  command line winning, as sglang/srt/server_args_config_parser.py does;
- it needs CUDA_VISIBLE_DEVICES and a readable --model-path directory, else it exits 1;
- /health and /health_generate answer 503 while "loading" (SGLANG_DOUBLE_LOAD_SECONDS, default
  2, plus FlashInfer's JIT and Triton's autotune where the caches lack them), then 200; the
  start logs its phases in the release's words (sglang/_startup_double.py); /get_model_info,
  /get_server_info;
- GET /v1/models: a ModelList of one ModelCard whose id is the served model name
  (sgl-project/sglang python/sglang/srt/entrypoints/openai/protocol.py @ 004c82e07d87:
  ModelCard id/object "model"/created/owned_by "sglang"/root, ModelList object "list"/data);
- POST /v1/chat/completions: a ChatCompletionResponse (same file: id, object "chat.completion",
  created, model, choices [{index, message {role, content, reasoning_content, tool_calls},
  logprobs, finish_reason, matched_stop}], usage {prompt_tokens, total_tokens,
  completion_tokens, prompt_tokens_details, reasoning_tokens}); `model` is the request's, as
  serving_chat.py's response echoes it;
- /metrics only with --enable-metrics, in SGLang's Prometheus names, labelled model_name
  (python/sglang/srt/metrics/collector.py @ 93d04878cfb9: TokenizerMetricsCollector's counters
  sglang:prompt_tokens_total, sglang:generation_tokens_total, sglang:num_requests_total), so a
  test counts the requests each rank served;
- with --api-key every route except /health* and /metrics needs `Authorization: Bearer KEY`
  (401 {"error": "Unauthorized"} otherwise: sglang 0.5.11 wheel, sglang/srt/utils/auth.py,
  decide_request_auth lets /health* and /metrics through, _ApiKeyASGIMiddleware answers that).

- a chat completion takes SGLANG_DOUBLE_GENERATE_SECONDS (default 0) to answer, as a real
  decode takes time. It does not wait in the completions' scheduler (below), and its tokens
  are not counted as generated (sglang:num_requests_total counts it): a real rank under a
  saturating check answers chats seconds later, which on a two-rank testbed left smg no
  available worker while a roll drained the other (tests/e2e/test_canary.py), and free tokens
  counted would credit a slower rank with capacity it has not. While it runs it is counted in
  the gauge sglang:num_running_reqs, which
  SGLang's scheduler reports on /metrics as "The number of running requests." beside
  sglang:num_queue_reqs, "The number of requests in the waiting queue." (collector.py above,
  SchedulerMetricsCollector); a roll reads both to know when a rank has drained. The double
  queues nothing (every request runs at once) unless it is wedged (below).

- wedged (SIGUSR1 toggles it, as `systemctl kill -s SIGUSR1` reaches the unit's process): a
  scheduler that stopped producing tokens. New chat requests wait in the queue (counted in
  sglang:num_queue_reqs) without an answer until it is unwedged, and /health answers 503, as
  SGLang 0.5.11's /health does when its one-token generate gets no answer from the scheduler
  (sglang/srt/entrypoints/http_server.py:506-578, health_generate: 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT, 20 s; the double answers at once). Over HTTP that failing
  /health is what takes a wedged rank out of smg 1.13.0's routing: its own wedge rule
  (model_gateway/src/worker/liveness.rs:19-24 and 440-457, wedged_by_queue at 620-628) counts
  only tracked requests, which only its gRPC router books (routers/grpc/proto_wrapper.rs:
  2981-2984, DispatchBooking::book); an HTTP worker "never forms a pile and is never judged by
  one" (liveness.rs:55-58).

- the smoke's question (operations/programs/smoke.py QUESTION, the prompt contract: two integers
  joined by `+` in the last user message, "What is 317 + 425? Reply with the number only.") is
  answered with the sum, as a model that computes right does; any other prompt gets a fixed
  greeting. With thinking not disabled (`chat_template_kwargs` without `"enable_thinking":
  false`) it answers as a Qwen3 model does by default: SGLang's comment on the qwen3 reasoning
  parser's models reads "Models that thinking by default, and can be disabled by setting
  enable_thinking=False" (serving_chat.py _get_reasoning_from_request, 0.5.11 wheel lines
  1396-1397), their output is `(<think>)*(.*)</think>`
  (parser/reasoning_parser.py, Qwen3Detector), and no answer comes within the smoke's few tokens:
  the content is an unfinished <think> block, finish_reason "length".

- POST /v1/completions (the load client's requests) is decoded by a scheduler with a running
  cap and a queue, streamed or not, with `usage`, counted in /metrics with the running and
  queued gauges, sglang:gen_throughput and sglang:token_usage (sglang/_generate_double.py).
  Test-only knob: SGLANG_DOUBLE_COMPLETIONS=refuse answers it 503 (chat still answers): a rank
  that generates nothing for the benchmark while it passes the smoke.

Test-only knob: SGLANG_DOUBLE_REPLY (set in a unit drop-in) makes this rank answer garbage, as a
broken or misconfigured server would: "malformed" (200, a cut-off JSON body), "empty" (200, no
body), "wrong-model" (it serves another model: /v1/models and the reply name it), "wrong-sum"
(a fluent, well-formed answer whose number is wrong, the sum plus one: silently wrong kernels,
issue 27). Unset: a well-formed, right answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from sglang._double_build import VERSION
from sglang._generate_double import Gen, complete, out_of_memory
from sglang._startup_double import start_up

LOAD_SECONDS_ENV = "SGLANG_DOUBLE_LOAD_SECONDS"
REPLY_ENV = "SGLANG_DOUBLE_REPLY"
GENERATE_SECONDS_ENV = "SGLANG_DOUBLE_GENERATE_SECONDS"
COMPLETIONS_ENV = "SGLANG_DOUBLE_COMPLETIONS"
REPLIES = ("", "malformed", "empty", "wrong-model", "wrong-sum")
# The prompt contract (see the docstring): two integers joined by `+`.
SUM_QUESTION = re.compile(r"(-?\d+)\s*\+\s*(-?\d+)")
OTHER_MODEL = "other-org/another-model"
# What one canned exchange counts (usage and /metrics agree).
PROMPT_TOKENS, COMPLETION_TOKENS = 8, 12
OPEN_PATHS = ("/health", "/health_generate", "/metrics")


def option_table() -> dict[str, Any]:
    text = resources.files("sglang").joinpath("_cli_table.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def build_parser(table: dict[str, Any]) -> argparse.ArgumentParser:
    # allow_abbrev stays on: the real parser accepts unique prefixes and rejects ambiguous ones.
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    for name, opt in sorted(table["options"].items()):
        kwargs: dict[str, Any] = {"dest": opt["dest"]}
        if opt["takes_value"]:
            nargs = opt["nargs"]
            if nargs is not None:
                kwargs["nargs"] = nargs
            if opt["choices"] is not None:
                kwargs["choices"] = opt["choices"]
        elif name.startswith("--no-"):
            kwargs.update(action="store_false")
        else:
            kwargs.update(action="store_true")
        parser.add_argument(name, **kwargs)
    return parser


def _yaml_scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("null", "~", ""):
        return None
    if text.startswith("[") and text.endswith("]"):
        return [_yaml_scalar(item) for item in text[1:-1].split(",") if item.strip()]
    return text


def read_config(path: str) -> list[str]:
    """A flat YAML file of `option-name: value` -> command-line words."""
    if not path.endswith((".yaml", ".yml")):
        raise SystemExit(f"--config {path}: the config file must end in .yaml or .yml")
    words: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.split(" #", 1)[0].rstrip()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition(":")
            if not sep:
                raise SystemExit(f"--config {path}: not a flat 'option-name: value' line: {line!r}")
            option = "--" + key.strip().replace("_", "-")
            parsed = _yaml_scalar(value)
            if parsed is True:
                words.append(option)
            elif parsed is False or parsed is None:
                continue
            elif isinstance(parsed, list):
                words += [option, *(str(v) for v in parsed)]
            else:
                words += [option, str(parsed)]
    return words


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser(option_table())
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        # Config values first, so the same option on the command line wins.
        args = parser.parse_args([*read_config(args.config), *argv])
    return args


class _Server(ThreadingHTTPServer):
    # The listen backlog: socketserver's default is 5 (CPython Lib/socketserver.py,
    # request_queue_size), which a rank under a saturating load overflows (connections reset,
    # read by a router as a transport failure); uvicorn, SGLang's server, listens with 2048
    # (uvicorn's settings page, `--backlog`: "Default: 2048").
    request_queue_size = 2048


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = threading.Event()  # set by _startup_double.start_up when ready
        self.reply = os.environ.get(REPLY_ENV, "")
        served = args.served_model_name or args.model_path
        self.served_model = OTHER_MODEL if self.reply == "wrong-model" else served
        self.requests = 0
        self.running = 0
        self.generate_seconds = float(os.environ.get(GENERATE_SECONDS_ENV, "0") or 0)
        self.lock = threading.Lock()
        # Wedged (see the docstring): set while it is not; requests wait on it in the queue.
        self.flowing = threading.Event()
        self.flowing.set()
        self.queued = 0
        cap = getattr(args, "max_running_requests", None)
        graph = getattr(args, "cuda_graph_max_bs", None)
        conservative = getattr(args, "schedule_conservativeness", None)
        chunk = getattr(args, "chunked_prefill_size", None)
        # /v1/completions' scheduler and what it generated (sglang/_generate_double.py).
        self.gen = Gen(
            int(cap) if cap else None,
            int(graph) if graph else None,
            conservativeness=float(conservative) if conservative else None,
            chunk=int(chunk) if chunk else None,
            speculative=bool(getattr(args, "speculative_algorithm", None)),
        )

    def toggle_wedged(self) -> None:
        if self.flowing.is_set():
            self.flowing.clear()
        else:
            self.flowing.set()

    @property
    def ready(self) -> bool:
        return self.started.is_set()


def metrics_text(state: _State) -> str:
    """Prometheus text as prometheus_client writes SGLang's counters (see the docstring)."""
    label = f'{{model_name="{state.served_model}"}}'
    n = state.requests
    gen = state.gen
    running, queued = gen.counts()
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{label} {float(state.running + running)}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{label} {float(state.queued + queued)}",
        "# HELP sglang:gen_throughput The generation throughput (token/s).",
        "# TYPE sglang:gen_throughput gauge",
        f"sglang:gen_throughput{label} {gen.gen_throughput()}",
        "# HELP sglang:token_usage The token usage.",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{label} {gen.token_usage()}",
    ]
    prompt = n * PROMPT_TOKENS + gen.prompt_tokens
    # A chat's tokens are not counted as generated: it takes none of the double's decode
    # capacity (the docstring), and counting them would credit a rank with capacity it has not.
    generated = gen.generated
    for name, doc, value in (
        ("prompt_tokens", "Number of prefill tokens processed.", prompt),
        ("generation_tokens", "Number of generation tokens processed.", generated),
        ("num_requests", "Number of requests processed.", n + gen.requests),
    ):
        lines += [
            f"# HELP sglang:{name}_total {doc}",
            f"# TYPE sglang:{name}_total counter",
            f"sglang:{name}_total{label} {float(value)}",
        ]
    return "\n".join(lines) + "\n"


def _last_user_text(request: dict[str, Any]) -> str:
    messages = request.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                parts = [p.get("text") for p in content if isinstance(p, dict)]
                return " ".join(p for p in parts if isinstance(p, str))
            return content if isinstance(content, str) else ""
    return ""


def reply_text(request: dict[str, Any], reply: str, served: str) -> tuple[str, str]:
    """(content, finish_reason) the double answers `request` with (see the docstring)."""
    found = SUM_QUESTION.search(_last_user_text(request))
    if found is None:
        return f"Hello from the SGLang test double serving {served}.", "stop"
    a, b = int(found.group(1)), int(found.group(2))
    kwargs = request.get("chat_template_kwargs")
    if not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False):
        return f"<think>\nThe user asks for {a} + {b}. Let me add them digit by digit,", "length"
    return str(a + b + 1 if reply == "wrong-sum" else a + b), "stop"


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-double/" + VERSION

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write("[double] " + (format % args) + "\n")

        def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            key = state.args.api_key
            path = self.path.split("?", 1)[0]
            if not key or path.startswith(OPEN_PATHS):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if not self._authorised():
                return
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                if state.ready and state.flowing.is_set():
                    self._send(200, b"", "text/plain")
                else:
                    self._send(503, b"", "text/plain")
            elif path == "/metrics":
                if not state.args.enable_metrics:
                    self._send(404, {"detail": "Not Found"})
                    return
                self._send(200, metrics_text(state).encode(), "text/plain; version=0.0.4")
            elif path == "/v1/models":
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": state.served_model,
                                "object": "model",
                                "created": int(time.time()),
                                "owned_by": "sglang",
                                "root": state.served_model,
                                "parent": None,
                                "max_model_len": 262144,
                            }
                        ],
                    },
                )
            elif path == "/get_model_info":
                self._send(
                    200,
                    {
                        "model_path": state.args.model_path,
                        "tokenizer_path": state.args.model_path,
                        "is_generation": True,
                        "served_model_name": state.served_model,
                    },
                )
            elif path == "/get_server_info":
                info = {k: v for k, v in vars(state.args).items() if k != "api_key"}
                self._send(200, {**info, "version": VERSION})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if not self._authorised():
                return
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path == "/v1/completions" and os.environ.get(COMPLETIONS_ENV) == "refuse":
                # Test-only (see the docstring): a rank whose generation fails.
                self._send(503, {"error": "the double refuses completions"})
                return
            if path == "/v1/completions" and state.ready:
                try:
                    request = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, {"error": "invalid JSON"})
                    return
                # A client that went away: its request was aborted (the scheduler's).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    complete(self, state.gen, request, request.get("model") or state.served_model)
                return
            if path != "/v1/chat/completions":
                self._send(404, {"detail": "Not Found"})
                return
            if not state.ready:
                self._send(503, {"error": "the server is still loading"})
                return
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, {"error": "invalid JSON"})
                return
            if not state.flowing.is_set():
                with state.lock:
                    state.queued += 1
                state.flowing.wait()  # a wedged scheduler's queue (see the docstring)
                with state.lock:
                    state.queued -= 1
            with state.lock:
                state.running += 1
            try:
                # The double's decode time (see the docstring), not synchronisation.
                time.sleep(state.generate_seconds)
            finally:
                with state.lock:
                    state.running -= 1
                    state.requests += 1
                    n = state.requests
            if state.reply == "empty":
                self._send(200, b"")
                return
            if state.reply == "malformed":
                self._send(200, b'{"id": "chatcmpl-double", "object": "chat.completion", "choi')
                return
            content, finish = reply_text(request, state.reply, state.served_model)
            model = OTHER_MODEL if state.reply == "wrong-model" else request.get("model")
            self._send(
                200,
                {
                    "id": f"chatcmpl-double-{n}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model or state.served_model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": content,
                                "reasoning_content": None,
                                "tool_calls": None,
                            },
                            "logprobs": None,
                            "finish_reason": finish,
                            "matched_stop": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": PROMPT_TOKENS,
                        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                        "completion_tokens": COMPLETION_TOKENS,
                        "prompt_tokens_details": None,
                        "reasoning_tokens": 0,
                    },
                },
            )

    return Handler


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.model_path:
        print("error: --model-path is required", file=sys.stderr)
        return 2
    # SGLang logs its whole ServerArgs when it starts, before it touches a GPU, api_key in clear
    # (0.5.11 wheel, srt/entrypoints/engine.py:188): `server_args=ServerArgs(..., api_key='...')`.
    # A rank that then fails has its key in the journal the deploy shows (masked there).
    fields = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(args).items()))
    print(f"[double] server_args=ServerArgs({fields})", flush=True)
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        print(
            "RuntimeError: No CUDA GPUs are available (CUDA_VISIBLE_DEVICES unset)", file=sys.stderr
        )
        return 1
    if not (os.path.isdir(args.model_path) and os.access(args.model_path, os.R_OK | os.X_OK)):
        print(f"OSError: cannot read the model directory {args.model_path}", file=sys.stderr)
        return 1
    oom = out_of_memory(getattr(args, "mem_fraction_static", None))
    if oom is not None:
        print(oom, file=sys.stderr, flush=True)
        return 1
    host = args.host or "127.0.0.1"
    port = int(args.port or 30000)
    load_seconds = float(os.environ.get(LOAD_SECONDS_ENV, "2"))
    state = _State(args)
    server = _Server((host, port), _handler(state))
    server.daemon_threads = True

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGUSR1, lambda signum, frame: state.toggle_wedged())
    print(
        f"[double] sglang {VERSION} serving {state.served_model} on http://{host}:{port} "
        f"(GPU {os.environ['CUDA_VISIBLE_DEVICES']}, loading for {load_seconds:g}s)",
        flush=True,
    )

    # The start's phases, JIT and autotune (sglang/_startup_double.py); the ready line last.
    threading.Thread(target=start_up, args=(load_seconds, state.started), daemon=True).start()

    def say_served() -> None:
        # Once ready, what it serves again: the journal's tail a failed smoke shows (the last
        # 40 lines, programs/smoke.py) then still names it after the start's many phase lines.
        state.started.wait()
        print(f"[double] ready: serving {state.served_model}", flush=True)

    threading.Thread(target=say_served, daemon=True).start()
    server.serve_forever()
    server.server_close()
    return 0
