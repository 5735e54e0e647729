"""How fast this host serves, measured with the serving engine's own benchmark client.

Run by the deploy's throughput step (steps/throughput.py) and `python -m operations.bench`, as
root; the client itself runs as the service user (no root process talks to the ranks):

    python3 throughput.py --python ENGINE_PYTHON --module sglang.bench_serving
        --module-file sglang/bench_serving.py --model NAME --tokenizer MODEL_DIR
        --target router=URL | --target UNIT=URL ... --rank UNIT=URL ...
        --input-len I --output-len O --concurrency-per-rank C --prompts-per-rank N
        --timeout S --key-file SECRETS --service-user USER --records FILE [--pending FILE]
        --meta '{"release": ..., "engine": ..., "model_digest": ..., "flags_digest": ...}'
        --max-slowdown F --guard fail|warn

1. Refused before anything runs (exit 2, one line `throughput: refused: ...`, no record), with
   the fix: a command line, --meta or --ceilings the plan could not have written, records that
   cannot be read, no tokenizer in the model copy (the client loads it from there, offline), an
   engine without the client module (the file the knowledge base names for the release:
   operations/kb/knowledge/bench/). The key goes only to the service user's listeners, as the
   smoke's does (docs/how-it-works/security.md "Who is sent the API key"): every --target and every
   --rank
   (through the router the router forwards the key to them) must be listened on, and only by
   USER (hostsafe.listening and owner_problem, on /proc/net/tcp and tcp6), before the key is
   read or a client starts; a rank whose /metrics cannot be read is refused too.
2. Each rank's counters are read before and after (`sglang:generation_tokens_total`,
   `sglang:num_requests_total`: series_total, on rank_metrics.sample), for its share of the run.
   A rank whose page cannot be read after the run has its share unknown (None in per_rank): the
   record keeps what was measured and the check fails naming it.
3. The client runs once through the router (`--target router=URL`: concurrency and prompts are
   per rank times the ranks), or once per rank, all at once (one --target per rank), with
   `--backend sglang-oai --dataset-name random-ids --random-range-ratio 1.0`: fixed-length
   random token ids, nothing downloaded (HF_HUB_OFFLINE). The key reaches it as the environment
   variable OPENAI_API_KEY, which it sends as `Authorization: Bearer KEY` (0.5.11
   sglang/bench_serving.py:114-121, get_auth_headers; API_KEY alone would be sent without
   "Bearer", which SGLang refuses). It is stopped (its process group) past --timeout. It works
   in a temporary directory of the service user's, removed whatever happens; its result file
   is read without following a link (it is the service user's to make).
4. The record (one JSON line) is appended to --records either way; the verdict
   (throughput_guard.judge, starved ranks through the router, ranks unread) decides the exit
   status. One line `throughput {...}` (the record and the verdict) and one short line are
   printed. Everything printed or kept is masked (hostsafe.mask_journal, the key itself
   included): the client's last lines in first_error, every error line.
5. --pending FILE (layout.THROUGHPUT_PENDING): one JSON line {"started": TIME}, root's, 0644,
   written once the files are found (before the listeners are judged: a refused check is not a
   passed one) and before any client starts, through a new file renamed over it (never written
   through a link); removed only when the verdict is ok (a warning included). A check that
   fails, is refused or is cut off leaves it, and the next deploy runs the check again.

No traceback: what is not one of these lines is one `throughput: failed: TYPE: MESSAGE` (exit 1).
Stopping the client leaves every rank as it was: nothing here restarts or reconfigures a rank.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from operations.programs.hostsafe import (
    Listener,
    mask_journal,
    read_listeners,
)
from operations.programs.rank_metrics import sample
from operations.programs.throughput_args import (
    Refused,
    pairs,
    parse,
    read_ceilings,
    read_meta,
    read_records,
)
from operations.programs.throughput_client import (
    WHO_GETS_THE_KEY,
    Result,
    client_words,
    guarded,
    listener_refusal,
    metrics,
    number,
    preconditions,
    read_key,
    read_result,
    run_client,
    service_ids,
)
from operations.programs.throughput_guard import (
    Percentiles,
    RankShare,
    Record,
    beside_ceilings,
    judge,
    starved,
)

GENERATED = "sglang:generation_tokens_total"
REQUESTS = "sglang:num_requests_total"
ROUTER = "router"


def owner_refusal(
    targets: dict[str, str], ranks: dict[str, str], service_user: str, found: list[Listener]
) -> str | None:
    """Why the key may not be sent: a --target, or a --rank (through the router, one the router
    forwards the key to), that is not the service user's (throughput_client.listener_refusal)."""
    through = ROUTER in targets
    named = [(n, u, "") for n, u in targets.items()]
    named += [(n, u, "the router forwards to " if through else "") for n, u in ranks.items()]
    return listener_refusal(named, service_user, found)


