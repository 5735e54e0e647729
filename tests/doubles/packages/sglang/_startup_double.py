"""TEST DOUBLE of a rank's start: the phases SGLang logs, and what FlashInfer's JIT and Triton's
autotuner do to their caches, with the costs a test can see. Standard library only.

- Phase lines in the release's own words (sglang/_startup_lines.json, embedded from the knowledge
  base's start-up file at wheel-build time: tests/doubles/startup_lines.py), each timed line
  carrying the phase's own seconds, in SGLang's log prefix `[DATE TIME TP0] `.
- FlashInfer's JIT, per module: its workspace is $FLASHINFER_WORKSPACE_BASE (else the home
  directory) /.cache/flashinfer/<FlashInfer version>/<arch>/cached_ops (flashinfer jit/env.py
  :51-55, 130-145 at v0.6.7.post2); each module is built and loaded under its own file lock
  cached_ops/tmp/<name>.lock (jit/core.py:309-318; PRs #539, #1467): the first rank builds,
  the others wait on the lock and then find it built. A build costs SGLANG_DOUBLE_JIT_SECONDS
  (default 0.5; 28-31 s each on real GPUs, flashinfer#1038) and prints
  `[double] flashinfer jit: built NAME`. A module the installed flashinfer-jit-cache holds is
  loaded from it instead, never built: its path is FLASHINFER_AOT_DIR/<name>/<name>.so
  (flashinfer jit/core.py:256-261 at v0.6.12; build_and_load() loads it, :307-309), and the AOT
  directory is the jit-cache's own once its version starts with FlashInfer's (jit/env.py:100-132,
  the flashinfer double's FLASHINFER_AOT_DIR); it prints `[double] flashinfer jit: loaded NAME
  from DIR`.
- Triton's autotuner: with TRITON_CACHE_AUTOTUNING=1 (Triton >= 3.4) the timings are read from
  $TRITON_CACHE_DIR (else ~/.triton/cache) /<key>/<fn>.autotune.json if there (triton 3.6.0
  triton/runtime/autotuner.py:170-200), else benchmarked and written through a temporary directory
  and os.replace, without a lock (triton/runtime/cache.py:100-121); without the variable it
  benchmarks on every start. A benchmark costs SGLANG_DOUBLE_TUNE_SECONDS (default 0.3) and prints
  `[double] triton autotune: tuned NAME`.
The sleeps are the double's simulated work, not synchronisation.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from importlib import resources

JIT_SECONDS_ENV = "SGLANG_DOUBLE_JIT_SECONDS"
TUNE_SECONDS_ENV = "SGLANG_DOUBLE_TUNE_SECONDS"
# What a Qwen3.5/3.6 hybrid rank JITs on sm_120 (FlashInfer attention) and autotunes (the Gated
# DeltaNet layers' Triton kernels, fla/*.py): names for the double's lines.
MODULES = ("batch_prefill_with_kv_cache", "batch_decode_with_kv_cache")
TUNED = ("chunk_gated_delta_rule_fwd_kernel_h", "fused_recurrent_gated_delta_rule_fwd_kernel")
ARCH = "120a"


def _lines() -> dict[str, str]:
    text = resources.files("sglang").joinpath("_startup_lines.json").read_text()
    found: dict[str, str] = json.loads(text)
    return found


def log(phase: str, seconds: float | None = None) -> None:
    line = _lines().get(phase)
    if line is None:
        return
    if seconds is not None:
        line = line.replace("{seconds}", f"{seconds:.2f}")
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP0] {line}", flush=True)


def _home() -> str:
    return os.environ.get("HOME") or os.path.expanduser("~")


def _flashinfer() -> tuple[str, str | None]:
    """FlashInfer's version and its AOT directory (None: no flashinfer). A jit-cache of another
    version makes the import raise, as the real one's does."""
    try:
        import flashinfer
    except ImportError:
        return "0", None
    return str(flashinfer.__version__), str(flashinfer.FLASHINFER_AOT_DIR)


def jit(seconds: float) -> None:
    version, aot = _flashinfer()
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or _home()
    ops = os.path.join(base, ".cache", "flashinfer", version, ARCH, "cached_ops")
    os.makedirs(os.path.join(ops, "tmp"), exist_ok=True)
    for name in MODULES:
        prebuilt = os.path.join(aot, name, f"{name}.so") if aot else ""
        if prebuilt and os.path.exists(prebuilt):  # the jit-cache's: loaded, not built
            print(f"[double] flashinfer jit: loaded {name} from {aot}", flush=True)
            continue
        with open(os.path.join(ops, "tmp", f"{name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            built = os.path.join(ops, name, f"{name}.so")
            if not os.path.exists(built):
                time.sleep(seconds)  # the double's compile
                os.makedirs(os.path.dirname(built), exist_ok=True)
                with open(built + ".partial", "w") as fh:
                    fh.write(f"double module {name}\n")
                os.replace(built + ".partial", built)
                print(f"[double] flashinfer jit: built {name} in {ops}", flush=True)


def autotune(seconds: float) -> None:
    cached = os.environ.get("TRITON_CACHE_AUTOTUNING") == "1"
    root = os.environ.get("TRITON_CACHE_DIR") or os.path.join(_home(), ".triton", "cache")
    for name in TUNED:
        key = hashlib.sha256(f"{name}-sm_120".encode()).hexdigest()
        path = os.path.join(root, key, f"{name}.autotune.json")
        if cached and os.path.exists(path):
            continue
        time.sleep(seconds)  # the double's benchmark of every configuration
        print(f"[double] triton autotune: tuned {name}", flush=True)
        if cached:
            temp = os.path.join(root, key, f"tmp.pid_{os.getpid()}")
            os.makedirs(temp, exist_ok=True)
            with open(os.path.join(temp, f"{name}.autotune.json"), "w") as fh:
                json.dump({"configs_timings": [[{"BLOCK": 64}, 1.0]]}, fh)
            os.replace(os.path.join(temp, f"{name}.autotune.json"), path)
            os.removedirs(temp)


def start_up(load_seconds: float, ready: threading.Event) -> None:
    """The phases in SGLang's order: parallel init, weights, JIT and graph capture (autotune
    runs within it), warm-up, then the ready line; `ready` set when /health may answer 200."""
    jit_s = float(os.environ.get(JIT_SECONDS_ENV, "0.5") or 0)
    tune_s = float(os.environ.get(TUNE_SECONDS_ENV, "0.3") or 0)
    log("parallel_init_end", 0.01)
    log("weight_load_begin")
    tic = time.monotonic()
    time.sleep(load_seconds * 0.4)  # the double's weight load
    log("weight_load_end", time.monotonic() - tic)
    log("graph_capture_begin")
    tic = time.monotonic()
    jit(jit_s)
    autotune(tune_s)
    time.sleep(load_seconds * 0.4)  # the double's capture
    log("graph_capture_end", time.monotonic() - tic)
    time.sleep(load_seconds * 0.2)  # the double's warm-up request
    ready.set()
    log("ready")
