"""The toolkit's own load client and ruler: how many output tokens each rank generates per second
at saturation, read from the rank's own counters. One build measures both sides of every
comparison (the throughput guard's records, the canary's ranks): it is this file, named by
CLIENT (bumped with any change to what it sends or how it counts; tests/unit/test_throughput.py
pins this file's digest to it), never the release under test's benchmark client.

Run as the service user by the throughput check and the canary (each starts its own script with
`load` first; the key is OPENAI_API_KEY in its environment, never on its command line):

    python3 SCRIPT load --rank UNIT=SERVER_ROOT ... --input-len I --output-len O
        --start C --most C [--fixed] --ramp-timeout S --rounds R --window S --seed N
        --model NAME --out FILE

What it sends: POST SERVER_ROOT/v1/completions, `prompt` a list of I random token ids (SGLang's
CompletionRequest takes `List[int]`: 0.5.11 wheel, srt/entrypoints/openai/protocol.py:258),
`max_tokens` O with `ignore_eos` (every request generates O tokens), temperature 0, streamed
with `stream_options.include_usage` (TTFT and inter-token latency from the chunks' times). Each
request's ids are new (a random generator seeded with --seed, a new seed each run): no prompt
repeats an earlier one, so no run is measured on prefix-cache hits. SGLang's /flush_cache is
not used: it empties the cache only when the scheduler is fully idle (0.5.11
srt/managers/scheduler.py:3343-3368, "Cache not flushed because there are pending requests"),
which a host that keeps serving never is.

How a rank is measured (all ranks at once, each with its own requests in flight):
1. Ramp (the warm-up): C requests in flight (--start), doubled until the rank's own
   `sglang:num_queue_reqs` is above 0 in HOLD consecutive readings of its /metrics (its
   scheduler has a full running batch by its own limits: KV cache, mamba slots,
   --max-running-requests; what it generates then is its capacity for these lengths), then
   MARGIN more so the queue stays non-empty while requests end and are sent again. No queue up
   to --most (or to what the process's open-file limit allows, one connection a request):
   measured there, said ("found": "most"). --fixed: C, no ramp.
   Past --ramp-timeout the ramp stops where it is ("found": "timeout").
2. Windows: once every rank's ramp is done, --rounds windows of --window seconds each, back to
   back, the load kept up. Each window reads every rank's counters at its start and end
   (`sglang:generation_tokens_total`, `sglang:num_requests_total`): what the rank generated for
   everyone, its clients' traffic included, so a host that keeps serving while it is measured
   is not read as slower. The tokens the check's own requests received in the window against
   what the rank generated give the share of the rank's work that was not the check's. The
   queue is read every POLL_S seconds: the share of readings with a queue says whether the
   rank stayed saturated.
3. Stop: every request still in flight is cancelled (its connection closed: SGLang aborts a
   request whose client went away), so nothing of the check runs on after it.

The result (--out, one JSON object, the file the caller reads without following a link):
{"client", "seed", "ranks": {UNIT: {"concurrency", "found", "ramp_s", "windows": [{"seconds",
"generated", "requests", "own_requests", "own_generated", "output_tok_s",
"queued_share"}], "completed",
"errors", "first_error", "ttft_ms", "itl_ms"}}}. Exit 0 when it measured, 1 when a rank's
/metrics could not be read (the result says which), 2 for a command line it cannot read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from operations.programs.rank_metrics import (
    GENERATED,
    QUEUED_GAUGE,
    REQUESTS,
    RUNNING_GAUGE,
    total,
)

# The ruler's name in every record; bump it with any change to what this file sends or counts.
CLIENT = "sglang-deploy load client 2"
LOAD = "load"  # the first argument that starts a program's load client
POLL_S = 0.5
HOLD = 3  # readings in a row that decide a ramp step
MARGIN = 0.25  # more in flight than the rank first queued at, at least MARGIN_MIN
MARGIN_MIN = 4
# Token ids drawn from this range: ordinary tokens in every vocabulary of a served LLM (tens of
# thousands of entries and more), below any model's special tokens.
TOKEN_IDS = (1000, 30000)
READ_LIMIT = 2**20  # the most of a response's body read after an error status
SPARE_FDS = 64  # descriptors kept for /metrics reads, the result file and Python's own


@dataclass
class Rank:
    """One rank's load and what was measured of it."""

    name: str
    host: str
    port: int
    target: int
    found: str = ""
    ramp_s: float = 0.0
    windows: list[dict[str, float]] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str | None = None
    ends: list[float] = field(default_factory=list)  # each own request's end (monotonic)
    streamed: int = 0  # tokens the check's own requests received so far
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    unread: str | None = None


