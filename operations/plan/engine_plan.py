"""The engine step's plan: everything operations/steps/engine.py carries out, decided once from the
settings, the resolved EngineSpec and the facts the plan gathered (runtime/gather.py): the
EngineState lines of the ServingState fact, the host's wheelhouse (WheelhouseFiles, asked with
it when the settings name a wheelhouse), and the controller's wheelhouse and locks.

`decide` is pure; the step's operations each get their part of the plan and decide nothing
again (tests/unit/test_engine_plan.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from operations.facts.engine import HOST_PACKAGES, EngineHost
from operations.kb.pins import uv_requirement
from operations.layout import EngineTree
from operations.plan.engine_lock_check import LockArgs, lock_sources
from operations.plan.engine_probe import Driver
from operations.plan.engine_spec import (
    EngineSpec,
    Toolkit,
    lock_path,
    missing_wheels,
    pip_config,
    project_toml,
)
from operations.plan.planned_files import PlannedFile
from operations.plan.vocabulary import EngineStepJson
from operations.settings import Settings

# The compiler's archives for offline installs: beside the wheelhouse on the controller, under
# ENGINE_ROOT on the host.
REDIST_DIR = "cuda-redist"


def redist_dir(wheelhouse: str) -> str:
    """The controller's directory of compiler archives for offline installs."""
    return os.path.join(os.path.dirname(os.path.abspath(wheelhouse.rstrip("/"))), REDIST_DIR)


def toolkit_arguments(engine_root: str, tools: Toolkit, offline: bool) -> str:
    """What programs/cuda_toolkit.py is given (ENGINE_ROOT/cuda/.NAME.json, root-only): the
    engine plan lists it among its files, steps/cuda_toolkit.install_toolkit writes it."""
    arguments = {
        "home": tools.home(engine_root),
        "source": EngineTree(engine_root).redist(REDIST_DIR) if offline else tools.url,
        "root": tools.root,
        "archives": [{"path": a.path, "sha256": a.sha256, "size": a.size} for a in tools.archives],
        "marker": {"version": tools.version, "archives": [a.file_name for a in tools.archives]},
    }
    return json.dumps(arguments, indent=1) + "\n"


def no_engine() -> EngineHost:
    """The EngineState of a host with no engine yet."""
    return {"current": None, "envs": {}, "uv": None}


@dataclass(frozen=True)
class EngineFacts:
    """What the engine plan reads, gathered with the plan's other facts (runtime/gather.py)."""

    # The EngineState lines of the ServingState fact (no_engine(): the connector did not answer,
    # as pyinfra's @fake one in `make demo`: plan as for a host with no engine yet).
    state: EngineHost = field(default_factory=no_engine)
    # The deploy's directory on the controller (pyinfra resolves local paths against it).
    cwd: str = "."
    # The locks in the controller's engine_lock_dir: file name -> sha256 of its content.
    locks: dict[str, str] = field(default_factory=dict)
    # The controller's wheelhouse (setting wheelhouse): wheel name -> size; None: not a
    # directory (or no wheelhouse).
    wheels: dict[str, int] | None = None
    # The host's copy (WheelhouseFiles): wheel name -> size.
    wheels_now: dict[str, int] = field(default_factory=dict)
    # The ranks' environments (names) the host's rank units name now: never pruned.
    referenced: frozenset[str] = frozenset()
    user_exists: bool = False


@dataclass(frozen=True)
class CompilerPlan:
    packages_now: tuple[str, ...]
    toolkit: Toolkit | None
    toolkit_installed: bool
    # Offline: upload the compiler's archives first (the toolkit is not installed yet).
    sync_archives: bool


