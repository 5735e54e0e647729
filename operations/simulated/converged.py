"""The simulated CT200 on day 2: a host the deploy already converged (`make demo-day2`,
inventory/demo_day2.py). Eight ranks serve the repository's release (group_data/all.py: 0.5.11
on cu128) from the staged copy of the model, behind the unit files, scripts and configuration
the plan writes; a plain `--dry` shows no change, and `--dry --data sglang_version=0.5.19`
shows the roll onto another release.

The answers are computed from the plan's own files, never written by hand: `image` decides
the plan for the bare CT200 (ct200.py's answers, read by the facts' own parsers) with the
settings given, and the converged host holds exactly what that plan writes: each rank unit
the plan renders (its text, and the sha256 of that text in the ServingState answer), every
other file by the sha256 of the content the plan gives it, the engine environment the plan
names (complete, `current`), the staged copy under the key the plan computes. So the answers
stay right when the plan changes: a new line in a unit template changes the unit the plan
renders and the digest this host answers alike.

`serving_lines` and `staging_lines` compose the answers in the facts' own line formats
(operations/facts/serve.py `parse_serving`, operations/facts/model.py `parse_staging`); the
test double of a host that remembers what a deploy wrote (tests/unit/simulated_host.py)
composes its answers with them too.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from operations import kb as kbmod
from operations import layout
from operations.facts.model import Staging, parse_staging
from operations.facts.preflight import SECTION, parse_host_facts
from operations.facts.serve import Serving
from operations.plan import host_plan
from operations.plan.host_plan import Gathered, HostReport
from operations.plan.planned_files import PlannedFile, sha256
from operations.settings import Layer, Settings, load
from operations.simulated import ct200, group_data

# The simulated clock: the ranks started ten minutes before "now".
NOW = 1796066650
STARTED = NOW - 600
# The controller's date on the run that converged the host (the toolkit record's).
TODAY = datetime.fromtimestamp(STARTED, UTC).date().isoformat()
# Pieces of the facts' own commands that pick their answer (the @fake connector's matchers).
SERVING_SIGNATURE = f"for u in {layout.RANK_UNIT_GLOB}"
STAGING_SIGNATURE = "Stage a model directory into a tmpfs"
STATUS_SIGNATURE = "health_unavailable"
HOST = "@fake/ct200"


@dataclass(frozen=True)
class Engine:
    """The engine environment the rank units run: its name, what its marker records, the uv
    and the compilers the engine step installed."""

    name: str
    release: str
    lane: str
    uv: str
    toolkits: tuple[str, ...]
    # The owner of its compile caches: the service user (the engine step makes them with it).
    cache_owner: str
    # What the engine check recorded when it passed on the host's GPUs (layout.ENGINE_PROVEN,
    # facts/engine.py's Proven), in the file's own JSON.
    proven: str = ""


@dataclass(frozen=True)
class StagedCopy:
    """The staged copy of the model: the source's digest, size and file count (the same
    copy is staged: nothing to copy), under `models` (STAGE_DIR/models)."""

    digest: str
    bytes: int
    files: int
    models: str
    hub_revision: str | None = None


@dataclass
class Image:
    """What a converged host holds: rank units by name (their text), every other managed
    file by path (its sha256), the engine, the staged copy and its key, and the ranks the
    router lists (behind a router)."""

    units: dict[str, str]
    files: dict[str, str]
    engine: Engine
    slug: str
    key: str
    staging: StagedCopy
    listed: list[str] = field(default_factory=list)
    # The toolkit record's text (layout.TOOLKIT_RECORD); None: the host has none.
    record: str | None = None


def serving_lines(
    image: Image, asked: Sequence[str], router_list: bool = False, router_unit: bool = True
) -> list[str]:
    """The ServingState fact's output on the imaged host: each rank unit loaded and running
    since STARTED, the files of `asked` (the paths the fact's command checksums) that the
    host has, the engine's environment complete and `current`, the staged model link, the
    stage unit enabled; `router_list`: the fact asked for the router's worker list;
    `router_unit`: it asked for the router unit's state."""
    lines = [f"now {NOW}"]
    for name, text in sorted(image.units.items()):
        lines.append(f"unit {sha256(text)}  {name}")
    for name, text in sorted(image.units.items()):
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                lines.append(f"exec {name} {line.removeprefix('ExecStart=')}")
    shown = sorted(image.units)
    if router_unit and layout.unit_path(layout.ROUTER_UNIT) in image.files:
        shown.append(layout.ROUTER_UNIT)
    for pid, name in enumerate(shown, 4000):
        rank = layout.rank_of(name)
        env = f"CUDA_VISIBLE_DEVICES={rank}" if rank is not None else ""
        lines += [
            f"Id={name}",
            "LoadState=loaded",
            "ActiveState=active",
            "SubState=running",
            f"MainPID={pid}",
            "NRestarts=0",
            f"ExecMainStartTimestamp=@{STARTED}",
            f"Environment={env}",
            "",
        ]
    lines += [f"file {image.files[p]}  {p}" for p in asked if p in image.files]
    if router_list:
        lines.append("router_workers ok")
        lines += [f"worker {url} healthy" for url in image.listed]
    lines.append("user yes")
    engine = image.engine
    marker = json.dumps({"release": engine.release, "lane": engine.lane})
    lines.append(f"env {engine.name} {marker}")
    lines.append(f"engine_current envs/{engine.name}")
    lines.append(f"model_target .{image.slug}@{image.key}")
    lines.append(f"enabled {layout.STAGE_UNIT} enabled")
    lines.append(f"toolkit {(image.record or '').strip()}")
    lines += [
        f"engine env={engine.name} {STARTED}",
        f"engine current=envs/{engine.name}",
        f"engine uv=uv {engine.uv}",
        *(f"engine toolkit={t}" for t in engine.toolkits),
        f"engine cache={engine.name} {engine.cache_owner}",
        *([f"engine proven={engine.name} {engine.proven}"] if engine.proven else []),
        "engine package=libnuma1 installed",
        "engine package=g++ installed",
    ]
    return lines


def staging_lines(image: Image) -> list[str]:
    """The ModelStaging fact's output: the source staged, up to date, `current` its copy."""
    staged = image.staging
    copy = {"digest": staged.digest, "bytes": staged.bytes, "files": staged.files}
    plan: dict[str, object] = {
        "source": copy,
        "error": None,
        "staged": copy,
        "leftovers": [],
        "hub_revision": staged.hub_revision,
        "copy_bytes": 0,
        "changed_files": [],
        "mismatched": [],
        "up_to_date": True,
        "current": f"{staged.models}/.{image.slug}@{image.key}",
    }
    return [json.dumps(plan)]


def repository_settings(host: str = HOST) -> Settings:
    """The repository's settings (group_data/all.py) as the deploy loads them for `host`."""
    return load(host, [Layer("group_data/all.py", group_data.read("all"))])


def bare_plan(settings: Settings, host: str = HOST) -> tuple[HostReport, Staging]:
    """The plan for the bare CT200 (ct200.py's answers, parsed by the facts' own parsers),
    and the ModelStaging fact it read (the source, not staged yet)."""
    bare = ct200.fake_responses()
    found = parse_host_facts(bare[SECTION])
    staged = parse_staging(bare[STAGING_SIGNATURE])
    key = host_plan.model_key(settings, staged, None)
    model = found.model
    assert model is not None, "the simulated CT200 has the model mounted"
    facts = Gathered(
        host=found, serving=Serving(), staging=staged, model=model, model_key=key, today=TODAY
    )
    return host_plan.decide(host, settings, facts, kbmod.load()), staged


def written(report: HostReport) -> list[PlannedFile]:
    """Every file the plan's steps write whose content it gives."""
    serve, model = report.serve, report.model_step
    assert serve is not None and model is not None, report.errors
    files = [*serve.files, *serve.smoke_files, *serve.rank_units.values()]
    files += [model.script, model.unit]
    if serve.router is not None:
        files += serve.router.files
    if report.throughput is not None:
        files += report.throughput.files
    if report.toolkit is not None:
        files.append(report.toolkit.file)
    return [f for f in files if f.content is not None and not f.secret]


def image(settings: Settings, host: str = HOST) -> Image:
    """The converged host of these settings: what the plan for the bare host writes."""
    report, staged = bare_plan(settings, host)
    if not report.ok:
        raise ValueError(f"{host}: the plan refuses the simulated host: {report.errors}")
    engine = report.plan.engine
    serve, source = report.serve, staged.source
    assert engine is not None and serve is not None and report.model_key is not None
    assert source is not None and source.digest is not None
    homes = {r.env["CUDA_HOME"].rsplit("/", 1)[-1] for r in report.plan.ranks}
    return Image(
        units={f.path.rsplit("/", 1)[-1]: f.text for f in serve.rank_units.values()},
        files={f.path: str(f.sha256) for f in written(report)},
        engine=Engine(
            name=engine.name,
            release=engine.release,
            lane=engine.lane,
            uv=settings.uv_version,
            toolkits=tuple(sorted(homes)),
            cache_owner=settings.service_user,
            proven=proven_record(report, settings),
        ),
        slug=layout.model_slug(settings),
        key=report.model_key,
        staging=StagedCopy(
            digest=source.digest,
            bytes=source.bytes,
            files=source.files,
            models=layout.stage_tree(settings).models,
        ),
        record=report.toolkit.file.text if report.toolkit is not None else None,
    )


def proven_record(report: HostReport, settings: Settings) -> str:
    """The record the engine step wrote once the check passed, as the service user, on the
    bare host's GPUs (steps/engine_check.proven_command's JSON): the day the ranks started."""
    gpu = report.gpu
    assert gpu is not None and gpu.driver_version is not None
    record = {
        "date": time.strftime("%Y-%m-%d", time.gmtime(STARTED)),
        "driver": gpu.driver_version,
        "gpus": [g.name for g in sorted(gpu.gpus, key=lambda g: g.index)],
        "user": settings.service_user,
    }
    return json.dumps(record, sort_keys=True)


def fake_responses(
    settings: Settings | None = None, measured: bool = False
) -> dict[str, list[str]]:
    """fake_responses host data for pyinfra's @fake connector: CT200 converged to `settings`
    (default: the repository's). The facts the plan asks besides ServingState and
    ModelStaging are the bare CT200's (ct200.py): the same GPUs, memory and model. `measured`:
    the host also holds two throughput records and a failed canary's verdict, as the real
    programs wrote them, and a finished tune's records in the tune's format (captured/ct200:
    throughput.jsonl, canary-state.txt, tune-state.txt; see its README)."""
    settings = settings or repository_settings()
    converged = image(settings)
    bare = ct200.fake_responses()
    status = status_lines(converged, settings)
    if measured:
        status[-1:-1] = [f"throughput {line}" for line in ct200.captured("throughput.jsonl")]
        status[-1:-1] = [f"canary {line}" for line in ct200.captured("canary-state.txt")]
        status[-1:-1] = [f"tune {line}" for line in ct200.captured("tune-state.txt")]
    return {
        # The status command's fact first: its command holds ServingState's too.
        STATUS_SIGNATURE: status,
        SERVING_SIGNATURE: serving_lines(converged, layout.checksummed_paths(settings)),
        STAGING_SIGNATURE: staging_lines(converged),
        **{matcher: lines for matcher, lines in bare.items() if matcher != STAGING_SIGNATURE},
    }


def status_lines(image: Image, settings: Settings) -> list[str]:
    """The status command's fact (ServingStatus, operations/facts/serve_status.py): the
    ServingState answer, each rank's /health 200 with no request running or queued (the
    format of programs/serving_probe.py), and each GPU's memory in use as a rank holds it
    (mem_fraction_static of the GPU's memory: a simulated figure, not a measurement)."""
    gpus = parse_host_facts(ct200.fake_responses()[SECTION]).gpu
    ranks = sorted(r for name in image.units if (r := layout.rank_of(name)) is not None)
    lines = serving_lines(image, layout.checksummed_paths(settings))
    lines += [f"health {r} 200" for r in ranks]
    lines += [f"metrics {r} 0 0" for r in ranks]
    for gpu in gpus.gpus if gpus is not None else []:
        used = int(gpu.memory_total_mib * settings.mem_fraction_static)
        lines.append(f"gpu {gpu.index}, {gpu.name}, {used}, {gpu.memory_total_mib}")
    return [*lines, "gpu_rc 0"]


def controller_locks(settings: Settings | None = None) -> str:
    """The simulated controller's engine_lock_dir: a temporary directory holding the lock of
    the engine the converged host runs (a converged controller has it: the first run copied
    it back), removed when the run ends. Its content is a placeholder: the plan reads only
    its name and digest, and a dry run uploads nothing."""
    settings = settings or repository_settings()
    report, _ = bare_plan(settings)
    assert report.plan.engine is not None, report.errors
    folder = tempfile.mkdtemp(prefix="sglang-demo-locks-")
    atexit.register(shutil.rmtree, folder, True)
    lock = Path(folder) / f"{report.plan.engine.name}.lock"
    lock.write_text("# the simulated controller's lock (operations/simulated/converged.py)\n")
    return folder


def files_of(image: Image) -> Mapping[str, str]:
    """Every file the converged host holds, rank units included, by path: sha256."""
    units = {layout.unit_path(name): sha256(text) for name, text in image.units.items()}
    return {**image.files, **units}
