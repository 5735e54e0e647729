#!/usr/bin/env python3
"""Compare a canary rank (the new engine or flags) with a baseline rank (still the old ones) on
answers, speed and errors, print the verdict table, keep it, and on a failed verdict roll the
canary back (issue 45). Run as root by the deploy; the benchmark client runs as the service
user, as the throughput check's does:

    python3 canary_compare.py --canary UNIT=API_BASE [--canary ...] --baseline UNIT=API_BASE
        --model SERVED_NAME --key-file PATH --service-user USER --max-slowdown F --soak SECONDS
        --record PATH --target HEXDIGEST --meta JSON
        [--router-metrics URL --worker UNIT=WORKER_URL ...]
        --python ENGINE_PY --module BENCH_MODULE --module-file FILE --tokenizer MODEL_DIR
        --input-len N --output-len N --concurrency-per-rank N --prompts-per-rank N --timeout S
        [--rollback STEPS_JSON] [--pause]

API_BASE is a rank's OpenAI base as layout.rank_api_base writes it (`http://127.0.0.1:30001/v1`);
the rank's server root is that without `/v1`. WORKER_URL is the rank as the router names it in
its metrics' `worker` label.

1. Refused (exit 2, one line `canary: refused: ...`, nothing sent, nothing kept): a command line,
   --meta or --rollback the plan could not have written (programs/canary_args.py), no tokenizer
   or client module (throughput_client.preconditions), a record directory that is not root's
   alone. Then every port this talks to (each canary, the baseline, --router-metrics) must be
   listened on, and only by USER (hostsafe.listening and owner_problem: throughput.py's rule,
   docs/how-it-works/security.md "Who is sent the API key"), before the key file is read.
2. The rows (programs/canary_rows.py decides each, and documents its tolerance):
   - answers: known sum: the smoke's question (smoke_answers.chat_request) to every rank;
   - answers: open prompts: canary_rows.OPEN_PROMPTS to every rank at temperature 0 with
     `logprobs` and `top_logprobs` asked, compared token by token with the baseline's;
   - speed: the throughput check's client (throughput_client.client_words and run_client, one
     rank's workload: --prompts-per-rank at --concurrency-per-rank) against every canary and the
     baseline AT ONCE, one client per rank. The ranks are on separate GPUs, so running them
     together costs neither anything; measuring them in the same window puts any drift of the
     host's load, clocks and temperature on both sides alike, where one after the other would
     put it on one side only.
   - errors: with --router-metrics, the router's /metrics is read when the comparison starts and
     again once --soak seconds have passed (the rows above run meanwhile; users' traffic through
     the router keeps flowing), and each canary worker's failures are compared with the
     baseline worker's. Without a router the soak is skipped and the row says so.
3. Prints the table (a header, each row wrapped to its columns) and last `canary: passed` or
   `canary: FAILED (CHECKS)`; everything printed or kept is masked (hostsafe.mask_journal, the
   key included). The record (--record) is one JSON object, written to a new file in its
   directory and renamed over the old one, 0644: {"version": 1, "target", "release", "engine",
   "canary_ranks", "baseline_rank" (from --meta), "at" (UTC), "ok", "paused" (--pause), "rows":
   [{check, baseline, canary, threshold, pass}], "rolled_back"}.
4. A failed verdict with --rollback: its steps run here (roll_steps.run, as a roll batch runs
   them: drain the canaries, restore their unit files, reload, restart, wait healthy, smoke,
   rejoin); when they all pass the record is written again with "rolled_back": true. The last
   line says whether the rollback passed.

Exit 0: passed; 1: failed (after the rollback, whichever way it went), or what nothing above
names (one line `canary: failed: TYPE: MESSAGE`, never a traceback); 2: refused.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from operations.programs.canary_args import (
    canary_meta,
    checked,
    parse_canary,
    read_rollback,
    record_directory,
    server_root,
)
from operations.programs.canary_rows import (
    EXACT,
    OPEN_MAX_TOKENS,
    OPEN_PROMPTS,
    SPEED_ROUNDS,
    TOP_K,
    Answer,
    Speed,
    answer_of,
    combined,
    compare,
    errors_row,
    last_line,
    no_router_row,
    open_threshold,
    outcomes,
    row,
    speed_row,
    table,
)
from operations.programs.hostsafe import (
    Listener,
    mask_journal,
    read_listeners,
)
from operations.programs.roll_steps import WAIT, run
from operations.programs.roll_waiting import wait_for_go
from operations.programs.smoke_answers import (
    TEMPLATE_KWARGS,
    chat_request,
    judge_chat,
    operands,
    question,
)
from operations.programs.throughput_args import Refused
from operations.programs.throughput_client import (
    WHO_GETS_THE_KEY,
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

T = TypeVar("T")
CANARY_OFF = "deploy without the canary (its setting off)"
Row = dict[str, object]


def post(url: str, body: object, key: str | None, timeout: float) -> tuple[int | None, str]:
    """(HTTP status or None when nothing answered, body) of one JSON POST, without a proxy."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException) as error:
        return None, f"no answer ({type(error).__name__}: {error})"


