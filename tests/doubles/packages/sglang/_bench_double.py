"""TEST DOUBLE of SGLang's benchmark client (`python -m sglang.bench_serving`, and from 0.5.15
`python -m sglang.benchmark.serving`), standard library only.

What it mirrors, from the 0.5.11 wheel's sglang/bench_serving.py (the lines of every flag and
field, in every release, are in operations/kb/knowledge/bench/sglang-<v>.json):
- the options the throughput check passes, by their real names (`--backend` :1916, `--base-url`
  :1923, `--dataset-name` :1943 with `random-ids` :1952, `--model` :1965, `--tokenizer` :1975,
  `--num-prompts` :1980, `--random-input-len` :1998, `--random-output-len` :2004,
  `--random-range-ratio` :2010, `--max-concurrency` :2062, `--output-file` :2074,
  `--disable-tqdm` :2084, `--seed` :2122, `--extra-request-body` :2129, merged into each
  request last, :259); an option it does not know exits 2 as argparse does;
- the tokenizer is loaded from --tokenizer (transformers' AutoTokenizer, benchmark/utils.py:44-62):
  a directory without tokenizer files fails (exit 1), as an offline load does;
- `sglang-oai` posts to BASE/v1/completions (:870, async_request_openai_completions :226-336)
  `{"model", "prompt", "best_of": 1, "max_tokens", "stream": true, "temperature": 0.0,
  "ignore_eos": true}`, reads the stream's `data: ` chunks (`choices[0].text`; the first is
  the TTFT, each next one an ITL; `usage.completion_tokens` the output length) up to
  `data: [DONE]`; a status other than 200 is a failed request;
- the key: OPENAI_API_KEY -> `Authorization: Bearer KEY`, else API_KEY -> `Authorization: KEY`
  (get_auth_headers :114-121);
- `--max-concurrency` requests in flight at most, `--num-prompts` in all;
- `--output-file` gets one JSON line appended (:1557-1605, :1637-1642) with the run's arguments
  and results: duration, completed, total_input_tokens, total_output_tokens,
  request_throughput, input_throughput, output_throughput (output tokens / duration),
  total_throughput ((input + output) / duration), mean/median/p99 ttft_ms, itl_ms and
  e2e_latency_ms; with no request completed the real client writes nothing and fails (its
  `result` is never set): exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_serving")
    p.add_argument("--backend", choices=("sglang", "sglang-oai", "sglang-oai-chat"))
    p.add_argument("--base-url")
    p.add_argument("--dataset-name", default="sharegpt")
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--output-file")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--extra-request-body")
    return p


def headers() -> dict[str, str]:
    openai_key = os.environ.get("OPENAI_API_KEY")
    if openai_key:
        return {"Authorization": f"Bearer {openai_key}"}
    key = os.environ.get("API_KEY")
    return {"Authorization": key} if key else {}


def one_request(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers()},
        method="POST",
    )
    start = time.perf_counter()
    ttft, last, itls, output_len = 0.0, start, [], body["max_tokens"]
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            for raw in resp:
                chunk = raw.decode().strip()
                if not chunk:
                    continue
                chunk = chunk.removeprefix("data: ")
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if data["choices"][0]["text"]:
                    now = time.perf_counter()
                    if ttft == 0.0:
                        ttft = now - start
                    else:
                        itls.append(now - last)
                    last = now
                    output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
    except urllib.error.HTTPError as error:
        # As the real client's output.error: reason, then the body (:330-333).
        return {"success": False, "error": f"{error.reason}: {error.read().decode()[:500]}"}
    except (urllib.error.URLError, OSError, ValueError) as error:
        return {"success": False, "error": str(error)}
    return {
        "success": True,
        "ttft": ttft,
        "itl": itls,
        "latency": time.perf_counter() - start,
        "output_len": output_len,
    }


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    tokenizer = args.tokenizer or args.model or ""
    if not any(os.path.isfile(os.path.join(tokenizer, f)) for f in TOKENIZER_FILES):
        print(f"OSError: Can't load tokenizer for '{tokenizer}'", file=sys.stderr)
        return 1
    url = args.base_url.rstrip("/") + "/v1/completions"
    input_len, output_len = args.random_input_len, args.random_output_len
    body = {
        "model": args.model,
        "prompt": " ".join(["tok"] * input_len),
        "best_of": 1,
        "max_tokens": output_len,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    # Merged last, overriding the defaults (payload.update(extra_request_body), :259).
    body.update(json.loads(args.extra_request_body) if args.extra_request_body else {})
    lock = threading.Lock()
    outputs: list[dict[str, Any]] = []

    def run(_: int) -> None:
        out = one_request(url, body)
        with lock:
            outputs.append(out)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.max_concurrency or args.num_prompts) as pool:
        list(pool.map(run, range(args.num_prompts)))
    duration = time.perf_counter() - start
    done = [o for o in outputs if o["success"]]
    print(f"Successful requests: {len(done)}; failed: {len(outputs) - len(done)}")
    if not done:
        print(f"Error running benchmark: {outputs[0].get('error') if outputs else 'nothing'}")
        return 1
    total_out = sum(int(o["output_len"]) for o in done)
    total_in = input_len * len(done)
    ttfts = [o["ttft"] * 1000 for o in done]
    itls = [i * 1000 for o in done for i in o["itl"]] or [0.0]
    e2e = [o["latency"] * 1000 for o in done]

    def p99(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    result = {
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "max_concurrency": args.max_concurrency,
        "random_input_len": input_len,
        "random_output_len": output_len,
        "random_range_ratio": args.random_range_ratio,
        "duration": duration,
        "completed": len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_throughput": (total_in + total_out) / duration,
        "mean_e2e_latency_ms": statistics.mean(e2e),
        "median_e2e_latency_ms": statistics.median(e2e),
        "p99_e2e_latency_ms": p99(e2e),
        "mean_ttft_ms": statistics.mean(ttfts),
        "median_ttft_ms": statistics.median(ttfts),
        "p99_ttft_ms": p99(ttfts),
        "mean_itl_ms": statistics.mean(itls),
        "median_itl_ms": statistics.median(itls),
        "p99_itl_ms": p99(itls),
    }
    if args.output_file:
        with open(args.output_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result) + "\n")
    return 0
