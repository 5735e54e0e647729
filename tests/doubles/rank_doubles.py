"""Ranks and a router for the canary comparison (operations/programs/canary_compare.py) to talk
to, on this machine: the SGLang server double of a release (its launch_server and benchmark
client, from tests/doubles/wheels.py's wheel) in a virtualenv, and the router's /metrics page
(smg's per-worker outcomes). tests/unit/test_canary_compare.py runs the program against them;
scripts/capture_canary_records.py runs it the same way to make the CanaryState fact's fixtures.

    env = engine_env(tmp / "engine")            # bin/python imports the sglang double
    with RankDoubles(env, tmp / "model", KEY) as ranks:
        base, canary = ranks.start("40"), ranks.start("10")   # each its server root
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from types import ModuleType, TracebackType

from tests.doubles import wheels

DOUBLES = Path(__file__).resolve().parent / "packages"


def scheduler_module(name: str = "generate_double") -> ModuleType:
    """The SGLang double's scheduler module alone (sglang/_generate_double.py, stdlib only: the
    package's __init__ needs a built wheel), to read its step time and levers in-process."""
    path = DOUBLES / "sglang" / "_generate_double.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def engine_env(out: Path, release: str = "0.5.11") -> Path:
    """A virtualenv (no pip) whose site-packages hold the sglang double of `release`."""
    out.mkdir(parents=True, exist_ok=True)
    env = out / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = (env / "lib").glob("python3*/site-packages")
    with zipfile.ZipFile(wheels.sglang_wheel(out / "wheels", release)) as zf:
        zf.extractall(site)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RankDoubles:
    """Server doubles serving `model` as "m" behind `key`; each stopped by its PID on exit."""

    def __init__(self, env: Path, model: Path, key: str) -> None:
        self.env, self.model, self.key = env, model, key
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, rate: str = "40", reply: str = "", **knobs: str) -> str:
        """A rank decoding `rate` tokens/s for one request alone (SGLANG_DOUBLE_TOKENS_PER_S),
        5% a step more for each more in its batch, 16 at once at most (the scheduler's knobs,
        sglang/_generate_double.py; `knobs` sets others by their variable's name), answering
        `reply` (SGLANG_DOUBLE_REPLY) once it says it is ready: its server root."""
        self.model.mkdir(parents=True, exist_ok=True)
        (self.model / "tokenizer.json").write_text("{}")
        port = free_port()
        env = {
            "PATH": os.environ["PATH"],
            "CUDA_VISIBLE_DEVICES": str(len(self.procs)),
            "SGLANG_DOUBLE_LOAD_SECONDS": "0",
            "SGLANG_DOUBLE_TOKENS_PER_S": rate,
            "SGLANG_DOUBLE_BATCH_COST": "0.05",
            "SGLANG_DOUBLE_MAX_RUNNING": "16",
            "SGLANG_DOUBLE_REPLY": reply,
            **knobs,
        }
        words = [str(self.env / "bin" / "python"), "-m", "sglang.launch_server"]
        words += ["--model-path", str(self.model), "--served-model-name", "m"]
        words += ["--host", "127.0.0.1", "--port", str(port), "--enable-metrics"]
        words += ["--api-key", self.key]
        proc = subprocess.Popen(words, env=env, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:  # the double prints this line once it is ready
            if "ready: serving" in line:
                break
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> RankDoubles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Every double started, stopped by its PID (they may be started again)."""
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=30)
        self.procs = []


def page(counts: dict[str, tuple[int, int]]) -> str:
    """A router /metrics page: each worker's (failures, successes) as smg 1.13 labels them
    (tests/fixtures/smg/metrics-1.13.0.json: smg_worker_cb_outcomes_total{outcome, worker})."""
    lines = ["# TYPE smg_worker_cb_outcomes_total counter"]
    for worker, (bad, good) in counts.items():
        lines.append(f'smg_worker_cb_outcomes_total{{outcome="failure",worker="{worker}"}} {bad}')
        lines.append(f'smg_worker_cb_outcomes_total{{outcome="success",worker="{worker}"}} {good}')
    return "\n".join(lines) + "\n"


class RouterPage:
    """The router's /metrics (smg's per-worker outcomes), served here; each read counts 10
    more successes for every worker, and `failing` workers one failure more too."""

    def __init__(self, workers: list[str], failing: list[str]) -> None:
        self.reads = 0
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                me.reads += 1
                n = me.reads
                counts = {w: (n if w in failing else 0, 10 * n) for w in workers}
                body = page(counts).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        serve = functools.partial(self.server.serve_forever, poll_interval=0.05)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
