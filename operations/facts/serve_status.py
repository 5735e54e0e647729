"""What serves now and how it answers: the status command's one fact, one round trip per host.

The deploy's reading of the rank units (operations/facts/serve.py), and, probed on the host
itself, each /health answer, each rank's running and queued requests from its /metrics
(operations/programs/serving_probe.py), the GPUs' memory use from nvidia-smi, and behind a
router its own view of each worker (programs/router_list.py, with the control-plane key read on
the host, as the deploy's fact reads it); for `status`, the last throughput records, the canary's
verdict (facts/canary.py) and the last tune (facts/tune.py).
"""

from __future__ import annotations

import dataclasses
import json

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout
from operations.facts.canary import canary_words
from operations.facts.serve import (
    GpuUsage,
    RankLoad,
    RankStart,
    Serving,
    Words,
    parse_serving,
    router_list_words,
    serving_words,
)
from operations.facts.throughput import RECORDS_READ
from operations.facts.tune import tune_words
from operations.render import host_scripts

ROUTER_KEY = "router"  # the router's key among the ranks' in health_urls and Serving.health
PROBE_SCRIPT = "serving_probe.py"
GPU_QUERY = "index,name,memory.used,memory.total"
GPU_TIMEOUT_S = 10  # a wedged driver must not hang the status
# The first word of each line the probes print (the rest is parse_serving's).
_PROBE_WORDS = frozenset(
    {
        "health",
        "health_unavailable",
        "metrics",
        "phases",
        "gpu",
        "gpu_rc",
        "throughput",
        "canary",
        "tune",
    }
)


def probe_words(
    health_urls: dict[str, str] | None,
    metrics_urls: dict[str, str] | None,
    timeout_s: float,
    start_units: dict[str, str] | None = None,
    phases: str = "",
) -> Words:
    """The probe of each /health and /metrics URL and, given the release's start-up regexes
    (`phases`, plan/startup.py startup_patterns), of each unit's last start
    (programs/serving_probe.py)."""
    if not health_urls:
        return []
    probes: Words = [QuoteString(f"{k}={url}") for k, url in sorted(health_urls.items())]
    if metrics_urls:
        probes.append("--metrics")
        probes += [QuoteString(f"{k}={url}") for k, url in sorted(metrics_urls.items())]
    if start_units and phases:
        probes += ["--phases", QuoteString(phases)]
        probes += [QuoteString(f"{k}={unit}") for k, unit in sorted(start_units.items())]
    return [
        "if command -v python3 >/dev/null 2>&1; then python3 -c",
        QuoteString(host_scripts.script_text(PROBE_SCRIPT)),
        str(timeout_s),
        *probes,
        '; else echo "health_unavailable python3 not found on the host"; fi;',
    ]


def gpu_words(gpus: bool) -> Words:
    """nvidia-smi's memory use ("gpu CSV" lines), then its exit status ("gpu_rc N")."""
    if not gpus:
        return []
    return [
        f"out=$(timeout {GPU_TIMEOUT_S} nvidia-smi --query-gpu={GPU_QUERY}",
        '--format=csv,noheader,nounits 2>&1); rc=$?; [ -n "$out" ] &&',
        "printf '%s\\n' \"$out\" | sed 's/^/gpu /'; echo \"gpu_rc $rc\";",
    ]


def _load(answer: str) -> RankLoad:
    if answer.startswith("!"):
        why = answer[1:].strip()
        return RankLoad(error=f"http {why}" if why.isdigit() else why.replace("error:", "error "))
    cells = answer.split()
    values: list[float | None] = []
    for cell in [*cells, "-", "-"][:2]:
        try:
            values.append(None if cell == "-" else float(cell))
        except ValueError:
            values.append(None)
    return RankLoad(values[0], values[1])


def parse_start(answer: str) -> RankStart:
    """One rank's "phases" answer: StartupPhases as JSON, or "! error:WHAT"."""
    if answer.startswith("!"):
        return RankStart(error=answer[1:].strip().replace("error:", "error "))
    try:
        raw = json.loads(answer)
    except ValueError:
        return RankStart(error=f"unreadable start-up phases: {answer[:80]!r}")
    if not isinstance(raw, dict):
        return RankStart(error=f"unreadable start-up phases: {answer[:80]!r}")

    def num(key: str) -> float | None:
        value = raw.get(key)
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

    graphs, last = raw.get("graphs"), raw.get("last_phase")
    return RankStart(
        healthy_s=num("healthy_s"),
        weights_s=num("weights_s"),
        graphs_s=num("graphs_s"),
        warmup_s=num("warmup_s"),
        autotune_s=num("autotune_s"),
        last_at=num("last_at"),
        graphs=graphs if isinstance(graphs, int) and not isinstance(graphs, bool) else 0,
        last_phase=last if isinstance(last, str) else None,
    )


def _gpu(line: str) -> GpuUsage | None:
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 4 or not cells[0].isdigit():
        return None
    index, name, used, total = cells
    return GpuUsage(
        index=int(index),
        name=name,
        memory_used_mib=int(used) if used.isdigit() else 0,
        memory_total_mib=int(total) if total.isdigit() else 0,
    )


def throughput_words(read: bool) -> Words:
    """The host's last throughput records ("throughput JSON" lines: layout.THROUGHPUT_RECORDS)."""
    if not read:
        return []
    return [
        f"tail -n {RECORDS_READ} {layout.THROUGHPUT_RECORDS} 2>/dev/null |",
        "sed 's/^/throughput /';",
    ]