def split_url(root: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(root)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"{root!r} is not http://HOST:PORT")
    return parsed.hostname, parsed.port or 80


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status = (await reader.readline()).decode("latin-1").split()
    code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
    headers: dict[str, str] = {}
    while True:
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            return code, headers
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()


async def _body_lines(reader: asyncio.StreamReader, chunked: bool):  # type: ignore[no-untyped-def]
    """The body's lines, de-chunked where the server chunks it (uvicorn does; a server that
    closes the connection to end the body does not)."""
    pending = b""
    while True:
        if chunked:
            size_line = await reader.readline()
            if not size_line:
                break
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size)
            await reader.readline()
        else:
            data = await reader.read(65536)
            if not data:
                break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _read_page(rank: Rank) -> tuple[str, float]:
    """The rank's /metrics and when it was read: the middle of the request's send and its
    answer, taken on a thread of its own, so a client loop busy with streams does not stretch
    a window's ends."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    sent = time.monotonic()
    with opener.open(f"http://{rank.host}:{rank.port}/metrics", timeout=10) as resp:
        text: str = resp.read().decode("utf-8", "replace")
    return text, (sent + time.monotonic()) / 2


async def read_metrics(rank: Rank) -> tuple[str, float]:
    return await asyncio.get_running_loop().run_in_executor(None, _read_page, rank)


def prompt_ids(rng: random.Random, length: int) -> list[int]:
    low, high = TOKEN_IDS
    return [rng.randrange(low, high) for _ in range(length)]


async def one_request(
    rank: Rank, args: argparse.Namespace, key: str | None, ids: list[int]
) -> None:
    """One streamed completion; what it took is added to `rank` when it completes."""
    body = json.dumps(
        {
            "model": args.model,
            "prompt": ids,
            "max_tokens": args.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {rank.host}:{rank.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + (f"Authorization: Bearer {key}\r\n" if key else "")
        + "Connection: close\r\n\r\n"
    )
    start = time.monotonic()
    first = last = 0.0
    chunks = 0
    reader, writer = await asyncio.open_connection(rank.host, rank.port)
    try:
        writer.write(head.encode() + body)
        code, headers = await _head(reader)
        if code != 200:
            text = (await reader.read(READ_LIMIT)).decode("utf-8", "replace")
            raise OSError(f"HTTP {code}: {text.strip()[:200]}")
        chunked = "chunked" in headers.get("transfer-encoding", "")
        async for raw in _body_lines(reader, chunked):
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            choices = event.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.monotonic()
                first = first or now
                last = now
                chunks += 1
                rank.streamed += 1
    finally:
        writer.close()
    if not chunks:
        raise OSError("the stream ended with no token")
    rank.completed += 1
    rank.ends.append(last)
    rank.ttft.append((first - start) * 1000)
    if chunks > 1:
        rank.itl.append((last - first) * 1000 / (chunks - 1))


async def worker(rank: Rank, args: argparse.Namespace, key: str | None, rng: random.Random) -> None:
    """Keep one request in flight on `rank` until cancelled."""
    while True:
        try:
            await one_request(rank, args, key, prompt_ids(rng, args.input_len))
        except asyncio.CancelledError:
            raise
        except (OSError, ValueError, asyncio.IncompleteReadError) as error:
            rank.errors += 1
            if rank.first_error is None:
                rank.first_error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(POLL_S)  # a refused request is not retried in a tight loop


def grow(rank: Rank, args: argparse.Namespace, key: str | None, rng: random.Random) -> None:
    while len(rank.tasks) < rank.target:
        rank.tasks.add(asyncio.ensure_future(worker(rank, args, key, rng)))


async def gauges(rank: Rank) -> tuple[float, float]:
    text, _ = await read_metrics(rank)
    return total(text, RUNNING_GAUGE) or 0.0, total(text, QUEUED_GAUGE) or 0.0


async def ramp(rank: Rank, args: argparse.Namespace, key: str | None, rng: random.Random) -> None:
    """Step 1 of the docstring: more in flight until the rank queues work."""
    started = time.monotonic()
    grow(rank, args, key, rng)
    queued_in_a_row = admitted_in_a_row = 0
    while True:
        await asyncio.sleep(POLL_S)
        running, queued = await gauges(rank)
        if args.fixed:  # no search: only the warm-up, until the rank holds them all
            admitted_in_a_row = (
                admitted_in_a_row + 1 if running + queued >= 0.8 * rank.target else 0
            )
            if admitted_in_a_row >= HOLD or time.monotonic() - started > args.ramp_timeout:
                rank.found = "fixed"
                break
            continue
        queued_in_a_row = queued_in_a_row + 1 if queued > 0 else 0
        admitted_in_a_row = admitted_in_a_row + 1 if running + queued >= 0.8 * rank.target else 0
        if queued_in_a_row >= HOLD:
            rank.found = "queue"
            margin = max(MARGIN_MIN, int(rank.target * MARGIN))
            rank.target = min(args.most, rank.target + margin)
            break
        if time.monotonic() - started > args.ramp_timeout:
            rank.found = "timeout"
            break
        if admitted_in_a_row >= HOLD:
            if rank.target >= args.most:
                rank.found = "most"
                break
            rank.target = min(args.most, rank.target * 2)
            admitted_in_a_row = 0
            grow(rank, args, key, rng)
    grow(rank, args, key, rng)
    rank.ramp_s = round(time.monotonic() - started, 3)


async def counters(rank: Rank) -> tuple[float, float, float]:
    """(generated tokens, finished requests, when they were read)."""
    text, at = await read_metrics(rank)
    return total(text, GENERATED) or 0.0, total(text, REQUESTS) or 0.0, at


async def window(ranks: list[Rank], seconds: float) -> None:
    """Step 2 of the docstring: one window over every rank at once, each rank's from its own
    two readings."""
    before = await asyncio.gather(*(counters(r) for r in ranks))
    own_before = [r.streamed for r in ranks]
    end = time.monotonic() + seconds
    readings = {r.name: [0, 0] for r in ranks}
    while (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(POLL_S, left))
        read = await asyncio.gather(*(gauges(r) for r in ranks))
        for r, (_, queued) in zip(ranks, read, strict=True):
            readings[r.name][0] += 1
            readings[r.name][1] += queued > 0
    after = await asyncio.gather(*(counters(r) for r in ranks))
    for r, was, now, streamed in zip(ranks, before, after, own_before, strict=True):
        generated, requests, took = now[0] - was[0], now[1] - was[1], now[2] - was[2]
        own = sum(1 for t in r.ends if was[2] <= t < now[2])
        polls, queued = readings[r.name]
        r.windows.append(
            {
                "seconds": round(took, 3),
                "generated": generated,
                "requests": requests,
                "own_requests": own,
                "own_generated": r.streamed - streamed,
                "output_tok_s": round(generated / took, 2) if took > 0 else 0.0,
                "queued_share": round(queued / polls, 3) if polls else 0.0,
            }
        )


def p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


async def measure(args: argparse.Namespace, key: str | None) -> dict[str, object]:
    rng = random.Random(args.seed)
    ranks = []
    for value in args.rank:
        name, _, root = value.partition("=")
        host, port = split_url(root)
        ranks.append(Rank(name, host, port, max(1, args.start)))
    try:
        await asyncio.gather(*(ramp(r, args, key, rng) for r in ranks))
        for _ in range(args.rounds):
            await window(ranks, args.window)
    finally:
        for r in ranks:
            for task in r.tasks:
                task.cancel()
        await asyncio.gather(*(t for r in ranks for t in r.tasks), return_exceptions=True)
    return {
        "client": CLIENT,
        "seed": args.seed,
        "ranks": {
            r.name: {
                "concurrency": r.target,
                "found": r.found,
                "ramp_s": r.ramp_s,
                "windows": r.windows,
                "completed": r.completed,
                "errors": r.errors,
                "first_error": r.first_error,
                "ttft_ms": p50(r.ttft),
                "itl_ms": p50(r.itl),
            }
            for r in ranks
        },
    }


def load_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="load")
    parser.add_argument("--rank", action="append", required=True)
    for name in ("--input-len", "--output-len", "--start", "--most", "--rounds", "--seed"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--fixed", action="store_true")
    parser.add_argument("--ramp-timeout", type=float, required=True)
    parser.add_argument("--window", type=float, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    return parser


def room_for(ranks: int, most: int) -> int:
    """The most requests in flight a rank can have here: one connection each, and a process's
    open files are capped (RLIMIT_NOFILE; its soft limit, often 1024, raised to the hard one
    first). 8 ranks at 1,024 need 8,192."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    return max(1, min(most, (soft - SPARE_FDS) // max(1, ranks)))


def load_main(argv: list[str]) -> int:
    """The load client's main (the docstring): runs as the service user; never a traceback."""
    try:
        args = load_parser().parse_args(argv)
    except SystemExit:
        return 2
    # A cap the open-file limit sets is a cap on the search: said as `found: most`.
    args.most = room_for(len(args.rank), args.most)
    args.start = min(args.start, args.most)
    key = os.environ.get("OPENAI_API_KEY") or None
    try:
        result = asyncio.run(measure(args, key))
        code = 0
    except (TimeoutError, OSError, ValueError) as error:
        result = {"client": CLIENT, "failed": f"{type(error).__name__}: {error}"}
        code = 1
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(result, sort_keys=True) + "\n")
    return code
