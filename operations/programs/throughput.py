"""How fast this host serves, measured with the serving engine's own benchmark client.

Run by the deploy's throughput step (steps/throughput.py) and `python -m operations.bench`, as
root; the client itself runs as the service user (no root process talks to the ranks):

    python3 throughput.py --python ENGINE_PYTHON --module sglang.bench_serving
        --module-file sglang/bench_serving.py --model NAME --tokenizer MODEL_DIR
        --target router=URL | --target UNIT=URL ... --rank UNIT=URL ...
        --input-len I --output-len O --concurrency-per-rank C --prompts-per-rank N
        --timeout S --key-file SECRETS --service-user USER --records FILE
        --meta '{"release": ..., "engine": ..., "model_digest": ..., "flags_digest": ...}'
        --max-slowdown F --guard fail|warn

1. Refused before anything runs, with the fix: no tokenizer in the model copy (the client loads
   it from there, offline), an engine without the client module (the file the knowledge base
   names for the release: operations/kb/knowledge/bench/).
2. Each rank's counters are read before and after (`sglang:generation_tokens_total`,
   `sglang:num_requests_total`: series_total, on rank_metrics.sample), for its share of the run.
3. The client runs once through the router (`--target router=URL`: concurrency and prompts are
   per rank times the ranks), or once per rank, all at once (one --target per rank), with
   `--backend sglang-oai --dataset-name random-ids --random-range-ratio 1.0`: fixed-length
   random token ids, nothing downloaded (HF_HUB_OFFLINE). The key reaches it as the environment
   variable OPENAI_API_KEY, which it sends as `Authorization: Bearer KEY` (0.5.11
   sglang/bench_serving.py:114-121, get_auth_headers; API_KEY alone would be sent without
   "Bearer", which SGLang refuses). It is stopped (its process group) past --timeout.
4. The record (one JSON line) is appended to --records either way; the verdict
   (throughput_guard.judge, and starved ranks through the router) decides the exit status.
   One line `throughput {...}` (the record and the verdict) and one short line are printed.

Stopping the client leaves every rank as it was: nothing here restarts or reconfigures a rank.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from operations.programs.api_key_file import read_api_key
from operations.programs.rank_metrics import sample
from operations.programs.throughput_guard import (
    Ceilings,
    Meta,
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
# What the client's tokenizer load needs in the model copy (transformers' AutoTokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class Refused(Exception):
    """Bad input found before anything ran: one line, with its fix."""


def _pairs(values: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values)


def preconditions(python: str, module_file: str, tokenizer: str) -> None:
    if not any(os.path.isfile(os.path.join(tokenizer, f)) for f in TOKENIZER_FILES):
        raise Refused(
            f"the model copy {tokenizer} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): the "
            "benchmark client loads it from there, offline; stage a model with its tokenizer "
            "files (on the controller: model_source), or set throughput_check: off"
        )
    env = os.path.dirname(os.path.dirname(python))
    found = glob.glob(os.path.join(env, "lib", "python3*", "site-packages", module_file))
    if not found:
        raise Refused(
            f"the engine {env} has no {module_file}, SGLang's benchmark client for this release "
            "(knowledge/bench/ names it from the release's wheel): the engine is not the "
            "release's; on the host remove that environment and deploy again from the "
            "controller, or set throughput_check: off"
        )


def series_total(text: str, name: str) -> float | None:
    """A counter on a rank's /metrics page summed over its series (rank_metrics.sample reads
    each line); None when the page has no sample of it."""
    total: float | None = None
    for line in text.splitlines():
        read = sample(line)
        if read is not None and read[0] == name:
            total = (total or 0.0) + read[1]
    return total


def metrics(base: str) -> str:
    with urllib.request.urlopen(base.rstrip("/") + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode("utf-8", "replace")
        return text


def counters(ranks: dict[str, str]) -> dict[str, tuple[float, float]]:
    def one(item: tuple[str, str]) -> tuple[str, tuple[float, float]]:
        text = metrics(item[1])
        return item[0], (series_total(text, GENERATED) or 0.0, series_total(text, REQUESTS) or 0.0)

    with ThreadPoolExecutor(max_workers=max(1, len(ranks))) as pool:
        return dict(pool.map(one, ranks.items()))


def client_words(args: argparse.Namespace, url: str, ranks: int, out: str) -> list[str]:
    words = [args.python, "-m", args.module, "--backend", "sglang-oai", "--base-url", url]
    words += ["--model", args.model, "--tokenizer", args.tokenizer]
    words += ["--dataset-name", "random-ids", "--random-range-ratio", "1.0"]
    words += ["--random-input-len", str(args.input_len)]
    words += ["--random-output-len", str(args.output_len)]
    words += ["--num-prompts", str(args.prompts_per_rank * ranks)]
    words += ["--max-concurrency", str(args.concurrency_per_rank * ranks)]
    words += ["--output-file", out, "--disable-tqdm", "--seed", "1"]
    # The client sends `"best_of": 1` with `"stream": true` (0.5.11 bench_serving.py:242), which
    # smg refuses with 400 "best_of is not supported when stream is enabled" (its
    # CompletionRequest check `req.stream && req.best_of.is_some()`); the extra body is merged
    # last (payload.update, :259): null is no best_of for smg and SGLang alike.
    words += ["--extra-request-body", json.dumps({"best_of": None})]
    return words


def run_client(
    args: argparse.Namespace, words: list[str], key: str | None, work: str, deadline: float
) -> tuple[int, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": work,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    if key:
        env["OPENAI_API_KEY"] = key
    try:
        # The service user's own groups too: the model copy is readable by its group (0o640,
        # stage_copy.py), and Popen(user=) alone keeps root's groups.
        uid, gid = _ids(args.service_user)
        proc = subprocess.Popen(
            words,
            cwd=work,
            env=env,
            user=uid,
            group=gid,
            extra_groups=os.getgrouplist(args.service_user, gid),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except OSError as error:
        return 126, f"cannot start {words[0]} as {args.service_user}: {error}"
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out
    return proc.returncode, out


Result = dict[str, object]  # the client's --output-file line, read field by field


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _read_result(path: str) -> Result | None:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [line for line in fh.read().splitlines() if line.strip()]
    except FileNotFoundError:
        return None
    if not lines:
        return None
    read = json.loads(lines[-1])
    return cast(Result, read) if isinstance(read, dict) else None


def measure(args: argparse.Namespace, key: str | None, record: Record) -> None:
    """Run the client(s); the record's measured part."""
    ranks = _pairs(args.rank)
    targets = _pairs(args.target)
    through = ROUTER in targets
    before = counters(ranks)
    deadline = time.monotonic() + args.timeout
    work = tempfile.mkdtemp(prefix="throughput-")
    os.chown(work, *_ids(args.service_user))
    runs = {name: (url, 1 if not through else len(ranks)) for name, url in targets.items()}

    def one(item: tuple[str, tuple[str, int]]) -> tuple[str, tuple[int, str, Result | None]]:
        name, (url, count) = item
        out = os.path.join(work, f"{name}.jsonl")
        code, text = run_client(args, client_words(args, url, count, out), key, work, deadline)
        return name, (code, text, _read_result(out))

    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        results = dict(pool.map(one, runs.items()))
    after = counters(ranks)
    combine(args, results, before, after, record)


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def combine(
    args: argparse.Namespace,
    results: dict[str, tuple[int, str, Result | None]],
    before: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    record: Record,
) -> None:
    """The measured part of a record from each client's result and the ranks' counters."""
    prompts = args.prompts_per_rank * len(before)
    done = [r for _, _, r in results.values() if r]
    failed = {n: (c, t) for n, (c, t, r) in results.items() if not r}
    completed = int(sum(_num(r.get("completed")) for r in done))
    duration = max((_num(r.get("duration")) for r in done), default=0.0)
    per_rank: dict[str, RankShare] = {}
    for name in before:
        generated = after[name][0] - before[name][0]
        per_rank[name] = {
            "generated": generated,
            "requests": after[name][1] - before[name][1],
            "output_tok_s": round(generated / duration, 2) if duration > 0 else 0.0,
        }

    def pick(median: str, p99: str) -> Percentiles:
        mids = sorted(_num(r[median]) for r in done if r.get(median) is not None)
        tops = [_num(r[p99]) for r in done if r.get(p99) is not None]
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
    record["output_tok_s"] = round(sum(_num(r.get("output_throughput")) for r in done), 2)
    record["total_tok_s"] = round(sum(_num(r.get("total_throughput")) for r in done), 2)
    record["per_rank"] = per_rank
    # Per rank (no router): the median of the ranks' medians, the worst p99.
    record["ttft_ms"] = pick("median_ttft_ms", "p99_ttft_ms")
    record["itl_ms"] = pick("median_itl_ms", "p99_itl_ms")
    record["e2e_ms"] = pick("median_e2e_latency_ms", "p99_e2e_latency_ms")


