"""The tune on one host (issue 50, docs/how-to/tune.md): one rank measured with each candidate's
unit, one after the other, then put back on its own unit. Run as root by `python -m operations.tune`
(steps/tune.py); the load client runs as the service user, as the throughput check's does:

    python3 tune.py --unit UNIT --unit-path PATH --url SERVER_ROOT --unit-sha256 HEX
        --state FILE --results FILE
        --budget S --start-estimate S --key-file SECRETS --service-user USER
        --candidates JSON --out STEPS --in STEPS --restart STEPS  <load flags>
        [--max-ttft-ms MS] [--max-itl-ms MS] [--fresh]

--candidates is the plan's list (plan/tune_plan.py: name, changes, lines, refused, unit; the
first is the current settings, unit null). --out/--in are roll-batch steps (roll_steps.run)
that take the rank out of the router and drain it, and put it back; both [] without a router.
--restart: the steps that restart the rank on its unit file, wait for /health and, where the
plan asks, put it a chat question (`smoke`: a candidate that answers wrong is failed).

1. A state file left by a tune that was cut off (--state: the unit, where its own unit was
   saved, the digest of the candidate written, the tune's pid) is dealt with first (refused
   while that pid is still a tune): when the unit file is
   still that candidate's, the saved unit is put back and the rank restarted; when it is not
   (a deploy rewrote it since), the file is left as it is. The rank then rejoins the router and
   the state and the copy are removed.
2. Refused (exit 2, one line, nothing changed): a unit file that is then not the plan's
   (--unit-sha256: the inventory changed it, deploy first), a command line the plan could not
   have written, a rank whose port is not the service user's alone (the key goes only there:
   throughput.py's rule), an unreadable key or unit file.
3. The rank's unit file is copied beside the state file and the state file written, then the
   rank leaves the router and drains (--out).
4. Each candidate in order, then the current settings once more (`current, again`: their
   drift between first and last is part of the noise, tune_table.baseline), while the budget
   (--budget seconds from the start) can still hold it: the current settings are measured as
   they serve; any other's unit is written (a new file renamed over it, 0644), the rank
   restarted (--restart); one that cannot start or never gets
   healthy is shown FAILED with the rank's own journal line, one the plan refused is shown
   FAILED with the plan's reason and never started; a started one is measured by the load
   client (load_client.py: the ramp to a queue, --rounds windows, the rank's own counters).
   Each row is appended to --results as it is known (one JSON line; `"tune"` names the run).
   A start line is appended first (`"event": "start"`: the candidates' names, the budget, the
   plan's digest: the unit the candidates were made from, the candidates, the load; and the
   tune it resumes). The last tune of this unit with the same digest that never wrote its
   summary (cut off) is resumed unless --fresh: its measured and failed candidates are kept
   (`kept_from`), the current settings and the rest are measured (tune_table.resumable). Each
   candidate's line says how far the tune is and how much of the budget is left; the tune's
   command streams its lines to the operator as they come (steps/tune.py).
5. Whatever happens once the state is written (a failure, SIGTERM, SIGINT, SIGHUP): the saved
   unit is written back (when a candidate's was), the rank restarted on it and healthy, and back
   in the router (--in); the state file and the copy are removed only then. SIGKILL leaves the
   state file: step 1 of the next tune.
6. Prints the table, the best (within --max-ttft-ms and --max-itl-ms, the load client's p50s,
   where given) and the group_data lines to apply (tune_table.py), and appends a summary line
   to --results (the proposal, its change and the noise it was judged against). Exit 0 when
   the rank is back on its own unit and serving (a
   failed candidate included), 1 when it could not be put back (said, with how).
The tune changes no setting and writes no file but the rank's unit (and back), the state, the
copy and the results.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import NoReturn, cast

from operations.programs.hostsafe import mask_journal, read_listeners
from operations.programs.load_client import LOAD, load_main
from operations.programs.load_runner import (
    LOAD_KEYS,
    WHO_GETS_THE_KEY,
    add_load_flags,
    listener_refusal,
    read_key,
    run_load,
)
from operations.programs.program_main import Refused
from operations.programs.roll_steps import WAIT, Step, run, steps_of
from operations.programs.roll_waiting import wait_for_go
from operations.programs.throughput_guard import figures
from operations.programs.tune_table import (
    AGAIN,
    Row,
    failed_row,
    is_current,
    measured_row,
    proposal,
    resumable,
    summary,
    table,
)

# The restart step that asks the rank a chat question (steps/tune.py, from the plan's smoke).
SMOKE = "smoke"

# Words in a journal line that name why a start failed, strongest first (the last line with the
# first group's words is shown, else the next group's, else the last line).
FAILURE_WORDS = (("out of memory", "error", "exception"), ("killed", "failed"))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tune.py")
    for name in ("--unit", "--unit-path", "--url", "--state", "--results", "--key-file"):
        parser.add_argument(name, required=True)
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--unit-sha256", required=True)
    parser.add_argument("--max-ttft-ms", type=float, default=None)
    parser.add_argument("--max-itl-ms", type=float, default=None)
    parser.add_argument("--candidates", required=True)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--start-estimate", type=float, required=True)
    parser.add_argument("--fresh", action="store_true")
    for name in ("--out", "--in", "--restart"):
        parser.add_argument(name, default="[]")
    add_load_flags(parser)
    try:
        return parser.parse_args(argv)
    except SystemExit:
        raise Refused(
            "a command line the plan could not have written (argparse said why)"
        ) from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_digest(args: argparse.Namespace, raw: list[dict[str, object]]) -> str:
    """What a resumed tune must share with the cut-off one: the unit the candidates were made
    from, the candidates, the load."""
    what = {
        "unit_sha256": args.unit_sha256,
        "candidates": raw,
        "load": {k: getattr(args, k) for k in LOAD_KEYS},
    }
    return sha256(json.dumps(what, sort_keys=True).encode())


def read_records(path: str) -> list[dict[str, object]]:
    """The results file's records (a line that is not a JSON object is passed over)."""
    records: list[dict[str, object]] = []
    for line in (read_bytes(path) or b"").decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def minutes(seconds: float) -> str:
    return f"{max(0.0, seconds) / 60:.0f} min"


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """A new file beside `path`, renamed over it (a link there is replaced, never followed)."""
    fresh = f"{path}.{os.getpid()}.tune"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fresh)
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, mode)
            fh.write(data)
        os.replace(fresh, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fresh)
        raise


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def journal_line(unit: str, since: float, secrets: tuple[str, ...]) -> str:
    """The rank's own reason: its process's journal lines since `since` (not systemd's lines
    about the unit, `_SYSTEMD_UNIT=`), the last that names a failure (FAILURE_WORDS), else its
    last line; masked."""
    lines: list[str] = []
    for match in (f"_SYSTEMD_UNIT={unit}", f"--unit={unit}"):
        try:
            out = subprocess.run(
                ["journalctl", match, "--since", f"@{int(since)}", "-o", "cat", "--no-pager"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
        except OSError as error:
            return f"(its journal cannot be read: {error.strerror})"
        lines = [x.strip() for x in out.splitlines() if x.strip()]
        if lines:
            break
    return mask_journal(failure_line(lines), secrets)


def failure_line(lines: list[str]) -> str:
    """The line of `lines` that says why a start failed (FAILURE_WORDS), else the last."""
    for words in FAILURE_WORDS:
        said = next((x for x in reversed(lines) if any(w in x.lower() for w in words)), "")
        if said:
            return said
    return lines[-1] if lines else "(no journal line)"


def still_tuning(pid: int) -> bool:
    """Whether `pid` is a live tune (this script: its command line names tune.py)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(w) == b"tune.py" for w in words)


class Tune:
    def __init__(self, args: argparse.Namespace, script: str) -> None:
        self.args = args
        self.script = script
        self.saved = f"{args.state}.unit"
        self.secrets: tuple[str, ...] = ()
        self.out: list[Step] = steps_of(json.loads(args.out))
        self.back_in: list[Step] = steps_of(json.loads(args.__dict__["in"]))
        self.restart: list[Step] = steps_of(json.loads(args.restart))
        self.id = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def say(self, text: str) -> None:
        print(mask_journal(text, self.secrets), flush=True)

    def keep(self, row: Row | dict[str, object]) -> None:
        directory = os.path.dirname(self.args.results)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(self.args.results, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tune": self.id, "unit": self.args.unit, **row}) + "\n")

    def write_state(self, candidate_sha: str | None) -> None:
        state = {"unit": self.args.unit, "unit_path": self.args.unit_path, "saved": self.saved}
        state["candidate_sha256"] = candidate_sha or ""
        state["pid"] = str(os.getpid())
        write_atomic(self.args.state, (json.dumps(state) + "\n").encode())

    def put_back(self, state: dict[str, str]) -> bool:
        """The rank on its saved unit (when the file is still the candidate's), healthy, in
        the router; the state and the copy removed only then. True when all of that held."""
        saved = read_bytes(state.get("saved") or self.saved)
        now = read_bytes(state["unit_path"])
        wrote = state.get("candidate_sha256") or ""
        if saved is not None and wrote and now is not None and sha256(now) == wrote:
            write_atomic(state["unit_path"], saved)
            if run(f"{state['unit']} (tune: back on its own unit)", self.restart, []) != 0:
                self.say(
                    f"tune: {state['unit']} did not get healthy on its own unit again: it stays "
                    f"out of the router; its unit file is its own again ({state['unit_path']}); "
                    f"see `journalctl -u {state['unit']}`, and deploy (pyinfra INVENTORY "
                    "deploy.py) once it is mended"
                )
                return False
        elif wrote and now is not None and sha256(now) != wrote:
            self.say(
                f"tune: {state['unit_path']} was rewritten since the tune wrote it (a deploy): "
                "left as it is"
            )
        if run(f"{state['unit']} (tune: back into the router)", self.back_in, []) != 0:
            self.say(f"tune: {state['unit']} could not rejoin the router: the next deploy does")
            return False
        for path in (self.args.state, state.get("saved") or self.saved):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return True

    def leftover(self) -> None:
        """Step 1 of the docstring."""
        text = read_bytes(self.args.state)
        if text is None:
            return
        try:
            state = cast(dict[str, str], json.loads(text))
            if not isinstance(state.get("unit"), str) or not isinstance(
                state.get("unit_path"), str
            ):
                raise ValueError("no unit or unit_path")
        except (ValueError, AttributeError):
            raise Refused(
                f"the tune's state file {self.args.state} cannot be read; look at it and at "
                f"{self.saved} (the saved unit), put the unit back by hand, remove both"
            ) from None
        pid = state.get("pid") or ""
        if pid.isdigit() and int(pid) != os.getpid() and still_tuning(int(pid)):
            raise Refused(
                f"a tune is still running here (pid {pid}, {self.args.state}): wait for it, or "
                f"stop it (kill {pid}: it puts {state['unit']} back), then tune again"
            )
        self.say(f"tune: a tune was cut off while {state['unit']} was under test: restoring it")
        if not self.put_back(state):
            raise Refused(f"{state['unit']} from the cut-off tune could not be restored (above)")
        self.say(f"tune: {state['unit']} is back on its own unit and in service")

    def measure(self, key: str | None, deadline: float) -> tuple[dict[str, object] | None, str]:
        args = self.args
        ranks = {args.unit: args.url}
        # One measurement's own bound (--timeout), within the whole tune's.
        ends = min(deadline, time.monotonic() + args.timeout)
        return run_load(
            self.script, ranks, args, key, args.service_user, args.start, args.rounds, ends
        )

    def one(self, raw: dict[str, object], key: str | None, deadline: float) -> Row:
        name = str(raw.get("name"))
        lines = [str(x) for x in cast(list[object], raw.get("lines") or [])]
        if raw.get("refused"):
            return failed_row(name, lines, "failed", str(raw["refused"]))
        unit = raw.get("unit")
        if isinstance(unit, str):
            data = unit.encode()
            self.write_state(sha256(data))
            began = time.time()
            write_atomic(self.args.unit_path, data)
            stopped: list[int] = []
            if run(f"{self.args.unit} ({name})", self.restart, [], stopped) != 0:
                why = journal_line(self.args.unit, began, self.secrets)
                step = self.restart[stopped[0]][0] if stopped else ""
                if step == SMOKE:
                    why = f"answers wrong: the chat question failed (its line above); {why}"
                    return failed_row(name, lines, "failed", why)
                return failed_row(name, lines, "failed", f"never healthy: {why}")
        result, failed = self.measure(key, deadline)
        if result is None:
            return failed_row(name, lines, "failed", f"not measured: {failed}")
        figure = figures(result, [self.args.unit])[self.args.unit]
        ranks = cast(dict[str, dict[str, object]], result.get("ranks") or {})
        read = ranks.get(self.args.unit) or {}
        if int(cast(int, read.get("errors") or 0)) > 0:
            why = str(read.get("first_error") or "requests failed")
            return failed_row(name, lines, "failed", f"requests failed: {why}")
        return measured_row(
            name,
            lines,
            figure["rounds"],
            figure["concurrency"],
            read.get("ttft_ms"),
            read.get("itl_ms"),
        )

    def search(self, key: str | None) -> tuple[list[Row], bool]:
        args = self.args
        raw = cast(list[dict[str, object]], json.loads(args.candidates))
        began = time.monotonic()
        deadline = began + args.budget
        per_measure = args.ramp_timeout + args.rounds * args.window
        rows: list[Row] = []
        original = read_bytes(args.unit_path)
        if original is None:
            raise Refused(f"{args.unit_path} cannot be read: nothing changed")
        plan = plan_digest(args, raw)
        resumes, kept = (
            (None, {}) if args.fresh else resumable(read_records(args.results), args.unit, plan)
        )
        # The saved unit and the state first, then the drain: from here on, whatever happens,
        # the rank is put back (its unit if a candidate's was written, the router either way).
        directory = os.path.dirname(args.state)
        if directory:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        write_atomic(self.saved, original)
        self.write_state(None)
        text = original.decode()
        # The current settings once more after every candidate (tune_table.AGAIN): their drift
        # is part of the noise.
        planned: list[dict[str, object]] = [*raw, {"name": AGAIN, "lines": [], "unit": None}]
        names = [str(c.get("name")) for c in planned]
        self.keep(
            {
                "event": "start",
                "candidates": names,
                "budget_s": args.budget,
                "plan": plan,
                "resumes": resumes,
            }
        )
        if resumes is not None:
            self.say(
                f"tune: resuming the tune of {resumes} (cut off): {len(kept)} of its candidates "
                "are kept as measured; the current settings are measured again "
                "(--fresh starts over)"
            )
        restored = False
        try:
            if run(f"{args.unit} (tune: out of the router)", self.out, []) != 0:
                raise Refused(f"{args.unit} could not leave the router and drain (above)")
            for index, candidate in enumerate(planned, 1):
                name = str(candidate.get("name"))
                if name == AGAIN:
                    measured = [r.get("status") == "measured" for r in rows]
                    if not (measured and measured[0] and any(measured[1:])):
                        break  # nothing to compare with the current settings
                    now = read_bytes(args.unit_path)
                    candidate = {**candidate, "unit": None if now == original else text}
                need = per_measure + (args.start_estimate if candidate.get("unit") else 0)
                if name in kept:
                    row: Row = {**kept[name], "kept_from": str(resumes)}
                elif time.monotonic() + need > deadline:
                    left = max(0.0, deadline - time.monotonic())
                    row = failed_row(
                        name,
                        [str(x) for x in cast(list[object], candidate.get("lines") or [])],
                        "skipped",
                        f"the time budget ({args.budget:g} s) has {left:.0f} s left, about "
                        f"{need:.0f} s needed",
                    )
                else:
                    self.say(
                        f"tune: [{index}/{len(planned)}] {name} ... "
                        f"({minutes(time.monotonic() - began)} in, "
                        f"{minutes(deadline - time.monotonic())} of the budget left)"
                    )
                    row = self.one(candidate, key, deadline)
                rows.append(row)
                self.keep(row)
                shown = (
                    f"{row.get('output_tok_s', 0):.1f} output tok/s"
                    if row.get("status") == "measured"
                    else f"{str(row.get('status')).upper()}: {row.get('why')}"
                )
                shown += f" (kept from {resumes})" if "kept_from" in row else ""
                self.say(f"tune: [{index}/{len(planned)}] {name}: {shown}")
        finally:
            # Once restoring, a second signal must not cut it short.
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            state = {
                "unit": args.unit,
                "unit_path": args.unit_path,
                "saved": self.saved,
                "candidate_sha256": sha256(read_bytes(args.unit_path) or b""),
            }
            if read_bytes(args.unit_path) == original:
                state["candidate_sha256"] = ""  # the current settings: no restart needed
            restored = self.put_back(state)
        return rows, restored


def work(argv: list[str], script: str) -> int:
    args = parse(argv)
    tune = Tune(args, script)
    tune.leftover()
    now = read_bytes(args.unit_path)
    if now is None or sha256(now) != args.unit_sha256:
        raise Refused(
            f"{args.unit_path} is not the unit this inventory plans for {args.unit} (a deploy "
            "would rewrite it): deploy (pyinfra INVENTORY deploy.py), then tune; nothing changed"
        )
    why = listener_refusal([(args.unit, args.url, "")], args.service_user, read_listeners())
    if why is not None:
        raise Refused(f"{why} ({WHO_GETS_THE_KEY})")
    key = read_key(args.key_file)
    if key:
        tune.secrets = (key,)
    rows, restored = tune.search(key)
    bounds = (args.max_ttft_ms, args.max_itl_ms)
    for line in table(rows, bounds):
        tune.say(line)
    chosen, said = proposal(rows, bounds)
    tune.say(said)
    lines = chosen.get("lines") or [] if chosen is not None and not is_current(chosen) else []
    for line in lines:
        tune.say(f"    {line}")
    tune.keep({**summary(rows, chosen, said), "proposal": lines, "restored": restored})
    if not restored:
        tune.say(f"tune: FAILED to put {args.unit} back on its own unit (above)")
        return 1
    tune.say(f"tune: {args.unit} is back on its own unit and in service; no setting was changed")
    return 0


def _stop(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: list[str], script: str | None = None) -> int:
    if argv[:1] == [LOAD]:
        return load_main(argv[1:])
    if argv[:1] == [WAIT]:
        wait_for_go(argv[1:])
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _stop)
    own = os.path.abspath(script or sys.argv[0])
    try:
        return work(argv, own)
    except Refused as why:
        print(f"tune: refused: {mask_journal(str(why))}", flush=True)
        return 2
    except Exception as error:  # one line, never a traceback
        print(f"tune: failed: {type(error).__name__}: {mask_journal(str(error))}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
