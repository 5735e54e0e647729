"""What the throughput step does, decided in the plan (docs/how-to/read-throughput-and-verdicts.md
"Throughput").

- whether it runs: `throughput_check` off never, always every run, after_change (default) when
  this run (re)started a rank or the router (the serve plan's roll and router restart), or when
  the last check did not pass (failed, or cut off: the host's layout.THROUGHPUT_PENDING, which
  programs/throughput.py removes only when a check passes);
- with what: the toolkit's own load client (programs/load_client.py, inside the check's script:
  one ruler for every release, nothing of the engine's), against every rank at once, each
  rank's capacity read from its own counters (programs/throughput.py);
- the load's shape (`load_flags`, the one place it is written, for the check and the canary
  alike): the lengths, where the search for the concurrency starts and the most it goes to
  (or a fixed concurrency), the rounds and their window, the time budget;
- what the record says of the run: release, engine, model digest, the ranks' flag digest and
  their server arguments (readable), the GPU and driver, the router, and the workload (lengths,
  model, its digest, the ranks), which with the hardware and the client decides which earlier
  records it is compared with (programs/throughput_guard.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from operations import layout
from operations.kb.throughput import ceilings, load_throughput
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.resolver.types import Rank
from operations.plan.vocabulary import Decision, ThroughputJson
from operations.programs.throughput_guard import Ceilings, Meta, Workload
from operations.render.host_scripts import script_text
from operations.settings import Settings

# Where the search for the concurrency starts when no earlier record says (load_client.py
# doubles it until the rank queues work).
START_CONCURRENCY = 8


# Why `python -m operations.bench` measures no host whose ranks or router this inventory would
# restart: it would measure what serves now and record it under the inventory's release, flags
# and model.
BENCH_REFUSAL = (
    "bench: this inventory would restart ranks or the router on this host (not yet deployed: "
    "`python -m operations.plan INVENTORY` shows what); deploy it first (pyinfra INVENTORY "
    "deploy.py), then measure; nothing was measured"
)


@dataclass(frozen=True)
class ThroughputRun:
    """One run of programs/throughput.py: its whole command line but the key (read from the
    secrets file on the host)."""

    argv: list[str]
    through: str  # "router" or "ranks"


@dataclass(frozen=True)
class ThroughputPlan:
    files: list[PlannedFile] = field(default_factory=list)
    run: ThroughputRun | None = None
    # Why nothing runs (a line for host.noop).
    skip: str = ""
    errors: list[str] = field(default_factory=list)
    # This run (re)starts a rank or the router: the bench (operations/bench_deploy.py), which
    # runs this step alone, refuses such a host with BENCH_REFUSAL; the deploy measures after.
    serving_changes: bool = False
    # What `plan --why` says of it.
    decision: Decision | None = None

    def to_json(self) -> ThroughputJson:
        return {
            "run": None
            if self.run is None
            else {"argv": self.run.argv, "through": self.run.through},
            "skip": self.skip,
            "errors": self.errors,
        }


def workload(s: Settings, model_key: str | None, ranks: int) -> Workload:
    """The shape of a check and what it runs on: records with equal workloads (and hardware
    and client) are compared."""
    return {
        "input_len": s.throughput_input_len,
        "output_len": s.throughput_output_len,
        "model": s.model_name,
        "model_digest": model_key,
        "ranks": ranks,
    }


def load_flags(s: Settings, timeout_s: int | None = None) -> list[str]:
    """The load's shape on a program's command line (programs/load_runner.add_load_flags): the
    check's and the canary's, written here only."""
    fixed = s.throughput_concurrency_per_rank
    words = ["--input-len", str(s.throughput_input_len)]
    words += ["--output-len", str(s.throughput_output_len)]
    words += ["--start", str(fixed or START_CONCURRENCY)]
    words += ["--most", str(fixed or s.throughput_max_concurrency_per_rank)]
    words += ["--ramp-timeout", str(s.throughput_ramp_timeout_s)]
    words += ["--rounds", str(s.throughput_rounds), "--window", str(s.throughput_window_s)]
    words += ["--timeout", str(timeout_s or s.throughput_timeout_s), "--model", s.model_name]
    return words + (["--fixed"] if fixed else [])


def load_shape(s: Settings) -> str:
    """The load in words, for `plan --why` and the docs' samples."""
    fixed = s.throughput_concurrency_per_rank
    held = f"{fixed} in flight (fixed)" if fixed else "in flight doubled until it queues"
    return (
        f"{s.throughput_input_len}/{s.throughput_output_len} tokens in/out, {held}, "
        f"{s.throughput_rounds} x {s.throughput_window_s:g} s"
    )