def chat(root: str, body: object, key: str | None, timeout: float) -> tuple[int | None, str]:
    return post(root + "/v1/chat/completions", body, key, timeout)


def each(work: Callable[[str], T], names: list[str]) -> dict[str, T]:
    """work(name) for every name, all at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return dict(zip(names, pool.map(work, names), strict=True))


def known_sum_row(args: argparse.Namespace, roots: dict[str, str], key: str | None) -> Row:
    a, b = operands()
    request = chat_request(args.model, a, b)

    def ask(unit: str) -> str | None:
        status, body = chat(roots[unit], request, key, args.timeout)
        why, _ = judge_chat(status, body, args.model, (a, b))
        return why

    said = each(ask, list(roots))
    cell = {u: f"{a + b}" if why is None else f"NOT {a + b}: {why}" for u, why in said.items()}
    base = args.baseline_unit
    canaries = "; ".join(f"{u}: {cell[u]}" for u in sorted(roots) if u != base)
    passed = all(why is None for why in said.values())
    return row("answers: known sum", f"{cell[base]} to {question(a, b)!r}", canaries, EXACT, passed)


def open_row(args: argparse.Namespace, roots: dict[str, str], key: str | None) -> Row:
    def ask(pair: str) -> Answer | str:
        unit, index = pair.split("\0")
        request = {
            "model": args.model,
            "messages": [{"role": "user", "content": OPEN_PROMPTS[int(index)]}],
            "max_tokens": OPEN_MAX_TOKENS,
            "temperature": 0,
            "chat_template_kwargs": dict(TEMPLATE_KWARGS),
            "logprobs": True,
            "top_logprobs": TOP_K,
        }
        status, body = chat(roots[unit], request, key, args.timeout)
        try:
            data = json.loads(body) if status == 200 else None
        except ValueError:
            data = None
        got = answer_of(data) if isinstance(data, dict) else None
        return got if got is not None else f"HTTP {status}: {body[:120]!r}"

    pairs = [f"{u}\0{i}" for u in roots for i in range(len(OPEN_PROMPTS))]
    said = each(ask, pairs)
    base = args.baseline_unit
    baseline = [said[f"{base}\0{i}"] for i in range(len(OPEN_PROMPTS))]
    broken = [s for s in baseline if isinstance(s, str)]
    passed = not broken
    cells = []
    for unit in sorted(u for u in roots if u != base):
        notes = []
        for i, b in enumerate(baseline):
            c = said[f"{unit}\0{i}"]
            if isinstance(c, str):
                ok, how = False, c
            elif not isinstance(b, str):
                ok, how = compare(b, c)
            else:
                continue
            passed = passed and ok
            if how != "identical":
                notes.append(f"prompt {i + 1} {how}")
        same = len(OPEN_PROMPTS) - len(notes)
        cells.append(
            f"{unit}: {same}/{len(OPEN_PROMPTS)} identical" + "".join(f"; {n}" for n in notes)
        )
    base_cell = f"{len(OPEN_PROMPTS) - len(broken)}/{len(OPEN_PROMPTS)} answered"
    if broken:
        base_cell += f" ({broken[0]})"
    return row("answers: open prompts", base_cell, "; ".join(cells), open_threshold(), passed)


def speeds(
    args: argparse.Namespace, roots: dict[str, str], key: str | None, ids: tuple[int, int]
) -> dict[str, Speed]:
    """One client per rank, all at once (the module docstring), each one rank's workload."""
    deadline = time.monotonic() + args.timeout
    known = (key,) if key else ()
    work = tempfile.mkdtemp(prefix="canary-")
    try:
        os.chown(work, *ids)

        def one(unit: str) -> Speed:
            out = os.path.join(work, f"{unit}.jsonl")
            words = client_words(args, roots[unit], 1, out)
            code, text = run_client(args, words, key, work, deadline, ids)
            result = read_result(out)
            if result is None:
                tail = " | ".join(mask_journal(text, known).strip().splitlines()[-3:])
                why = f"the client exited {code} ({'timed out' if code == 124 else tail})"
                return Speed(tok_s=0.0, completed=0, prompts=args.prompts_per_rank, why=why)
            return Speed(
                tok_s=round(number(result.get("output_throughput")), 2),
                completed=int(number(result.get("completed"))),
                prompts=args.prompts_per_rank,
                why=None,
            )

        return each(one, list(roots))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def mask(value: object, known: tuple[str, ...]) -> object:
    return mask_journal(value, known) if isinstance(value, str) else value


