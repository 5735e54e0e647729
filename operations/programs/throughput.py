"""How fast this host serves: each rank's output tokens per second at saturation, measured with
the toolkit's own load client (load_client.py: one ruler for every check and canary) from the
ranks' own counters, several rounds, judged against the host's earlier records beyond their
noise (throughput_guard.py). Run by the deploy's throughput step (steps/throughput.py) and
`python -m operations.bench`, as root; the load client runs as the service user (no root
process talks to the ranks):

    python3 throughput.py --rank UNIT=SERVER_ROOT ... --input-len I --output-len O
        --start C --most C [--fixed] --ramp-timeout S --rounds R --window S --timeout S
        --model NAME --key-file SECRETS --service-user USER --records FILE [--pending FILE]
        --meta '{"release", "engine", "model_digest", "flags_digest", "workload", "gpu",
                 "driver", "router", "server_args"}'
        --max-slowdown F --guard fail|warn [--ceilings JSON]

1. Refused before anything runs (exit 2, one line `throughput: refused: ...`, no record), with
   the fix: a command line, --meta or --ceilings the plan could not have written, records that
   cannot be read. The key goes only to the service user's listeners, as the smoke's does
   (docs/how-it-works/security.md "Who is sent the API key"): every --rank must be listened
   on, and only by USER (hostsafe.listening and owner_problem, on /proc/net/tcp and tcp6),
   before the key is read or the client starts; a rank whose /metrics cannot be read is
   refused too.
2. The load client measures every rank at once (load_client.py's docstring: the ramp to a
   queue, then --rounds windows of --window seconds, counted by each rank's own counters, the
   clients' traffic included). The ramp starts at half the concurrency the last record of the
   same release and flags found (throughput_guard.start_concurrency), else --start.
3. The verdict (throughput_guard.judge): when the slowdown is past the threshold but within the
   noise, the client runs again for --rounds more rounds while the time budget (--timeout)
   allows one more run as long as the first took, and the verdict is taken on all the rounds.
4. The record (one JSON line) is appended to --records either way; the verdict decides the exit
   status. One line `throughput {...}` (the record and the verdict) and one short line are
   printed. Everything printed or kept is masked (hostsafe.mask_journal, the key included).
5. --pending FILE (layout.THROUGHPUT_PENDING): one JSON line {"started": TIME}, root's, 0644,
   written once the files are found (before the listeners are judged: a refused check is not a
   passed one) and before the client starts, through a new file renamed over it (never written
   through a link); removed only when the verdict is ok (a warning included). A check that
   fails, is refused or is cut off leaves it, and the next deploy runs the check again.

No traceback: what is not one of these lines is one `throughput: failed: TYPE: MESSAGE` (exit 1).
Stopping the client leaves every rank as it was: nothing here restarts or reconfigures a rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable

from operations.programs.hostsafe import Listener, mask_journal, read_listeners
from operations.programs.load_client import LOAD, load_main
from operations.programs.load_runner import (
    WHO_GETS_THE_KEY,
    listener_refusal,
    merge_results,
    metrics,
    read_key,
    run_load,
)
from operations.programs.program_main import Refused, guarded, unit_urls
from operations.programs.throughput_args import (
    PLAN,
    parse,
    read_ceilings,
    read_meta,
    read_records,
)
from operations.programs.throughput_guard import (
    beside_ceilings,
    changed_args,
    judge,
    measured,
    start_concurrency,
)


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
    argv: list[str], script: str, listeners: Callable[[], list[Listener]], secrets: list[str]
) -> tuple[int, list[str]]:
    """The whole check: (exit status, the lines to print). Refused is raised before the client
    runs; `secrets` gets the key once it is read (the caller masks with it)."""
    args = parse(argv)
    ranks = unit_urls(args.rank, "--rank", PLAN)
    meta = read_meta(args.meta)
    ceilings = read_ceilings(args.ceilings)
    history = read_records(args.records)
    began = time.monotonic()
    deadline = began + args.timeout
    now = args.time or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.pending:
        try:
            mark_pending(args.pending, now)
        except OSError as error:
            raise Refused(
                f"the pending marker {args.pending} cannot be written "
                f"({type(error).__name__}: {error.strerror})"
            ) from None
    why = listener_refusal([(n, u, "") for n, u in ranks.items()], args.service_user, listeners())
    if why is not None:
        raise Refused(f"{why} ({WHO_GETS_THE_KEY})")
    key = read_key(args.key_file)
    if key:
        secrets.append(key)
    for name, url in sorted(ranks.items()):
        try:
            metrics(url)
        except (OSError, ValueError) as error:
            raise Refused(
                f"rank {name}: its /metrics ({url.rstrip('/')}/metrics) cannot be read "
                f"({type(error).__name__}: {error}): each rank is measured by its own counters; "
                "see that its unit serves (its journal), deploy again, or set throughput_check: "
                "off"
            ) from None
    start = args.start if args.fixed else start_concurrency(history, meta, args.start)
    result, failed = run_load(
        script, ranks, args, key, args.service_user, start, args.rounds, deadline
    )
    record = measured(meta, result or {"ranks": {}}, list(ranks), now)
    if result is None:
        record["errors"] = max(1, int(record.get("errors") or 0))
        record["first_error"] = failed
    if record.get("first_error"):  # kept and printed: masked, the key included
        record["first_error"] = mask_journal(str(record["first_error"]), tuple(secrets))
    record["changed_args"] = changed_args(history, record)
    verdict = judge(record, history, args.max_slowdown, args.guard, final=False)
    while result is not None and verdict.undecided:
        took = time.monotonic() - began
        if deadline - time.monotonic() < took:
            break
        found = min((f["concurrency"] for f in record["per_rank"].values()), default=args.start)
        more, _ = run_load(
            script, ranks, args, key, args.service_user, found, args.rounds, deadline
        )
        if more is None:
            break
        result = merge_results(result, more)
        kept = record["changed_args"]
        record = {**measured(meta, result, list(ranks), now), "changed_args": kept}
        verdict = judge(record, history, args.max_slowdown, args.guard, final=False)
    if verdict.undecided:
        verdict = judge(record, history, args.max_slowdown, args.guard, final=True)
    line = verdict.line
    beside = beside_ceilings(record, ceilings)
    if beside is not None:
        line += f"; {beside}"
    record["verdict"] = verdict.outcome()
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
    if verdict.ok and args.pending:
        # One left behind (a directory made there since) only runs the check again.
        with contextlib.suppress(OSError):
            os.unlink(args.pending)
    return (0 if verdict.ok else 1), shown


def main(
    argv: list[str],
    listeners: Callable[[], list[Listener]] = read_listeners,
    script: str | None = None,
) -> int:
    """Exit 0 (the check passed, a warning included), 1 (it failed) or 2 (refused before the
    client ran); one line for each failure, masked, never a traceback. `listeners`: who listens
    on this host's TCP ports (hostsafe.read_listeners; a test's own); `script`: this program's
    file, which the load client is started from (sys.argv[0])."""
    if argv[:1] == [LOAD]:
        return load_main(argv[1:])
    own = os.path.abspath(script or sys.argv[0])
    return guarded("throughput", lambda secrets: check(argv, own, listeners, secrets))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