@dataclass(frozen=True)
class EnginePlan:
    spec: EngineSpec
    root: str
    # The environment is not complete on the host: build, check and switch to it.
    install: bool
    # A partial environment of that name (a cut run) is there: removed first.
    partial: bool
    uv_version: str
    uv_now: str | None
    # Setting wheelhouse (on the controller), its copy on the host, what the install needs of
    # it that it lacks, and what is uploaded.
    wheelhouse: str | None
    wheelhouse_dest: str | None
    wheelhouse_is_dir: bool
    missing_wheels: tuple[str, ...]
    wheels_todo: tuple[str, ...]
    wheels_count: int
    # The engine's lock on the controller; uploaded when there (lock_upload), else `uv lock`
    # resolves it and it is copied back (fetch_lock).
    controller_lock: str
    lock_upload: bool
    fetch_lock: bool
    lock_sources: LockArgs
    current_now: str | None
    prune: tuple[str, ...]
    # The environment's compile caches (layout.EngineTree.compile_cache) are there and the
    # service user's; the caches removed with their environments (and those of none).
    cache_ready: bool
    prune_caches: tuple[str, ...]
    env_count: int
    keep: int
    compiler: CompilerPlan
    driver: Driver
    user: str
    user_exists: bool
    device_nodes: tuple[str, ...] | None
    # Every file this step writes with content of the controller's.
    files: tuple[PlannedFile, ...] = ()

    @property
    def switch(self) -> bool:
        return self.current_now != self.spec.name

    def file(self, path: str) -> PlannedFile:
        for planned in self.files:
            if planned.path == path:
                return planned
        raise KeyError(f"{path} is not among the engine plan's files")

    def to_json(self) -> EngineStepJson:
        return {
            "name": self.spec.name,
            "install": self.install,
            "partial": self.partial,
            "uv": {"version": self.uv_version, "now": self.uv_now},
            "missing_wheels": list(self.missing_wheels),
            "wheels_to_sync": list(self.wheels_todo),
            "lock": {
                "controller": self.controller_lock,
                "upload": self.lock_upload,
                "fetch": self.fetch_lock,
            },
            "switch": {"from": self.current_now, "to": self.spec.name},
            "prune": list(self.prune),
            "compile_cache": {
                "path": EngineTree(self.root).compile_cache(self.spec.name),
                "make": not self.cache_ready,
                "prune": list(self.prune_caches),
            },
            "packages_missing": [p for p in HOST_PACKAGES if p not in self.compiler.packages_now],
            "toolkit": (
                {
                    "name": self.compiler.toolkit.name,
                    "installed": self.compiler.toolkit_installed,
                    "sync_archives": self.compiler.sync_archives,
                }
                if self.compiler.toolkit is not None
                else None
            ),
            "files": [f.to_json() for f in self.files],
        }


def envs_to_prune(
    state: EngineHost, target: str, keep: int, serving: str | Iterable[str] | None = None
) -> list[str]:
    """Environments to delete once `target` is current: partial ones (never the target, which
    its build step replaces), and complete ones beyond the `keep` most recently activated. The
    environment that was serving while this run started is kept too: its servers run until the
    serve step restarts them."""
    complete = [n for n, e in state["envs"].items() if e["complete"] and n != target]
    complete.sort(key=lambda n: (state["envs"][n]["activated_at"] or 0, n), reverse=True)
    kept = {target, *complete[: max(keep - 1, 0)]}
    # Every environment a rank unit names (rank_state.referenced_env_names) is kept too.
    kept.update([serving] if isinstance(serving, str) else serving or ())
    return sorted(n for n in state["envs"] if n not in kept)


def caches_to_prune(state: EngineHost, doomed: Iterable[str], target: str) -> list[str]:
    """Compile caches that go: those of the doomed environments, and those of environments
    no longer on the host (never the target's)."""
    gone = set(doomed) | {n for n in state.get("caches", {}) if n not in state["envs"]}
    return sorted(n for n in state.get("caches", {}) if n in gone and n != target)


