"""What the throughput step does, decided in the plan (docs/how-to/read-throughput-and-verdicts.md
"Throughput").

- whether it runs: `throughput_check` off never, always every run, after_change (default) when
  this run (re)started a rank or the router (the serve plan's roll and router restart), or when
  the last check did not pass (failed, or cut off: the host's layout.THROUGHPUT_PENDING, which
  programs/throughput.py removes only when a check passes);
- with what: the serving engine's interpreter and its benchmark client, the module and the file
  the knowledge base names for the release (knowledge/bench/, read from the wheel: kb/
  bench_client.py); a release whose client lacks a flag the check passes or a field it reads is
  refused before any change;
- against what: through the router when this host runs it (one run, concurrency and prompts
  per rank times the ranks), else each rank on its own; every rank's counters are read
  (programs/throughput.py);
- what the record says of the run: release, engine, model digest, the ranks' flag digest, and
  the workload (the settings, the model digest, the ranks and the way), which decides which
  earlier record it is compared with (programs/throughput_guard.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from operations import layout
from operations.kb.bench_client import load_bench_client
from operations.kb.throughput import ceilings, load_throughput
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.resolver.types import Rank
from operations.plan.vocabulary import Decision, ThroughputJson
from operations.programs.throughput_guard import Ceilings, Meta, Workload
from operations.render.host_scripts import script_text
from operations.settings import Settings

# What programs/throughput.py passes the client and reads of its --output-file line (each
# found, with its line, in knowledge/bench/sglang-<v>.json by scripts/gen_bench_client.py).
CLIENT_FLAGS = (
    "--backend",
    "--base-url",
    "--model",
    "--tokenizer",
    "--dataset-name",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--num-prompts",
    "--max-concurrency",
    "--output-file",
    "--disable-tqdm",
    "--seed",
    "--extra-request-body",
)
RESULT_FIELDS = (
    "duration",
    "completed",
    "output_throughput",
    "total_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
)


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


def workload(s: Settings, model_key: str | None, ranks: int, through: str) -> Workload:
    """The settings of a run and what it runs on: records with equal workloads are compared."""
    return {
        "input_len": s.throughput_input_len,
        "output_len": s.throughput_output_len,
        "concurrency_per_rank": s.throughput_concurrency_per_rank,
        "prompts_per_rank": s.throughput_prompts_per_rank,
        "model": s.model_name,
        "model_digest": model_key,
        "ranks": ranks,
        "through": through,
    }


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
) -> ThroughputPlan:
    """The step's decision for this host (see the docstring). `changed`: this run (re)starts a
    rank or the router; `router_here`: the router runs on this host; `pending`: the last check
    on this host did not pass."""
    if s.throughput_check == "off" or not ranks:
        return ThroughputPlan(skip="throughput_check: off" if ranks else "no rank")
    client = load_bench_client(s.sglang_version)
    if client is None:
        return ThroughputPlan(
            errors=[
                f"throughput_check: sglang {s.sglang_version} has no benchmark client in the "
                "knowledge base (knowledge/bench/): run scripts/gen_bench_client.py "
                f"{s.sglang_version} on the controller, or set throughput_check: off"
            ]
        )
    missing = client.missing(CLIENT_FLAGS, RESULT_FIELDS)
    if missing:
        return ThroughputPlan(
            errors=[
                f"throughput_check: sglang {s.sglang_version}'s {client.module} lacks "
                f"{', '.join(missing)} (knowledge/bench/sglang-{s.sglang_version}.json); set "
                "throughput_check: off on the controller"
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
    router = layout.router_server_url(s) if router_here else None
    targets = (
        [f"router={router}"]
        if router
        else [f"{r.unit_name}={layout.rank_server_url(s, r.rank)}" for r in ranks]
    )
    through = "router" if router else "ranks"
    meta: Meta = {
        "release": s.sglang_version,
        "engine": first.engine_env,
        "model_digest": model_key,
        "flags_digest": flags_digest(ranks),
        "workload": workload(s, model_key, len(ranks), through),
    }
    # The host's python3 runs the program (stdlib only); the engine's runs the client.
    argv = ["python3", layout.THROUGHPUT_SCRIPT]
    argv += ["--python", layout.env_python(first.engine_env)]
    argv += ["--module", client.module, "--module-file", client.file]
    argv += ["--model", s.model_name, "--tokenizer", first.model_path]
    for target in targets:
        argv += ["--target", target]
    for r in ranks:
        argv += ["--rank", f"{r.unit_name}={layout.rank_server_url(s, r.rank)}"]
    argv += ["--input-len", str(s.throughput_input_len)]
    argv += ["--output-len", str(s.throughput_output_len)]
    argv += ["--concurrency-per-rank", str(s.throughput_concurrency_per_rank)]
    argv += ["--prompts-per-rank", str(s.throughput_prompts_per_rank)]
    argv += ["--timeout", str(s.throughput_timeout_s)]
    argv += ["--key-file", layout.SECRETS_FILE, "--service-user", s.service_user]
    argv += ["--records", layout.THROUGHPUT_RECORDS, "--pending", layout.THROUGHPUT_PENDING]
    argv += ["--meta", json.dumps(meta, sort_keys=True)]
    argv += ["--max-slowdown", str(s.throughput_max_slowdown), "--guard", s.throughput_guard]
    if card is not None:
        argv += ["--ceilings", json.dumps(card, sort_keys=True)]
    guard = "fails" if s.throughput_guard == "fail" else "warns"
    what = (
        f"{client.module} {'through the router' if router else 'per rank'}: "
        f"{s.throughput_input_len}/{s.throughput_output_len} tokens in/out, "
        f"{s.throughput_concurrency_per_rank} at once, {s.throughput_prompts_per_rank} a rank "
        f"x {len(ranks)}; {guard} past {s.throughput_max_slowdown:.0%} slower"
    )
    again = (
        "; again: the last check on this host did not pass (failed or cut off)"
        if pending and not changed and s.throughput_check == "after_change"
        else ""
    )
    why = (
        f"throughput_check {s.throughput_check}{again}; the release's client and flags from "
        f"its wheel (knowledge/bench/sglang-{s.sglang_version}.json)"
    )
    return ThroughputPlan(
        files=[script],
        run=ThroughputRun(argv, through),
        serving_changes=changed,
        decision=Decision("throughput check", what, why),
    )