def read_records(path: str) -> list[Record]:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            read = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: the others stand
        if isinstance(read, dict):
            records.append(cast(Record, read))
    return records


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="throughput.py")
    for name in ("--python", "--module", "--module-file", "--model", "--tokenizer"):
        parser.add_argument(name, required=True)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--rank", action="append", required=True)
    for name in ("--input-len", "--output-len", "--concurrency-per-rank", "--prompts-per-rank"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--key-file")
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--records", required=True)
    parser.add_argument("--meta", required=True)
    parser.add_argument("--max-slowdown", type=float, required=True)
    parser.add_argument("--guard", choices=("fail", "warn"), required=True)
    parser.add_argument("--time", default=None)
    # The card's ceilings as JSON (throughput_guard.Ceilings); absent: not shown.
    parser.add_argument("--ceilings", default=None)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        preconditions(args.python, args.module_file, args.tokenizer)
    except Refused as why:
        print(f"throughput: refused: {why}", flush=True)
        return 2
    key = read_api_key(args.key_file)
    history = read_records(args.records)
    meta = cast(Meta, json.loads(args.meta))
    record: Record = {
        "release": meta["release"],
        "engine": meta["engine"],
        "model_digest": meta["model_digest"],
        "flags_digest": meta["flags_digest"],
        "workload": meta["workload"],
        "time": args.time or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ranks": len(args.rank),
        "through": meta["workload"]["through"],
    }
    measure(args, key, record)
    verdict = judge(record, history, args.max_slowdown, args.guard)
    hungry = starved({n: r["generated"] for n, r in record["per_rank"].items()})
    ok, line = verdict.ok, verdict.line
    if record["through"] == ROUTER and hungry and record["completed"]:
        ok = False
        counts = ", ".join(f"{n}: {record['per_rank'][n]['generated']:g}" for n in hungry)
        line += (
            f"; rank(s) {', '.join(hungry)} took (almost) no load through the router "
            f"(generated tokens {counts}; an even share is {1 / len(args.rank):.0%})"
        )
    ceilings = cast(Ceilings, json.loads(args.ceilings)) if args.ceilings else None
    beside = beside_ceilings(record, ceilings)
    if beside is not None:
        line += f"; {beside}"
    record["verdict"] = {"ok": ok, "ratio": verdict.ratio, "fell": verdict.fell}
    os.makedirs(os.path.dirname(args.records), exist_ok=True)
    with open(args.records, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    print("throughput " + json.dumps(record, sort_keys=True), flush=True)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