def decide(
    settings: Settings,
    spec: EngineSpec,
    facts: EngineFacts,
    driver: Driver,
    device_nodes: Iterable[str] | None,
) -> EnginePlan:
    s, state = settings, facts.state
    tree = EngineTree(s.engine_root)
    env = state["envs"].get(spec.name)
    complete = bool(env and env["complete"])
    install = not complete
    wheelhouse = s.wheelhouse or None
    wheelhouse_dest = tree.wheelhouse if wheelhouse else None
    local = facts.wheels if facts.wheels is not None else {}
    missing: tuple[str, ...] = ()
    if wheelhouse and install:
        wanted = (*spec.requirements, f"uv=={s.uv_version}")
        missing = tuple(missing_wheels(wanted, sorted(local)))
    todo = tuple(n for n in sorted(local) if facts.wheels_now.get(n) != local[n])
    controller_lock = os.path.join(facts.cwd, lock_path(s, spec))
    have_lock = os.path.basename(controller_lock) in facts.locks
    sources = lock_sources(
        s, spec, wheelhouse_dest, sorted(local) if wheelhouse else None
    ).to_args()
    serving = {n for n in (state["current"], *facts.referenced) if n}
    doomed = tuple(envs_to_prune(state, spec.name, s.engine_keep, serving=sorted(serving)))
    tools = spec.toolkit
    toolkits = state.get("toolkits", [])
    compiler = CompilerPlan(
        tuple(state.get("packages", [])),
        tools,
        tools is not None and tools.name in toolkits,
        bool(wheelhouse) and tools is not None and tools.name not in toolkits,
    )
    files: list[PlannedFile] = []
    if install:
        conf = pip_config(s, wheelhouse_dest)
        if conf is not None:
            files.append(PlannedFile(tree.pip_config, conf, "600", secret=True))
        if state["uv"] != s.uv_version and (pinned := uv_requirement(s.uv_version)):
            files.append(PlannedFile(tree.tools_requirements, pinned + "\n"))
        files.append(
            PlannedFile(
                tree.project_toml(spec.name),
                project_toml(s, spec, wheelhouse_dest),
                "600",
                secret=True,
                dir_mode="700",
            )
        )
        name = spec.name
        if have_lock:
            digest = facts.locks[os.path.basename(controller_lock)]
            files.append(PlannedFile(tree.project_lock(name), None, "600", digest=digest))
        else:
            files.append(PlannedFile(tree.project_lock(name), made_by="uv lock"))
        if wheelhouse:
            files.append(PlannedFile(tree.project_requirements(name), made_by="uv export"))
        files.append(PlannedFile(tree.env_lock(name), made_by=f"cp {tree.project_lock(name)}"))
        marker = json.dumps(spec.marker(), sort_keys=True) + "\n"
        files.append(PlannedFile(tree.env_marker(spec.name), marker))
        # Beside it, once the check passed on the GPUs: their names, the driver, the day.
        files.append(PlannedFile(tree.env_proven(name), made_by="the engine check, once passed"))
    if tools is not None and not compiler.toolkit_installed:
        files.append(
            PlannedFile(
                tree.toolkit_args(tools.name),
                toolkit_arguments(s.engine_root, tools, bool(wheelhouse)),
                "600",
                secret=True,
            )
        )
    return EnginePlan(
        spec=spec,
        root=s.engine_root,
        install=install,
        partial=env is not None and not complete,
        uv_version=s.uv_version,
        uv_now=state["uv"],
        wheelhouse=wheelhouse,
        wheelhouse_dest=wheelhouse_dest,
        wheelhouse_is_dir=facts.wheels is not None,
        missing_wheels=missing,
        wheels_todo=todo,
        wheels_count=len(local),
        controller_lock=controller_lock,
        lock_upload=have_lock,
        fetch_lock=not have_lock,
        lock_sources=sources,
        current_now=state["current"],
        prune=doomed,
        cache_ready=state.get("caches", {}).get(spec.name) == s.service_user,
        prune_caches=tuple(caches_to_prune(state, doomed, spec.name)),
        env_count=len(state["envs"]),
        keep=s.engine_keep,
        compiler=compiler,
        driver=driver,
        user=s.service_user,
        user_exists=facts.user_exists,
        device_nodes=tuple(device_nodes) if device_nodes is not None else None,
        files=tuple(files),
    )