def series_total(text: str, name: str) -> float | None:
    """A counter on a rank's /metrics page summed over its series (rank_metrics.sample reads
    each line); None when the page has no sample of it."""
    total: float | None = None
    for line in text.splitlines():
        read = sample(line)
        if read is not None and read[0] == name:
            total = (total or 0.0) + read[1]
    return total


Counts = tuple[float, float]  # a rank's generated tokens and requests (the two counters)


def counters(ranks: dict[str, str]) -> tuple[dict[str, Counts], dict[str, str]]:
    """Each rank's counters, and why not for each rank whose /metrics could not be read."""

    def one(item: tuple[str, str]) -> tuple[str, Counts | str]:
        try:
            text = metrics(item[1])
        except (OSError, ValueError, http.client.HTTPException) as error:
            return item[0], f"{type(error).__name__}: {error}"
        return item[0], (series_total(text, GENERATED) or 0.0, series_total(text, REQUESTS) or 0.0)

    read: dict[str, Counts] = {}
    failed: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(ranks))) as pool:
        for name, got in pool.map(one, ranks.items()):
            if isinstance(got, str):
                failed[name] = got
            else:
                read[name] = got
    return read, failed


Runs = dict[str, tuple[int, str, Result | None]]  # each client: exit status, output, result


def measure(
    args: argparse.Namespace,
    key: str | None,
    ids: tuple[int, int],
    before: dict[str, Counts],
) -> Runs:
    """Run the client(s), each output masked; the work directory is removed whatever
    happens."""
    targets = pairs(args.target, "--target")
    through = ROUTER in targets
    deadline = time.monotonic() + args.timeout
    known = (key,) if key else ()
    work = tempfile.mkdtemp(prefix="throughput-")
    try:
        os.chown(work, *ids)
        runs = {name: (url, 1 if not through else len(before)) for name, url in targets.items()}

        def one(item: tuple[str, tuple[str, int]]) -> tuple[str, tuple[int, str, Result | None]]:
            name, (url, count) = item
            out = os.path.join(work, f"{name}.jsonl")
            words = client_words(args, url, count, out)
            code, text = run_client(args, words, key, work, deadline, ids)
            return name, (code, mask_journal(text, known), read_result(out))

        with ThreadPoolExecutor(max_workers=len(runs)) as pool:
            return dict(pool.map(one, runs.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def combine(
    args: argparse.Namespace,
    results: Runs,
    before: dict[str, Counts],
    after: dict[str, Counts],
    record: Record,
) -> None:
    """The measured part of a record from each client's result and the ranks' counters (a rank
    missing from `after`: its share unknown, None)."""
    prompts = args.prompts_per_rank * len(before)
    done = [r for _, _, r in results.values() if r]
    failed = {n: (c, t) for n, (c, t, r) in results.items() if not r}
    completed = int(sum(number(r.get("completed")) for r in done))
    duration = max((number(r.get("duration")) for r in done), default=0.0)
    per_rank: dict[str, RankShare] = {}
    for name in before:
        if name not in after:
            per_rank[name] = {"generated": None, "requests": None, "output_tok_s": None}
            continue
        generated = after[name][0] - before[name][0]
        per_rank[name] = {
            "generated": generated,
            "requests": after[name][1] - before[name][1],
            "output_tok_s": round(generated / duration, 2) if duration > 0 else 0.0,
        }

    def pick(median: str, p99: str) -> Percentiles:
        mids = sorted(number(r[median]) for r in done if r.get(median) is not None)
        tops = [number(r[p99]) for r in done if r.get(p99) is not None]
        return {
            "p50": mids[len(mids) // 2] if mids else None,
            "p99": max(tops) if tops else None,
        }

    first_error = None
    if failed:
        name, (code, text) = sorted(failed.items())[0]
        tail = " | ".join(text.strip().splitlines()[-3:])
        first_error = f"{name}: the client exited {code} ({'timed out' if code == 124 else tail})"
    record["prompts"] = prompts
    record["completed"] = completed
    record["errors"] = prompts - completed
    record["first_error"] = first_error
    record["duration_s"] = round(duration, 3)
    record["output_tok_s"] = round(sum(number(r.get("output_throughput")) for r in done), 2)
    record["total_tok_s"] = round(sum(number(r.get("total_throughput")) for r in done), 2)
    record["per_rank"] = per_rank
    # Per rank (no router): the median of the ranks' medians, the worst p99.
    record["ttft_ms"] = pick("median_ttft_ms", "p99_ttft_ms")
    record["itl_ms"] = pick("median_itl_ms", "p99_itl_ms")
    record["e2e_ms"] = pick("median_e2e_latency_ms", "p99_e2e_latency_ms")


def mark_pending(path: str, started: str) -> None:
    """The pending marker (the docstring, 5): a new file (O_EXCL, O_NOFOLLOW) beside it, renamed
    over whatever is there, so a link or a FIFO at `path` is replaced, never written through."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fresh = f"{path}.{os.getpid()}.new"
    with contextlib.suppress(FileNotFoundError):  # one a crash left (the directory is root's)
        os.unlink(fresh)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(fresh, flags, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fd, 0o644)  # whatever the umask
            fh.write(json.dumps({"started": started}) + "\n")
        os.replace(fresh, path)
    except BaseException:
        os.unlink(fresh)
        raise


def check(
    argv: list[str], listeners: Callable[[], list[Listener]], secrets: list[str]
) -> tuple[int, list[str]]:
    """The whole check: (exit status, the lines to print). Refused is raised before any client
    runs; `secrets` gets the key once it is read (the caller masks with it)."""
    args = parse(argv)
    targets = pairs(args.target, "--target")
    ranks = pairs(args.rank, "--rank")
    meta = read_meta(args.meta)
    ceilings = read_ceilings(args.ceilings)
    history = read_records(args.records)
    preconditions(args.python, args.module_file, args.tokenizer)
    now = args.time or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.pending:
        try:
            mark_pending(args.pending, now)
        except OSError as error:
            raise Refused(
                f"the pending marker {args.pending} cannot be written "
                f"({type(error).__name__}: {error.strerror})"
            ) from None
    why = owner_refusal(targets, ranks, args.service_user, listeners())
    if why is not None:
        raise Refused(f"{why} ({WHO_GETS_THE_KEY})")
    ids = service_ids(args.service_user)
    key = read_key(args.key_file)
    if key:
        secrets.append(key)
    before, unread = counters(ranks)
    if unread:
        name, why = sorted(unread.items())[0]
        raise Refused(
            f"rank {name}: its /metrics ({ranks[name].rstrip('/')}/metrics) cannot be read "
            f"({why}): each rank's share is read from its counters; see that its unit serves "
            "(its journal), deploy again, or set throughput_check: off"
        )
    record: Record = {
        "release": meta["release"],
        "engine": meta["engine"],
        "model_digest": meta["model_digest"],
        "flags_digest": meta["flags_digest"],
        "workload": meta["workload"],
        "time": now,
        "ranks": len(ranks),
        "through": meta["workload"]["through"],
    }
    results = measure(args, key, ids, before)
    after, unread = counters(ranks)
    combine(args, results, before, after, record)
    verdict = judge(record, history, args.max_slowdown, args.guard)
    shares = record["per_rank"]
    known = {n: r["generated"] for n, r in shares.items() if r["generated"] is not None}
    hungry = starved(known)
    ok, line = verdict.ok, verdict.line
    if record["through"] == ROUTER and hungry and record["completed"]:
        ok = False
        counts = ", ".join(f"{n}: {known[n]:g}" for n in hungry)
        line += (
            f"; rank(s) {', '.join(hungry)} took (almost) no load through the router "
            f"(generated tokens {counts}; an even share is {1 / len(ranks):.0%})"
        )
    if unread:
        ok = False
        said = "; ".join(f"{n}: {why}" for n, why in sorted(unread.items()))
        line += (
            f"; rank(s) {', '.join(sorted(unread))}: /metrics could not be read after the run "
            f"({said}): the share is unknown"
        )
    beside = beside_ceilings(record, ceilings)
    if beside is not None:
        line += f"; {beside}"
    record["verdict"] = {"ok": ok, "ratio": verdict.ratio, "fell": verdict.fell}
    shown = ["throughput " + json.dumps(record, sort_keys=True), line]
    try:
        directory = os.path.dirname(args.records)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(args.records, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as error:
        shown.append(
            f"throughput: failed: the record was not kept in {args.records} "
            f"({type(error).__name__}: {error.strerror}): make that a file root may append to, "
            "and deploy again"
        )
        return 1, shown
    if ok and args.pending:
        # One left behind (a directory made there since) only runs the check again.
        with contextlib.suppress(OSError):
            os.unlink(args.pending)
    return (0 if ok else 1), shown


def main(argv: list[str], listeners: Callable[[], list[Listener]] = read_listeners) -> int:
    """Exit 0 (the check passed, a warning included), 1 (it failed) or 2 (refused before any
    client ran); one line for each failure, masked, never a traceback. `listeners`: who listens
    on this host's TCP ports (hostsafe.read_listeners; a test's own)."""
    return guarded("throughput", lambda secrets: check(argv, listeners, secrets))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
