"""The load client's run (load_client.py), shared by the throughput check (throughput.py) and
the canary's speed row (canary_compare.py): the load flags both take, the one command line of
the client, its start as the service user with the key in its environment only (never a root
process talking to the ranks, never the key on a command line), stopped past a deadline, and its
result file, read without following a link. Also what both do before it: every port the key
goes to must be the service user's, and the key's read.

Not run on its own: inlined into each program by operations/render/host_scripts.py.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import cast

from operations.programs.api_key_file import read_api_key
from operations.programs.hostsafe import Listener, listening, mask_journal, owner_problem
from operations.programs.load_client import LOAD
from operations.programs.program_main import Refused

WHO_GETS_THE_KEY = (
    "the key is sent only to the service user's listeners; docs/reference/troubleshooting.md "
    '"Who is sent the API key"'
)
# The most of a result file read (one JSON object, a few KiB a rank).
RESULT_MAX = 16 * 2**20
# The fix a refusal offers besides mending the host: the check's setting off.
OFF = "set throughput_check: off"


LOAD_INTS = ("--input-len", "--output-len", "--start", "--most", "--rounds")
LOAD_SECONDS = ("--ramp-timeout", "--window", "--timeout")
# Every flag of the load's shape, as an argparse Namespace names it (the tune's plan digest).
LOAD_KEYS = tuple(
    f.removeprefix("--").replace("-", "_")
    for f in (*LOAD_INTS, "--fixed", *LOAD_SECONDS, "--model")
)


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    """The load's shape, as the plan writes it for both programs (plan/throughput_plan.py
    load_flags): lengths, where the ramp starts and the most it goes to (--fixed: no ramp),
    rounds and their window, the model's served name and the whole run's time budget."""
    for name in LOAD_INTS:
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--fixed", action="store_true")
    for name in LOAD_SECONDS:
        parser.add_argument(name, type=float, required=True)
    parser.add_argument("--model", required=True)


def listener_refusal(
    named: list[tuple[str, str, str]], service_user: str, found: list[Listener]
) -> str | None:
    """Why the key may not be sent: one of `named` (name, URL, how the key reaches it) that
    nothing listens on, or that a listener of another user than the service user may take
    (hostsafe.owner_problem); None when every one is the service user's."""
    for name, url, how in named:
        try:
            where, reaching = listening(url, found)
        except (OSError, ValueError) as error:
            return f"{how}{name}: {url} names no address of this host ({error})"
        why = owner_problem(where, reaching, service_user)
        if why is not None:
            return f"{how}{name}: {why}"
    return None


def read_key(key_file: str) -> str | None:
    """The API key from SGLang's --config file (None: no key set), or Refused naming the
    file."""
    try:
        return read_api_key(key_file)
    except (OSError, ValueError) as error:
        raise Refused(
            f"the API key cannot be read from {key_file} ({type(error).__name__}): it is "
            'SGLang\'s --config file, `api-key: "KEY"` (the deploy writes it)'
        ) from None


def metrics(base: str) -> str:
    """BASE/metrics, read without a proxy."""
    # The ranks are this host's own: no proxy from the environment may answer for them.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base.rstrip("/") + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode("utf-8", "replace")
        return text


def service_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise Refused(f"the service user {user!r} does not exist on this host") from None
    return entry.pw_uid, entry.pw_gid


def load_words(
    script: str,
    ranks: dict[str, str],
    args: argparse.Namespace,
    start: int,
    rounds: int,
    seed: int,
    out: str,
) -> list[str]:
    """The load client's one command line: this program's own script started with LOAD."""
    words = [sys.executable, script, LOAD]
    for name, root in ranks.items():
        words += ["--rank", f"{name}={root}"]
    words += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    words += ["--start", str(start), "--most", str(args.most)]
    words += ["--ramp-timeout", str(args.ramp_timeout)]
    words += ["--rounds", str(rounds), "--window", str(args.window), "--seed", str(seed)]
    words += ["--model", args.model, "--out", out]
    return words + (["--fixed"] if args.fixed else [])


def read_result(path: str) -> dict[str, object] | None:
    """The client's result: its output file, one JSON object; None when there is none. The file
    is in the service user's directory: a link is not followed and only a regular file is read
    (a FIFO would hold root here)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = fh.read(RESULT_MAX).decode("utf-8", "replace").strip()
    try:
        read = json.loads(text) if text else None
    except ValueError:
        return None
    return cast(dict[str, object], read) if isinstance(read, dict) else None


def run_load(
    script: str,
    ranks: dict[str, str],
    args: argparse.Namespace,
    key: str | None,
    user: str,
    start: int,
    rounds: int,
    deadline: float,
) -> tuple[dict[str, object] | None, str]:
    """One run of the load client as `user` over `ranks` (unit -> server root): its result,
    or None and why (masked). A new seed each run (load_client.py: fresh prompts). The work
    directory is the service user's, removed whatever happens."""
    uid, gid = service_ids(user)
    known = (key,) if key else ()
    work = tempfile.mkdtemp(prefix="load-")
    try:
        os.chown(work, uid, gid)
        out = os.path.join(work, "result.json")
        seed = random.SystemRandom().randrange(2**31)
        words = load_words(script, ranks, args, start, rounds, seed, out)
        env = {"PATH": "/usr/bin:/bin", "HOME": work}
        if key:
            env["OPENAI_API_KEY"] = key
        try:
            proc = subprocess.Popen(
                words,
                cwd=work,
                env=env,
                user=uid,
                group=gid,
                extra_groups=os.getgrouplist(user, gid),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as error:
            return None, f"cannot start the load client as {user}: {error}"
        try:
            text, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, "the load client ran past the check's time budget (timed out)"
        result = read_result(out)
        if result is None or "failed" in result:
            tail = " | ".join(mask_journal(text, known).strip().splitlines()[-3:])
            said = mask_journal(str((result or {}).get("failed") or tail), known)
            return None, f"the load client exited {proc.returncode} ({said or 'no output'})"
        return result, ""
    finally:
        shutil.rmtree(work, ignore_errors=True)


def merge_results(first: dict[str, object], more: dict[str, object]) -> dict[str, object]:
    """Two runs' results as one: each rank's windows, requests and errors added up; the second
    run's concurrency (it started where the first ended)."""
    ranks = dict(cast(dict[str, dict[str, object]], first.get("ranks") or {}))
    for name, extra in cast(dict[str, dict[str, object]], more.get("ranks") or {}).items():
        was = dict(ranks.get(name) or {})
        windows = cast(list[object], was.get("windows") or [])
        was["windows"] = windows + cast(list[object], extra.get("windows") or [])
        for count in ("completed", "errors"):
            was[count] = int(cast(int, was.get(count) or 0)) + int(cast(int, extra.get(count) or 0))
        was["first_error"] = was.get("first_error") or extra.get("first_error")
        was["concurrency"] = extra.get("concurrency", was.get("concurrency"))
        ranks[name] = was
    return {**first, "ranks": ranks}