def status_canary_words(read: bool) -> Words:
    """The canary's verdict and unit backups (facts/canary.py CanaryState's script, in a
    subshell so its variables stay its own), each line prefixed "canary "."""
    if not read:
        return []
    return ["(", StringCommand(*canary_words(), _separator=""), ") | sed 's/^/canary /';"]


def status_tune_words(read: bool) -> Words:
    """The last tune's records and its state (facts/tune.py TuneRecords' script, in a subshell
    as the canary's), each line prefixed "tune "."""
    if not read:
        return []
    return ["(", StringCommand(*tune_words(), _separator=""), ") | sed 's/^/tune /';"]


def _gpus(rc: str | None, lines: list[str]) -> tuple[list[GpuUsage], str | None]:
    if rc is None:
        return [], None
    if rc == "127":
        return [], "nvidia-smi not found"
    if rc == "124":
        return [], f"nvidia-smi did not answer within {GPU_TIMEOUT_S}s"
    if rc != "0":
        return [], " ".join(lines) or f"nvidia-smi exit status {rc or '?'}"
    gpus = []
    for line in lines:
        gpu = _gpu(line)
        if gpu is None:
            return [], f"unexpected nvidia-smi output: {line!r}"
        gpus.append(gpu)
    return gpus, None


def parse_status(lines: list[str]) -> Serving:
    """parse_serving's reading, with the probes' lines read into health, load and gpus."""
    health: dict[str, str] = {}
    load: dict[str, RankLoad] = {}
    starts: dict[str, RankStart] = {}
    gpu_lines: list[str] = []
    throughput_lines: list[str] = []
    canary_lines: list[str] = []
    tune_lines: list[str] = []
    values: dict[str, str] = {}
    rest_lines: list[str] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word not in _PROBE_WORDS:
            rest_lines.append(line)
        elif word == "health":
            probe, _, answer = rest.strip().partition(" ")
            health[probe] = answer.strip()
        elif word == "metrics":
            probe, _, answer = rest.strip().partition(" ")
            load[probe] = _load(answer.strip())
        elif word == "phases":
            probe, _, answer = rest.strip().partition(" ")
            starts[probe] = parse_start(answer.strip())
        elif word == "gpu":
            gpu_lines.append(rest.strip())
        elif word == "throughput":
            throughput_lines.append(rest.strip())
        elif word == "canary":
            canary_lines.append(rest.strip())
        elif word == "tune":
            tune_lines.append(rest)
        else:
            values[word] = rest.strip()
    gpus, gpu_error = _gpus(values.get("gpu_rc"), gpu_lines)
    return dataclasses.replace(
        parse_serving(rest_lines),
        health=health,
        health_error=values.get("health_unavailable") or None,
        load=load,
        starts=starts,
        gpus=gpus,
        gpu_error=gpu_error,
        throughput_lines=throughput_lines,
        canary_lines=canary_lines,
        tune_lines=tune_lines,
    )


class ServingStatus(FactBase[Serving]):
    """
    Returns what the ServingState fact returns (operations/facts/serve.py) and, probed from
    the host, each /health answer, each rank's running and queued requests, and nvidia-smi's
    memory use. One round trip whatever the number of ranks.

    .. code:: python

        Serving(now=1767225600, ranks={0: UnitState(...)}, ...,
                health={"0": "200"}, health_error=None, load={"0": RankLoad(2.0, 0.0)},
                gpus=[GpuUsage(0, "NVIDIA H200", 81000, 143771)], gpu_error=None)

    + engine_root, model_link, ranks, router: as ServingState's
    + health_urls: rank number (or "router") -> its /health URL, as the host reaches it
    + metrics_urls: rank number -> its /metrics URL, read in the same script (running, queued)
    + gpus: whether to ask nvidia-smi for memory use
    + router_list: the router's worker list URL as this host reaches it (a GET with the
      control-plane key, programs/router_list.py): each worker's state as the router sees it
      (`Serving.router_states`, `router_stalled`); None: no router
    + timeout_s: each probe's timeout
    + start_units, phases: rank number -> its unit, and the release's start-up regexes as JSON
      (plan/startup.py startup_patterns): each rank's last start read from its journal
      (`Serving.starts`); "" or None: not read
    + throughput: whether to read the last throughput records (`Serving.throughput_lines`)
    + canary: whether to read the canary's verdict and backups (`Serving.canary_lines`,
      facts/canary.py parse_canary)
    + tune: whether to read the last tune's records and state (`Serving.tune_lines`,
      facts/tune.py parse_tune)
    """

    def command(
        self,
        engine_root: str,
        model_link: str,
        ranks: list[int] | None = None,
        router: bool = True,
        health_urls: dict[str, str] | None = None,
        metrics_urls: dict[str, str] | None = None,
        gpus: bool = False,
        router_list: str | None = None,
        timeout_s: float = 2.0,
        start_units: dict[str, str] | None = None,
        phases: str = "",
        throughput: bool = False,
        canary: bool = False,
        tune: bool = False,
    ) -> StringCommand:
        return StringCommand(
            *serving_words(engine_root, model_link, ranks=ranks, router=router),
            *probe_words(health_urls, metrics_urls, timeout_s, start_units, phases),
            *router_list_words(router_list, timeout_s),
            *gpu_words(gpus),
            *throughput_words(throughput),
            *status_canary_words(canary),
            *status_tune_words(tune),
            "true",
        )

    @staticmethod
    def default() -> Serving:
        return Serving()

    def process(self, output: list[str]) -> Serving:
        return parse_status(output)
