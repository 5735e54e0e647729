#!/usr/bin/env python3
"""Compare canary ranks (the new engine or flags) with baseline ranks (still the old ones) on
answers, speed and errors, print the verdict table, keep it, and on a failed verdict roll the
canary back (issues 45, 49). Run as root by the deploy; the load client runs as the service
user, as the throughput check's does:

    python3 canary_compare.py --canary UNIT=API_BASE [--canary ...] --baseline UNIT=API_BASE
        [--baseline ...] [--held UNIT ...]
        --key-file PATH --service-user USER --max-slowdown F --soak SECONDS
        --record PATH --target HEXDIGEST --meta JSON
        [--router-metrics URL --worker UNIT=WORKER_URL ...]
        --input-len N --output-len N --start C --most C [--fixed] --ramp-timeout S
        --rounds R --window S --timeout S --model SERVED_NAME
        [--rollback STEPS_JSON] [--pause]

API_BASE is a rank's OpenAI base as layout.rank_api_base writes it (`http://127.0.0.1:30001/v1`);
the rank's server root is that without `/v1`. WORKER_URL is the rank as the router names it in
its metrics' `worker` label. The load flags are the throughput check's
(plan/throughput_plan.load_flags).

1. Refused (exit 2, one line `canary: refused: ...`, nothing sent, nothing kept): a command line,
   --meta or --rollback the plan could not have written (programs/canary_args.py), a record
   directory that is not root's alone. Then every port this talks to (each canary, each
   baseline, --router-metrics) that is listened on must be listened on only by USER
   (hostsafe.listening and owner_problem: throughput.py's rule,
   docs/how-it-works/security.md "Who is sent the API key"), before the key file is read. A
   rank nothing listens for is not refused: a canary that died fails its rows, a baseline down
   is dropped (below).
   Baselines (several --baseline, the plan's order): each is judged too. One that is down, does
   not answer the sum, does not answer an open prompt or whose requests fail in the speed run is
   named as the baseline's fault and dropped, never counted against the canary; the open
   prompts' reference is the first baseline left, the errors row's too. No baseline left: no
   verdict ("canary: NOT JUDGED", nothing kept, the canary rolled back with --rollback; the
   next run judges again).
2. The rows (programs/canary_rows.py decides each, and documents its tolerance):
   - answers: known sum: the smoke's question (smoke_answers.chat_request) to every rank;
   - answers: open prompts: canary_rows.OPEN_PROMPTS to every rank at temperature 0 with
     `logprobs` and `top_logprobs` asked, compared token by token with the baseline's;
   - speed: the load client (load_runner.run_load: the throughput check's ruler) against every
     canary and every baseline AT ONCE, each rank's capacity at saturation over --rounds
     windows; the baseline figure is the baselines' median, their spread the noise (identical
     ranks side by side: this host's own A/A measure). The ranks are on separate GPUs, so
     running them together costs neither anything; measuring them in the same windows puts
     any drift of the host's load, clocks and temperature on both sides alike. A verdict within
     the noise of the threshold measures as many rounds again while --timeout allows.
   - errors: with --router-metrics, the router's /metrics is read when the comparison starts and
     again once --soak seconds have passed (the rows above run meanwhile; users' traffic through
     the router keeps flowing), and each canary worker's failures are compared with the
     baseline worker's. Without a router the soak is skipped and the row says so.
3. Prints the table (a header, each row wrapped to its columns) and last `canary: passed` or
   `canary: FAILED (CHECKS)`; everything printed or kept is masked (hostsafe.mask_journal, the
   key included). The record (--record) is one JSON object, written to a new file in its
   directory and renamed over the old one, 0644: {"version": 1, "target", "release", "engine",
   "canary_ranks", "baseline_rank" (from --meta), "at" (UTC), "ok", "paused" (--pause), "rows":
   [{check, baseline, canary, threshold, pass}], "rolled_back", "baselines": {"used",
   "dropped": {UNIT: why}, "tok_s": {UNIT: median}, "spread"}}; "baseline_rank" is the rank
   of the first baseline used (--meta's "baseline_ranks", in --baseline's order).
4. A failed verdict with --rollback: its steps run here (roll_steps.run, as a roll batch runs
   them: drain the canaries, restore their unit files, reload, restart, wait healthy, smoke,
   rejoin); when they all pass the record is written again with "rolled_back": true. The last
   line says whether the rollback passed, and names the --held ranks (not serving when the
   deploy started: they stay stopped, never started on the rejected engine or flags).

Exit 0: passed; 1: failed (after the rollback, whichever way it went), or what nothing above
names (one line `canary: failed: TYPE: MESSAGE`, never a traceback); 2: refused.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
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
    TOP_K,
    Answer,
    RankSpeed,
    answer_of,
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
    listening,
    mask_journal,
    read_listeners,
)
from operations.programs.load_client import LOAD, load_main
from operations.programs.load_runner import (
    WHO_GETS_THE_KEY,
    listener_refusal,
    merge_results,
    metrics,
    read_key,
    run_load,
    service_ids,
)
from operations.programs.program_main import Refused, guarded
from operations.programs.roll_steps import WAIT, Step, run
from operations.programs.roll_waiting import wait_for_go
from operations.programs.smoke_answers import (
    TEMPLATE_KWARGS,
    chat_request,
    judge_chat,
    operands,
    question,
)
from operations.programs.throughput_guard import figures, noise

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


def known_sum_row(
    args: argparse.Namespace,
    roots: dict[str, str],
    key: str | None,
    bases: list[str],
    gone: dict[str, str],
) -> Row:
    """The smoke's question to every rank. A baseline that does not answer the sum is the
    baseline's fault: named, and dropped into `gone`; only the canaries' answers judge the
    canary (one named in `gone` already is not asked)."""
    a, b = operands()
    request = chat_request(args.model, a, b)

    def ask(unit: str) -> str | None:
        status, body = chat(roots[unit], request, key, args.timeout)
        why, _ = judge_chat(status, body, args.model, (a, b))
        return why

    said = each(ask, [u for u in roots if u not in gone])
    for unit in bases:
        if unit in said and said[unit] is not None:
            gone[unit] = f"known sum: {said[unit]}"
    cell = {u: f"{a + b}" if why is None else f"NOT {a + b}: {why}" for u, why in said.items()}
    canaries = "; ".join(f"{u}: {cell.get(u, gone.get(u, ''))}" for u in canary_units(roots, bases))
    passed = all(said.get(u, "not asked") is None for u in canary_units(roots, bases))
    return row(
        "answers: known sum",
        f"{baseline_cells(bases, cell, gone)} to {question(a, b)!r}",
        canaries,
        EXACT,
        passed,
    )


def canary_units(roots: dict[str, str], bases: list[str]) -> list[str]:
    return sorted(u for u in roots if u not in bases)


def baseline_cells(bases: list[str], cell: dict[str, str], gone: dict[str, str]) -> str:
    """Each baseline's cell; one dropped says so (its fault, not the canary's)."""
    return "; ".join(
        f"{u}: {cell.get(u, '-')}" + (" (the baseline's fault: dropped)" if u in gone else "")
        for u in bases
    )


def open_row(
    args: argparse.Namespace,
    roots: dict[str, str],
    key: str | None,
    bases: list[str],
    gone: dict[str, str],
) -> Row:
    """OPEN_PROMPTS to every rank; the reference is the first baseline that answers them all
    (one that does not is the baseline's fault: dropped into `gone`)."""

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

    asked = [u for u in roots if u not in gone]
    said = each(ask, [f"{u}\0{i}" for u in asked for i in range(len(OPEN_PROMPTS))])
    answers = {u: [said[f"{u}\0{i}"] for i in range(len(OPEN_PROMPTS))] for u in asked}
    cell: dict[str, str] = {}
    for unit in [u for u in bases if u in answers]:
        broken = [s for s in answers[unit] if isinstance(s, str)]
        cell[unit] = f"{len(OPEN_PROMPTS) - len(broken)}/{len(OPEN_PROMPTS)} answered"
        if broken:
            cell[unit] += f" ({broken[0]})"
            gone[unit] = f"open prompts: {broken[0]}"
    reference = next((u for u in bases if u not in gone), None)
    passed = True
    cells = []
    for unit in canary_units(roots, bases):
        if unit not in answers:
            passed = False
            cells.append(f"{unit}: {gone.get(unit, 'not asked')}")
            continue
        notes = []
        for i, c in enumerate(answers[unit]):
            b = answers[reference][i] if reference is not None else None
            if isinstance(c, str):
                ok, how = False, c
            elif b is not None and not isinstance(b, str):
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
    base_cell = baseline_cells([u for u in bases if u in cell], cell, gone)
    if reference is not None and len(bases) > 1:
        base_cell += f"; reference {reference}"
    return row("answers: open prompts", base_cell, "; ".join(cells), open_threshold(), passed)


def speeds(
    args: argparse.Namespace, live: dict[str, str], key: str | None, script: str, deadline: float
) -> tuple[dict[str, RankSpeed], str | None]:
    """Every live rank's capacity, all at once, by the load client (load_runner.run_load):
    --rounds windows, and as many again while the verdict is undecided (compare_ranks); or
    why there is no figure."""
    result, why = run_load(
        script, live, args, key, args.service_user, args.start, args.rounds, deadline
    )
    if result is None:
        return {}, why
    args.last_result = (
        merge_results(args.last_result, result) if getattr(args, "last_result", None) else result
    )
    return speeds_of(args.last_result, list(live)), None


def speeds_of(result: dict[str, object], units: list[str]) -> dict[str, RankSpeed]:
    figure = figures(result, units)
    read = result.get("ranks")
    raw = read if isinstance(read, dict) else {}
    out: dict[str, RankSpeed] = {}
    for unit in units:
        got = raw.get(unit)
        rank: dict[str, object] = got if isinstance(got, dict) else {}
        errors = int(str(rank.get("errors") or 0))
        out[unit] = {
            "tok_s": figure[unit]["output_tok_s"],
            "rounds": figure[unit]["rounds"],
            "errors": errors,
            "why": f"{errors} requests failed ({rank.get('first_error')})" if errors else None,
        }
    return out


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


BASELINES = "the baselines' median"


def dead_ranks(roots: dict[str, str], found: list[Listener]) -> dict[str, str]:
    """The ranks nothing listens for (a canary that died, a baseline down): unit -> why. A
    port held by another user is no dead rank: listener_refusal refuses it before the key."""
    dead = {}
    for unit, url in roots.items():
        try:
            where, reaching = listening(url, found)
        except (OSError, ValueError):
            continue  # listener_refusal names it
        if not reaching:
            dead[unit] = f"not serving: nothing listens on {where}"
    return dead


def spread_of(per: dict[str, float]) -> float:
    """The baselines' spread as the speed row reads it: throughput_guard.noise (half their range
    over their median); 0 with one baseline."""
    return round(noise(list(per.values())), 4)


def speed_verdict(
    args: argparse.Namespace,
    live: dict[str, str],
    key: str | None,
    script: str,
    bases: list[str],
    canaries: list[str],
    gone: dict[str, str],
) -> tuple[Row, dict[str, float]]:
    """The speed row (canary_rows.speed_row): measured, and measured again while it is
    undecided and the time budget allows another run as long as the first; a baseline whose
    requests failed is the baseline's fault, dropped into `gone`. Also each baseline kept's
    figure, for the record."""
    began = time.monotonic()
    deadline = began + args.timeout
    args.last_result = None
    measured, why = speeds(args, live, key, script, deadline)
    while True:
        for unit in bases:
            if unit in measured and measured[unit]["why"] is not None and unit not in gone:
                gone[unit] = f"speed: {measured[unit]['why']}"
        kept = {u: measured[u] for u in bases if u in measured and u not in gone}
        cans: dict[str, RankSpeed] = {
            u: measured.get(u)
            or {"tok_s": 0.0, "rounds": [], "errors": 0, "why": why or gone.get(u)}
            for u in canaries
        }
        more_time = deadline - time.monotonic() > time.monotonic() - began
        speed, undecided = speed_row(kept, cans, args.max_slowdown, final=not more_time)
        if not undecided or why is not None:
            break
        again, why = speeds(args, live, key, script, deadline)
        measured = again or measured
    if why is not None and not measured:
        speed["canary"] = f"no figure: {why}"
        speed["pass"] = False
    return speed, {u: m["tok_s"] for u, m in kept.items()}


def compare_ranks(
    argv: list[str], listeners: Callable[[], list[Listener]], secrets: list[str], script: str
) -> tuple[int, str]:
    """The whole comparison: (exit status, the last line). Refused is raised before anything is
    sent; the table is printed as soon as it is known, and `secrets` gets the key once read."""
    args = parse_canary(argv)
    canaries, baselines, workers = checked(args)
    meta = canary_meta(args.meta)
    steps = read_rollback(args.rollback)
    record_directory(args.record)
    bases = list(baselines)
    apis = {**canaries, **baselines}
    roots = {unit: server_root(url) for unit, url in apis.items()}
    found = listeners()
    # A rank nothing listens for is no refusal: a canary that died fails, a baseline down is
    # dropped. Everything that listens must be the service user's before the key is read.
    gone = dead_ranks(roots, found)
    talked = {u: url for u, url in roots.items() if u not in gone}
    if args.router_metrics:
        talked["the router's metrics"] = args.router_metrics
    named = [(name, url, "") for name, url in talked.items()]
    why = listener_refusal(named, args.service_user, found)
    if why is not None:
        raise Refused(f"{why} ({WHO_GETS_THE_KEY})")
    service_ids(args.service_user)
    key = read_key(args.key_file)
    if key:
        secrets.append(key)
    started = time.monotonic()
    before = outcomes(metrics(args.router_metrics)) if args.router_metrics else None
    rows = [
        known_sum_row(args, roots, key, bases, gone),
        open_row(args, roots, key, bases, gone),
    ]
    live = {u: r for u, r in roots.items() if u not in gone}
    per: dict[str, float] = {}
    if any(u in live for u in bases):
        speed, per = speed_verdict(args, live, key, script, bases, list(canaries), gone)
        rows.append(speed)
    kept = [u for u in bases if u not in gone]
    if before is not None and kept:
        time.sleep(max(0.0, args.soak - (time.monotonic() - started)))
        after = outcomes(metrics(args.router_metrics))
        names = {u: workers[u] for u in canaries}
        rows.append(errors_row(before, after, (kept[0], workers[kept[0]]), names, args.soak))
    elif before is None:
        rows.append(no_router_row())
    known = tuple(secrets)
    rows = [{k: mask(v, known) for k, v in r.items()} for r in rows]
    for line in table(rows):
        print(mask_journal(line, known), flush=True)
    dropped = {u: mask_journal(w, known) for u, w in gone.items() if u in baselines}
    if not kept:
        return not_judged(dropped, steps, canaries)
    ok = all(r["pass"] for r in rows)
    record: dict[str, object] = {"version": 1, "target": args.target, **meta}
    ranks = meta.get("baseline_ranks")
    if isinstance(ranks, list) and len(ranks) == len(bases):
        record["baseline_rank"] = ranks[bases.index(kept[0])]
    record.update(
        at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        ok=ok,
        paused=bool(args.pause),
        rows=rows,
        rolled_back=False,
        baselines={"used": kept, "dropped": dropped, "tok_s": per, "spread": spread_of(per)},
    )
    write_record(args.record, record)
    verdict = last_line(rows)
    if ok:
        return 0, verdict
    stays = (
        f"; {', '.join(args.held)} not started: stopped until a verdict passes" if args.held else ""
    )
    if steps is None:
        return 1, verdict + stays
    code = run("rollback " + ",".join(sorted(canaries)), steps, [])
    if code != 0:
        return (
            1,
            f"{verdict}; the rollback FAILED (exit {code}): the canary is left as it is{stays}",
        )
    record["rolled_back"] = True
    write_record(args.record, record)
    return 1, f"{verdict}; the canary rolled back{stays}"


def not_judged(
    dropped: dict[str, str], steps: list[Step] | None, canaries: dict[str, str]
) -> tuple[int, str]:
    """No baseline left to judge by: the baselines' fault, never the canary's. No verdict is
    kept (the next run judges again); the canary goes back to its old units, as no verdict
    passed for it."""
    why = "; ".join(f"{u}: {w}" for u, w in dropped.items())
    line = (
        f"canary: NOT JUDGED: every baseline failed ({why}): the baselines' fault, not the canary's"
    )
    if steps is None:
        return 1, line
    code = run("rollback " + ",".join(sorted(canaries)), steps, [])
    if code != 0:
        return 1, f"{line}; the rollback FAILED (exit {code}): the canary is left as it is"
    return 1, f"{line}; the canary rolled back; the next run judges again"


def main(
    argv: list[str],
    listeners: Callable[[], list[Listener]] = read_listeners,
    script: str | None = None,
) -> int:
    """Exit 0 (passed), 1 (failed) or 2 (refused); one line for each failure, masked, never a
    traceback. `listeners`: who listens on this host's TCP ports (a test's own); `script`: this
    program's file, which the load client is started from (sys.argv[0])."""
    if argv[:1] == [WAIT]:  # a rollback step's waiting interpreter (roll_steps)
        wait_for_go(argv[1:])
    if argv[:1] == [LOAD]:  # the speed row's load client, as the service user
        return load_main(argv[1:])
    own = os.path.abspath(script or sys.argv[0])

    def work(secrets: list[str]) -> tuple[int, list[str]]:
        code, line = compare_ranks(argv, listeners, secrets, own)
        return code, [line]

    return guarded("canary", work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