def server_args(rank: Rank) -> list[str]:
    """A rank's server arguments, readable, one option with its value each, without what
    differs between ranks (its port) or names a secret's file: what a record compares."""
    words = (
        rank.argv[rank.argv.index("sglang.launch_server") + 1 :]
        if ("sglang.launch_server" in rank.argv)
        else list(rank.argv)
    )
    options: list[str] = []
    for word in words:
        if word.startswith("--") or not options:
            options.append(word)
        else:
            options[-1] += f" {word}"
    return [o for o in options if o.split()[0] not in ("--port", "--config", "--base-gpu-id")]


def card_ceilings(
    gpu_name: str | None, model_bytes: int | None, quantization: str | None
) -> Ceilings | None:
    """The card's ceilings for this model (kb/throughput.py ceilings, knowledge/throughput.yaml);
    None for a card the knowledge base does not list or a model of unknown size. The parameter
    count is the weights' bytes over bytes per parameter (1 for an FP8 checkpoint, else 2 for
    bf16): what the issue's "54 GB of bf16 weights, ~54 GFLOP a token" reads."""
    if not gpu_name or not model_bytes:
        return None
    gpu = load_throughput().gpu_named(gpu_name)
    if gpu is None:
        return None
    params = model_bytes / (1 if quantization == "fp8" else 2)
    single, full = ceilings(gpu, model_bytes, params)
    source = f"knowledge/throughput.yaml gpus.{gpu.key}"
    return {"one_stream_tok_s": single, "full_batch_tok_s": full, "source": source}


def flags_digest(ranks: Sequence[Rank]) -> str:
    """The ranks' command lines, digested (the record names which flags served the run)."""
    text = json.dumps([r.argv for r in ranks])
    return hashlib.sha256(text.encode()).hexdigest()


def throughput_plan(
    s: Settings,
    ranks: Sequence[Rank],
    changed: bool,
    router_here: bool,
    model_key: str | None,
    digests: Mapping[str, str],
    card: Ceilings | None = None,
    pending: bool = False,
    hardware: tuple[str | None, str | None] = (None, None),
) -> ThroughputPlan:
    """The step's decision for this host (see the docstring). `changed`: this run (re)starts a
    rank or the router; `router_here`: the router runs on this host; `pending`: the last check
    on this host did not pass; `hardware`: the GPU's name and the driver's version."""
    if s.throughput_check == "off" or not ranks:
        return ThroughputPlan(skip="throughput_check: off" if ranks else "no rank")
    if not s.enable_metrics:
        return ThroughputPlan(
            errors=[
                "throughput_check: the check reads each rank's own counters, and enable_metrics "
                "is false; set enable_metrics: true, or throughput_check: off, on the controller"
            ]
        )
    entry = layout.managed_file(s, layout.THROUGHPUT_SCRIPT)
    script = planned("Throughput | script", entry, script_text("throughput.py"), digests)
    if s.throughput_check == "after_change" and not changed and not pending:
        return ThroughputPlan(
            files=[script],
            skip="no rank or router (re)started in this run (throughput_check: after_change)",
        )
    first = ranks[0]
    router = f"{s.router.version} on {s.router.host}" if s.router is not None else None
    meta: Meta = {
        "release": s.sglang_version,
        "engine": first.engine_env,
        "model_digest": model_key,
        "flags_digest": flags_digest(ranks),
        "workload": workload(s, model_key, len(ranks)),
        "gpu": hardware[0],
        "driver": hardware[1],
        "router": router,
        "server_args": server_args(first),
    }
    # The host's python3 runs the program and its load client (stdlib only).
    argv = ["python3", layout.THROUGHPUT_SCRIPT]
    for r in ranks:
        argv += ["--rank", f"{r.unit_name}={layout.rank_server_url(s, r.rank)}"]
    argv += load_flags(s)
    argv += ["--key-file", layout.SECRETS_FILE, "--service-user", s.service_user]
    argv += ["--records", layout.THROUGHPUT_RECORDS, "--pending", layout.THROUGHPUT_PENDING]
    argv += ["--meta", json.dumps(meta, sort_keys=True)]
    argv += ["--max-slowdown", str(s.throughput_max_slowdown), "--guard", s.throughput_guard]
    if card is not None:
        argv += ["--ceilings", json.dumps(card, sort_keys=True)]
    guard = "fails" if s.throughput_guard == "fail" else "warns"
    what = (
        f"{len(ranks)} ranks' capacity: {load_shape(s)}; {guard} past "
        f"{s.throughput_max_slowdown:.0%} slower beyond the noise"
    )
    again = (
        "; again: the last check on this host did not pass (failed or cut off)"
        if pending and not changed and s.throughput_check == "after_change"
        else ""
    )
    why = (
        f"throughput_check {s.throughput_check}{again}; the toolkit's own load client, the "
        "same for every release (programs/load_client.py)"
    )
    return ThroughputPlan(
        files=[script],
        run=ThroughputRun(argv, "ranks"),
        serving_changes=changed,
        decision=Decision("throughput check", what, why),
    )
