"""The benchmark client's run, shared by the throughput check (programs/throughput.py) and the
canary's speed row (programs/canary_compare.py): what must be there before it runs (the
tokenizer, the engine's client module), its command line, its start as the service user with
the key in its environment only, stopped past a deadline, and its result file, read without
following a link. throughput.py's docstring (3.) says why each is so. Also what both programs do
around it: the check that every port the key goes to is the service user's, the key's read,
and the main that masks every line and never prints a traceback (`guarded`).

Not run on its own: inlined into each program by operations/render/host_scripts.py.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import signal
import stat
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import cast

from operations.programs.api_key_file import read_api_key
from operations.programs.hostsafe import Listener, listening, mask_journal, owner_problem
from operations.programs.throughput_args import Refused
from operations.programs.tokenizer_files import TOKENIZER_FILES

WHO_GETS_THE_KEY = (
    "the key is sent only to the service user's listeners; docs/reference/troubleshooting.md "
    '"Who is sent the API key"'
)
# The most of a client's result file read (its last line is the result; a few MiB at most).
RESULT_MAX = 64 * 2**20
# The fix a refusal offers besides mending the host: the check's setting off.
OFF = "set throughput_check: off"


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


Work = Callable[[list[str]], tuple[int, list[str]]]


def guarded(name: str, work: Work) -> int:
    """A program's main: work(secrets) gives (exit status, its lines), and puts the key in
    `secrets` once it is read; every line printed is masked with it. Refused: exit 2 and one
    line; anything else: exit 1 and one line, never a traceback."""
    secrets: list[str] = []

    def say(text: str) -> None:
        print(mask_journal(text, tuple(secrets)), flush=True)

    try:
        code, lines = work(secrets)
    except Refused as why:
        say(f"{name}: refused: {why}")
        return 2
    except Exception as error:  # what no line above names: one line, not a traceback
        say(f"{name}: failed: {type(error).__name__}: {error}")
        return 1
    for line in lines:
        say(line)
    return code


def preconditions(python: str, module_file: str, tokenizer: str, off: str = OFF) -> None:
    """Refused: no tokenizer in the model copy, or no client module in the engine."""
    if not any(os.path.isfile(os.path.join(tokenizer, f)) for f in TOKENIZER_FILES):
        raise Refused(
            f"the model copy {tokenizer} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): the "
            "benchmark client loads it from there, offline; stage a model with its tokenizer "
            "files (on the controller: model_source), or " + off
        )
    env = os.path.dirname(os.path.dirname(python))
    found = glob.glob(os.path.join(env, "lib", "python3*", "site-packages", module_file))
    if not found:
        raise Refused(
            f"the engine {env} has no {module_file}, SGLang's benchmark client for this release "
            "(knowledge/bench/ names it from the release's wheel): the engine is not the "
            "release's; on the host remove that environment and deploy again from the "
            "controller, or " + off
        )


def metrics(base: str) -> str:
    """BASE/metrics, read without a proxy."""
    # The ranks are this host's own: no proxy from the environment may answer for them.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base.rstrip("/") + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode("utf-8", "replace")
        return text


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
    args: argparse.Namespace,
    words: list[str],
    key: str | None,
    work: str,
    deadline: float,
    ids: tuple[int, int],
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
        uid, gid = ids
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
            errors="replace",
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


def number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def read_result(path: str) -> Result | None:
    """The client's result: the last line of its output file, a JSON object; None when there is
    none. The file is in the service user's directory: a link is not followed and only a regular
    file is read (a FIFO would hold root here)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        lines = [x for x in fh.read(RESULT_MAX).decode("utf-8", "replace").splitlines() if x]
    try:
        read = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return cast(Result, read) if isinstance(read, dict) else None


def service_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise Refused(f"the service user {user!r} does not exist on this host") from None
    return entry.pw_uid, entry.pw_gid