def write_record(path: str, record: dict[str, object]) -> None:
    """A new file in the record's directory, 0644, renamed over the record."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, fresh = tempfile.mkstemp(prefix=".canary-", suffix=".new", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fd, 0o644)
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fd)
        os.replace(fresh, path)
    except BaseException:
        os.unlink(fresh)
        raise


def compare_ranks(
    argv: list[str], listeners: Callable[[], list[Listener]], secrets: list[str]
) -> tuple[int, str]:
    """The whole comparison: (exit status, the last line). Refused is raised before anything is
    sent; the table is printed as soon as it is known, and `secrets` gets the key once read."""
    args = parse_canary(argv)
    canaries, baseline, workers = checked(args)
    meta = canary_meta(args.meta)
    steps = read_rollback(args.rollback)
    preconditions(args.python, args.module_file, args.tokenizer, CANARY_OFF)
    record_directory(args.record)
    args.baseline_unit = baseline[0]
    apis = {**canaries, baseline[0]: baseline[1]}
    roots = {unit: server_root(url) for unit, url in apis.items()}
    talked = dict(roots)
    if args.router_metrics:
        talked["the router's metrics"] = args.router_metrics
    named = [(name, url, "") for name, url in talked.items()]
    why = listener_refusal(named, args.service_user, listeners())
    if why is not None:
        raise Refused(f"{why} ({WHO_GETS_THE_KEY})")
    ids = service_ids(args.service_user)
    key = read_key(args.key_file)
    if key:
        secrets.append(key)
    started = time.monotonic()
    before = outcomes(metrics(args.router_metrics)) if args.router_metrics else None
    rows = [known_sum_row(args, roots, key), open_row(args, roots, key)]
    measured = combined([speeds(args, roots, key, ids) for _ in range(SPEED_ROUNDS)], baseline[0])
    rows.append(
        speed_row(measured[baseline[0]], {u: measured[u] for u in canaries}, args.max_slowdown)
    )
    if before is not None:
        time.sleep(max(0.0, args.soak - (time.monotonic() - started)))
        after = outcomes(metrics(args.router_metrics))
        names = {u: workers[u] for u in canaries}
        rows.append(
            errors_row(before, after, (baseline[0], workers[baseline[0]]), names, args.soak)
        )
    else:
        rows.append(no_router_row())
    known = tuple(secrets)
    rows = [{k: mask(v, known) for k, v in r.items()} for r in rows]
    ok = all(r["pass"] for r in rows)
    record: dict[str, object] = {"version": 1, "target": args.target, **meta}
    record.update(
        at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        ok=ok,
        paused=bool(args.pause),
        rows=rows,
        rolled_back=False,
    )
    for line in table(rows):
        print(mask_journal(line, known), flush=True)
    write_record(args.record, record)
    verdict = last_line(rows)
    if ok:
        return 0, verdict
    if steps is None:
        return 1, verdict
    code = run("rollback " + ",".join(sorted(canaries)), steps, [])
    if code != 0:
        return 1, f"{verdict}; the rollback FAILED (exit {code}): the canary is left as it is"
    record["rolled_back"] = True
    write_record(args.record, record)
    return 1, f"{verdict}; the canary rolled back"


def main(argv: list[str], listeners: Callable[[], list[Listener]] = read_listeners) -> int:
    """Exit 0 (passed), 1 (failed) or 2 (refused); one line for each failure, masked, never a
    traceback. `listeners`: who listens on this host's TCP ports (a test's own)."""
    if argv[:1] == [WAIT]:  # a rollback step's waiting interpreter (roll_steps)
        wait_for_go(argv[1:])

    def work(secrets: list[str]) -> tuple[int, list[str]]:
        code, line = compare_ranks(argv, listeners, secrets)
        return code, [line]

    return guarded("canary", work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
