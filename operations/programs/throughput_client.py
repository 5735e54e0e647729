"""The benchmark client's run, shared by the throughput check (programs/throughput.py) and the
canary's speed row (programs/canary_compare.py): what must be there before it runs (the
tokenizer, the engine's client module), its command line, its start as the service user with
the key in its environment only, stopped past a deadline, and its result file, read without
following a link. throughput.py's docstring (3.) says why each is so.

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
from typing import cast

from operations.programs.throughput_args import Refused
from operations.programs.tokenizer_files import TOKENIZER_FILES

WHO_GETS_THE_KEY = (
    "the key is sent only to the service user's listeners; docs/security.md "
    '"Who is sent the API key"'
)
# The most of a client's result file read (its last line is the result; a few MiB at most).
RESULT_MAX = 64 * 2**20
# The fix a refusal offers besides mending the host: the check's setting off.
OFF = "set throughput_check: off"


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
