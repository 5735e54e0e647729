"""Step 2 of the deploy: the pinned SGLang for the host's CUDA lane, locked, proven on the GPUs,
atomic and reversible.

Layout on the host (ENGINE_ROOT, default /opt/sglang):

    envs/<release>-<lane>-<hash>/   one virtual environment per resolved set (see EngineSpec)
    current -> envs/<name>          switched only after the engine check passed on the GPUs
    projects/<name>/                pyproject.toml (its indexes: root-only, URLs may hold
                                    tokens) and uv.lock (every package, version and hash)
    tools/bin/uv                    uv, bootstrapped from the main index or the wheelhouse
    pip.conf                        where that bootstrap looks (root-only)
    wheelhouse/                     the controller's wheels, for offline installs
    cache/                          uv's cache

Where each package comes from is the knowledge base's, per release and lane (kb.LaneBuild):
torch and its companions only from PyTorch's index, the kernel only from SGLang's kernel index
of the kernel build's own lane, everything else only from the main index. uv's explicit indexes
with per-package sources enforce that: no index can shadow another (SGLang's kernel indexes
carry dev builds of sglang, PyTorch's mirror numpy at older versions).

The lock: the first host to build an engine resolves it (`uv lock`) and its uv.lock is copied
back to the controller (setting engine_lock_dir); every later build of that engine (another
host, a rebuild, a rollback) uploads that lock and installs exactly it (`uv sync --frozen`, or
with a wheelhouse `uv pip install` of the exported set: exact versions, and their hashes when
the lock has them).

An environment gets its marker file (facts/engine.py MARKER) only after the engine check passed,
so a cut download, a full disk or a failed check leaves a partial environment that `current`
never points to and that the next run removes. Everything the step decides is pure and tested
on its own; the operations only turn those decisions into commands. See docs/engine.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import (
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    StringCommand,
)
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.api.state import State
from pyinfra.context import host
from pyinfra.context import state as pyinfra_state
from pyinfra.operations import files

from operations import units
from operations.engine_probe import Driver, evaluate, parse_probe
from operations.engine_spec import (
    EngineError,
    EngineSpec,
    indexes,
    lock_path,
    missing_wheels,
    pip_config,
    project_toml,
)
from operations.facts.engine import MARKER, EngineHost, EngineState, WheelhouseFiles
from operations.facts.serve import referenced_env_names
from operations.host_call import Commands, HostCall, run
from operations.host_files import put_file
from operations.host_plan import HostReport
from operations.host_scripts import script_text
from operations.layout import EngineTree, env_python
from operations.lock_check import LockArgs, LockSources, check_lock, lock_sources
from operations.pins import PinError, uv_requirement
from operations.preflight import NESTING_FIX
from operations.redact import redact
from operations.serve import service_user
from operations.settings import Settings
from operations.toolkit import REDIST_DIR, host_packages, install_toolkit, redist_dir, sync_archives

LOCK_FILE = "uv.lock"  # in each environment and project: the resolved set
# The engine check, run on the host by verify_env; engine_probe.py reads and judges its output.
CHECK_SCRIPT = script_text("engine_check.py")
CHECK_UNIT = "sglang-deploy-engine-check"
NAMESPACE_MARKER = "@@sandbox-namespace"
# The probe unit's ExecStart: the argument and the script come on stdin, so no `$` or `%` of
# theirs ever meets systemd's own expansion of an ExecStart= line.
_CHECK_BOOT = (
    "import sys; spec = sys.stdin.readline(); source = sys.stdin.read(); "
    "sys.argv = ['engine_check.py', spec]; "
    "exec(compile(source, 'engine_check.py', 'exec'), {'__name__': '__main__'})"
)


def check_command(
    python: str, argument: str, user: str | None, properties: list[tuple[str, str]]
) -> StringCommand:
    """The engine check as a rank runs: a transient unit (`systemd-run --wait --pipe`) as the
    service user, with the rank unit's own sandbox (units.check_sandbox), so identity, device
    access and sandbox are proven with the kernel before `current` moves. user None: as the
    operation's own user (root), for a host without systemd."""
    feed = ["{ printf '%s\\n'", _q(argument), "; printf '%s'", _q(CHECK_SCRIPT), "; } |"]
    if user is None:
        return StringCommand(*feed, _q(python), "-c", _q(_CHECK_BOOT))
    words = [
        *feed,
        f"systemd-run --wait --pipe --collect --quiet --unit={CHECK_UNIT}-$$",
        "-p",
        _q(f"User={user}"),
        "-p",
        _q(f"Group={user}"),
    ]
    for key, value in properties:
        words += ["-p", _q(f"{key}={value}")]
    words += [
        _q(python),
        "-c",
        _q(_CHECK_BOOT),
        # 226: systemd could not set up the unit's namespaces (systemd.exec(5) EXIT_NAMESPACE).
        f"; rc=$?; [ $rc -ne 226 ] || echo {NAMESPACE_MARKER}; exit $rc",
    ]
    return StringCommand(*words)


# -- the prune policy -----------------------------------------------------------------------


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
    # Every environment a rank unit names (facts.serve.referenced_env_names) is kept too.
    kept.update([serving] if isinstance(serving, str) else serving or ())
    return sorted(n for n in state["envs"] if n not in kept)


# -- operations -----------------------------------------------------------------------------


def _q(text: str) -> str:
    return shlex.quote(text)


def _env_dir(engine_root: str, name: str) -> str:
    return EngineTree(engine_root).env(name)


def _project_dir(engine_root: str, name: str) -> str:
    return EngineTree(engine_root).project(name)


def _state(engine_root: str) -> EngineHost:
    state: EngineHost | None = host.get_fact(EngineState, engine_root=engine_root)
    # None when the connector could not answer (pyinfra's @fake connector in `make demo`):
    # plan as for a host with no engine yet.
    return state or {"current": None, "envs": {}, "uv": None}


def _complete(state: EngineHost, name: str) -> bool:
    env = state["envs"].get(name)
    return bool(env and env["complete"])


def installs(report: HostReport) -> bool:
    """Whether this run builds the planned engine (it is not complete on the host): the engine
    step then makes the service user before its check, and the model step need not."""
    serving, spec = report.serving, report.plan.engine
    if serving is None or serving.engine is None or spec is None:
        return True
    return not _complete(serving.engine, spec.name)


@operation(is_idempotent=False)
def require_wheels(wheelhouse: str, requirements: list[str]) -> Commands:
    """
    Fail the host before any change when the controller's wheelhouse lacks a pinned wheel.

    + wheelhouse: the directory of wheels on the controller
    + requirements: the pinned `name==version` requirements
    """
    is_dir = os.path.isdir(wheelhouse)
    missing = missing_wheels(tuple(requirements), _local_wheels(wheelhouse) if is_dir else [])
    if not missing:
        host.noop(f"the wheelhouse {wheelhouse} holds every pinned wheel")
        return
    where = f"in {wheelhouse}" if is_dir else f"({wheelhouse} is not a directory)"
    yield FunctionCommand(
        _fail, (f"wheelhouse: no wheel for {', '.join(missing)} {where}; nothing changed",), {}
    )


def _fail(state: State, host: Host, message: str) -> bool:
    logger.error(f"{host.print_prefix}{message}")
    return False


@operation()
def sync_wheelhouse(src: str, dest: str) -> Commands:
    """
    Copy the controller's wheels to the host: only files missing there or of another size
    (wheels are immutable by name, so a different size means a cut upload). Every file is
    uploaded under .partial/ and they are all renamed into place by one command once every
    upload finished, so a cut transfer never looks complete (and a wheelhouse of a few hundred
    wheels costs one remote command, not one per wheel).

    + src: the wheelhouse on the controller
    + dest: its copy on the host
    """
    remote = host.get_fact(WheelhouseFiles, path=dest)
    local = _local_wheels(src)
    todo = [n for n in local if remote.get(n) != os.path.getsize(os.path.join(src, n))]
    if not todo:
        host.noop(f"{dest} already holds the {len(local)} wheel(s) of {src}")
        return
    yield StringCommand("mkdir", "-p", _q(f"{dest}/.partial"))
    for file_name in todo:
        # Under `_sudo` pyinfra uploads through a temp file in the host's /tmp, by default
        # /tmp/pyinfra-<sha1 of dest>, which a local user could create first: a random name.
        yield FileUploadCommand(
            os.path.join(src, file_name),
            f"{dest}/.partial/{file_name}",
            remote_temp_filename=host.get_temp_filename(),
        )
    names = " ".join(_q(n) for n in todo)
    yield StringCommand(f"cd {_q(dest + '/.partial')} && mv -f -- {names} ..")


def _local_wheels(directory: str) -> list[str]:
    # os.walk and os.path rather than pathlib or listdir: pyinfra-testing fakes local files
    # through those (local_files in an operation fixture).
    _, _, names = next(os.walk(directory), ("", [], []))
    return sorted(n for n in names if n.endswith(".whl"))


@operation()
def bootstrap_uv(
    engine_root: str, version: str, state: Mapping[str, Any] | None = None
) -> Commands:
    """
    Install uv (exactly `version`) under ENGINE_ROOT/tools with the system Python's venv and
    pip, which read ENGINE_ROOT/pip.conf when there is one (a main index or the wheelhouse):
    only the wheel whose sha256 operations/pins/uv.txt pins (`--require-hashes --only-binary
    :all:`), whatever the index serves.

    + engine_root: the engine root on the host
    + version: the uv release
    + state: the EngineState the plan read (ServingState.engine); read here when omitted
    """
    found = (_state(engine_root) if state is None else cast(EngineHost, state))["uv"]
    if found == version:
        host.noop(f"uv {version} is installed")
        return
    pinned = uv_requirement(version)
    if pinned is None:
        raise PinError(f"uv {version}: no pinned hash in operations/pins/uv.txt")
    tree = EngineTree(engine_root)
    tools, conf = tree.tools, tree.pip_config
    requirements = f"{tools}/requirements.txt"
    yield (
        f"rm -rf {_q(tools)} && python3 -m venv {_q(tools)} && "
        f"printf '%s\\n' {_q(pinned)} > {_q(requirements)} && "
        f"if [ -f {_q(conf)} ]; then export PIP_CONFIG_FILE={_q(conf)}; fi && "
        f"{_q(tree.tools_pip)} install --disable-pip-version-check --no-input --quiet "
        f"--require-hashes --only-binary :all: --no-deps -r {_q(requirements)}"
    )


def _uv(engine_root: str) -> str:
    return _q(EngineTree(engine_root).uv)


def _cache(engine_root: str) -> str:
    return f"--cache-dir {_q(EngineTree(engine_root).cache)}"


@operation()
def lock_env(
    engine_root: str,
    env_name: str,
    controller_lock: str,
    registries: list[str] | None = None,
    wheelhouse: str | None = None,
    wheelhouse_files: list[str] | None = None,
) -> Commands:
    """
    Give the engine's project its lock: the controller's copy when it has one (the identical
    set every host of this engine installs) and it passes the lock check, else a fresh
    `uv lock` against the indexes.

    + engine_root: the engine root on the host
    + env_name: the environment's name (release-lane-hash)
    + controller_lock: where the lock lives on the controller
    + registries/wheelhouse/wheelhouse_files: where its packages may come from
      (lock_check.LockSources); no check when registries is None
    """
    project = _project_dir(engine_root, env_name)
    if os.path.isfile(controller_lock):
        if registries is not None:
            sources = LockSources.from_args(registries, wheelhouse, wheelhouse_files)
            with open(controller_lock) as lock:
                problems = check_lock(lock.read(), sources)
            if problems:
                yield FunctionCommand(_fail, (_refused(controller_lock, problems, False),), {})
                return
        # The project directory exists (its pyproject.toml was written just before).
        yield from put_file._inner(
            src=Path(controller_lock),
            dest=f"{project}/{LOCK_FILE}",
            mode="600",
            sha256_now=None,
        )
        return
    yield (
        f"cd {_q(project)} && rm -f uv.lock && {_uv(engine_root)} lock {_cache(engine_root)} "
        "--no-progress --no-python-downloads"
    )


@operation()
def build_env(
    engine_root: str,
    env_name: str,
    python: str,
    offline: bool,
    state: Mapping[str, Any] | None = None,
) -> Commands:
    """
    Create ENGINE_ROOT/envs/ENV_NAME and install exactly the project's lock into it; a partial
    environment of the same name (an earlier run cut short) is removed first.

    + engine_root: the engine root on the host
    + env_name: the environment's name (release-lane-hash)
    + python: the CPython minor the engine is locked for ("3.11"): the host's own, which uv
      must find (it never downloads one)
    + offline: install the exported lock from the wheelhouse (hashes checked), not the indexes
    + state: the EngineState the plan read (ServingState.engine); read here when omitted
    """
    state = _state(engine_root) if state is None else cast(EngineHost, state)
    env = _env_dir(engine_root, env_name)
    if _complete(state, env_name):
        host.noop(f"{env_name} is installed")
        return
    project = _project_dir(engine_root, env_name)
    uv, cache = _uv(engine_root), _cache(engine_root)
    if env_name in state["envs"]:
        yield f"rm -rf {_q(env)}"
    yield (
        f"{uv} venv {cache} --no-progress --no-python-downloads --python-preference only-system "
        f"--python {_q(python)} {_q(env)}"
    )
    if offline:
        requirements = f"{project}/requirements.txt"
        yield (
            f"cd {_q(project)} && {uv} export --frozen --no-header --no-annotate "
            f"--no-emit-project --format requirements-txt -o {_q(requirements)} --quiet"
        )
        yield (
            f"{uv} pip install {cache} --no-progress --no-config --offline --no-index "
            f"--find-links {_q(EngineTree(engine_root).wheelhouse)} --no-deps "
            f"--python {_q(env_python(env))} -r {_q(requirements)}"
        )
    else:
        yield (
            f"cd {_q(project)} && UV_PROJECT_ENVIRONMENT={_q(env)} {uv} sync {cache} --frozen "
            "--no-progress --no-python-downloads --no-install-project"
        )
    # The lock lives with the environment: every package it holds, versions and hashes.
    yield f"cp {_q(project + '/uv.lock')} {_q(env + '/' + LOCK_FILE)}"


def _verify(
    state: State,
    host: Host,
    arguments: ConnectorArguments,
    env: str,
    wanted: Mapping[str, object],
    driver: list[str | None],
    engine_root: str,
    user: str | None = None,
    device_nodes: list[str] | None = None,
) -> bool:
    spec = EngineSpec.from_json(wanted)
    tools = spec.toolkit
    argument = json.dumps(
        {
            "packages": spec.modules(),
            "gpu_count": spec.gpu_count,
            "cuda_home": tools.home(engine_root) if tools else None,
            "arch": spec.compile_arch,
        }
    )
    # As the operation's commands run: as root through sudo when the host says `_sudo`.
    nodes = tuple(device_nodes) if device_nodes is not None else None
    properties = units.check_sandbox(user, spec.gpu_count, nodes) if user else []
    status, output = run(
        host, arguments, check_command(env_python(env), argument, user, properties)
    )
    probe = parse_probe(output.stdout + "\n" + output.stderr)
    problems = evaluate(probe, spec, Driver(*driver))
    if user is not None and probe.user is not None and probe.user != user and not problems:
        problems = [f"the engine check ran as {probe.user}, not as the service user {user}"]
    if NAMESPACE_MARKER in output.stdout:
        problems = [
            f"the engine check's unit ({CHECK_UNIT}, a rank unit's sandbox, as {user}) could "
            "not start: exit status 226/NAMESPACE, systemd cannot set up its mount namespace in "
            f"this container: {NESTING_FIX}"
        ]
    if not status and not problems:
        problems = [f"the engine check failed: {output.stderr.strip()[-500:]}"]
    if problems:
        logger.error(
            f"{host.print_prefix}engine {spec.name} failed its check on the GPUs; `current` "
            "and the serving ranks are unchanged:" + "".join(f"\n    {p}" for p in problems)
        )
        return False
    where = f" as {user}, in a rank's sandbox" if user else ""
    logger.info(
        f"{host.print_prefix}engine {spec.name} passed its check on {spec.gpu_count} GPU(s)" + where
    )
    return True


@operation()
def verify_env(
    engine_root: str,
    spec: EngineSpec | Mapping[str, object],
    driver_version: str | None = None,
    driver_cuda: str | None = None,
    state: Mapping[str, Any] | None = None,
    user: str | None = None,
    device_nodes: list[str] | None = None,
) -> Commands:
    """
    The engine check, before anything points at the new environment, as a rank runs (the
    service user, in a transient unit with the rank unit's sandbox, every GPU allowed): the
    installed builds are the pins; torch is the lane's CUDA build, sees every GPU with the
    expected capability and runs a small CUDA operation on each; the kernel, flashinfer,
    torchvision, torchaudio and the launch module import. Then write its marker: from here on
    it is complete.

    + engine_root: the engine root on the host
    + spec: what the environment must hold (an EngineSpec or its to_json())
    + driver_version/driver_cuda: the host's driver as preflight's nvidia-smi read it, for the
      advice in a failure
    + state: the EngineState the plan read (ServingState.engine); read here when omitted
    + user: the service user the check runs as (it must exist); None runs it as root, bare
    + device_nodes: the host's NVIDIA nodes (HostResources), for the optional DeviceAllow= lines
    """
    if not isinstance(spec, EngineSpec):
        spec = EngineSpec.from_json(spec)
    found = _state(engine_root) if state is None else cast(EngineHost, state)
    if _complete(found, spec.name):
        host.noop(f"{spec.name} passed its check when it was installed")
        return
    env = _env_dir(engine_root, spec.name)
    yield HostCall(
        _verify,
        (env, spec.to_json(), [driver_version, driver_cuda], engine_root, user, device_nodes),
        {},
    )
    marker = json.dumps(spec.marker(), sort_keys=True)
    yield (
        f"printf '%s\\n' {_q(marker)} > {_q(env + '/' + MARKER + '.tmp')} && "
        f"mv -f {_q(env + '/' + MARKER + '.tmp')} {_q(env + '/' + MARKER)}"
    )


@operation()
def switch(engine_root: str, env_name: str, state: Mapping[str, Any] | None = None) -> Commands:
    """
    Point ENGINE_ROOT/current at envs/ENV_NAME atomically (a new link under a name unique to
    this run, renamed over the old one: a reader sees the old or the new environment).

    + engine_root: the engine root on the host
    + env_name: the environment to make current
    + state: the EngineState fact as the step read it (nothing before this operation moves
      `current`); read here when omitted
    """
    state = _state(engine_root) if state is None else cast(EngineHost, state)
    if state["current"] == env_name:
        host.noop(f"current is {env_name}")
        return
    tree = EngineTree(engine_root)
    yield (
        f"tmp=$(mktemp -u {_q(tree.current_temp_pattern)}) && "
        f'ln -s {_q(tree.current_target(env_name))} "$tmp" && '
        f'mv -T "$tmp" {_q(tree.current)} && '
        f"touch {_q(tree.env(env_name) + '/' + MARKER)}"
    )


@operation()
def prune(
    engine_root: str,
    env_name: str,
    keep: int,
    serving: str | list[str] | None = None,
    # Not EngineHost: pyinfra checks operation arguments with isinstance, which a TypedDict
    # refuses.
    state: Mapping[str, Any] | None = None,
) -> Commands:
    """
    Remove partial environments and complete ones beyond the `keep` most recently activated,
    with their projects.

    + engine_root: the engine root on the host
    + env_name: the environment that is now current
    + keep: how many environments to keep, the current one included
    + serving: the environment `current` named when the run started: kept as well, since its
      servers run until the serve step restarts them
    + state: the EngineState fact as the step read it (the install only adds or rebuilds
      env_name, which is always kept); read here when omitted
    """
    state = _state(engine_root) if state is None else cast(EngineHost, state)
    doomed = envs_to_prune(state, env_name, keep, serving=serving)
    if not doomed:
        host.noop(f"{len(state['envs'])} environment(s), at most {keep} kept")
        return
    paths = [p for n in doomed for p in (_env_dir(engine_root, n), _project_dir(engine_root, n))]
    yield "rm -rf " + " ".join(_q(p) for p in paths)


# -- the step -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineStep:
    """What later steps need: where the engine is, and whether `current` moved in this run."""

    spec: EngineSpec
    path: str
    switched: OperationMeta


@deploy("Engine")
def _engine_deploy(report: HostReport) -> EngineStep:
    s = report.settings
    spec = report.plan.engine
    if spec is None:
        raise EngineError("the resolver planned no engine for a host it accepted (a bug)")
    root = s.engine_root
    # The engine's state as the plan read it (the ServingState fact's `engine` lines): a
    # converged host stops here, the target complete and current, with no fact of its own.
    serving = report.serving
    state: EngineHost = (
        serving.engine
        if serving is not None and serving.engine is not None
        else {"current": None, "envs": {}, "uv": None}
    )
    # Relative to the deploy's directory, as pyinfra resolves local paths.
    controller_lock = os.path.join(pyinfra_state.cwd or os.getcwd(), lock_path(s, spec))
    complete = _complete(state, spec.name)
    if s.wheelhouse and not complete:
        # First of all: a wheelhouse that lacks a pinned wheel changes nothing on the host.
        require_wheels(
            name="wheelhouse holds every pin",
            wheelhouse=s.wheelhouse,
            requirements=[*spec.requirements, f"uv=={s.uv_version}"],
        )
    # Before the install: the engine check compiles with this compiler. Outside it too: an
    # engine built before engines had a compiler gets one without being rebuilt.
    _compiler(s, spec, state)
    if not complete:
        gpu = report.gpu
        driver = Driver(gpu.driver_version if gpu else None, gpu.cuda_version if gpu else None)
        user_exists = serving is not None and serving.user_exists
        nodes = report.resources.device_nodes if report.resources is not None else None
        _install(s, spec, driver, controller_lock, state, user_exists, nodes)
    elif not os.path.isfile(controller_lock):
        _fetch_lock(s, spec, controller_lock)
    # The fact read above, passed on: read again, it would cost a round trip per operation
    # and one more for `switched.will_change`, which the serve step asks.
    switched = switch(name="switch current", engine_root=root, env_name=spec.name, state=state)
    prune(
        name="prune old environments",
        engine_root=root,
        env_name=spec.name,
        keep=s.engine_keep,
        serving=sorted(
            {
                n
                for n in (
                    state["current"],
                    *(referenced_env_names(serving, root) if serving is not None else ()),
                )
                if n
            }
        ),
        state=state,
    )
    return EngineStep(spec, EngineTree(root).current, switched)


# @deploy types every call as returning OperationMeta; this step returns an EngineStep.
install_engine = cast(Callable[[HostReport], EngineStep], _engine_deploy)


def _compiler(s: Settings, spec: EngineSpec, state: EngineHost) -> None:
    host_packages(name="libnuma1 and g++", installed=state.get("packages", []))
    tools = spec.toolkit
    if tools is None:
        return
    installed = state.get("toolkits", [])
    if s.wheelhouse and tools.name not in installed:
        sync_archives(
            name="sync nvcc archives",
            src=redist_dir(s.wheelhouse),
            dest=EngineTree(s.engine_root).redist(REDIST_DIR),
            tools=tools,
        )
    install_toolkit(
        name=f"nvcc {tools.version}",
        engine_root=s.engine_root,
        tools=tools,
        installed=installed,
        offline=bool(s.wheelhouse),
    )


@operation(is_idempotent=False)
def fetch_lock(
    src: str,
    dest: str,
    registries: list[str],
    wheelhouse: str | None = None,
    wheelhouse_files: list[str] | None = None,
) -> Commands:
    """
    Copy an engine's lock from the host to the controller, so every later build of that engine
    installs exactly it: downloaded beside DEST (DEST.HOST.partial), kept (renamed to DEST;
    the last host's when several fetch at once) only if it passes the lock check
    (operations/lock_check.py), else deleted and the step fails naming each package and what
    is wrong.

    + src: the lock in the environment on the host
    + dest: the lock's path on the controller
    + registries/wheelhouse/wheelhouse_files: where its packages may come from
      (lock_check.LockSources)
    """
    # One name per host: the first hosts of an engine may all fetch at once.
    partial = f"{dest}.{re.sub(r'[^A-Za-z0-9_.-]', '_', host.name)}.partial"
    yield FunctionCommand(_local_dir, (os.path.dirname(dest),), {})
    # A random temp name for the `_sudo` copy pyinfra downloads (not one derived from dest).
    yield FileDownloadCommand(src, partial, remote_temp_filename=host.get_temp_filename())
    yield FunctionCommand(_keep_lock, (partial, dest, registries, wheelhouse, wheelhouse_files), {})


def _refused(lock: str, problems: list[str], deleted: bool) -> str:
    what = "deleted, not kept" if deleted else "not uploaded"
    return f"the lock {lock} fails the lock check ({what}):" + "".join(
        f"\n    {p}" for p in problems
    )


def _keep_lock(
    state: State,
    host: Host,
    partial: str,
    dest: str,
    registries: list[str],
    wheelhouse: str | None,
    wheelhouse_files: list[str] | None,
) -> bool:
    """Keep the downloaded lock as DEST if it passes the lock check, else delete it."""
    sources = LockSources.from_args(registries, wheelhouse, wheelhouse_files)
    with open(partial) as lock:
        problems = check_lock(lock.read(), sources)
    if problems:
        os.remove(partial)
        return _fail(state, host, _refused(dest, problems, True))
    os.replace(partial, dest)
    return True


def _local_dir(state: State, host: Host, path: str) -> bool:
    os.makedirs(path or ".", exist_ok=True)
    return True


def _sources(s: Settings, spec: EngineSpec) -> LockArgs:
    """Where a lock of `spec` may take its packages from, as operation arguments."""
    wheelhouse = EngineTree(s.engine_root).wheelhouse if s.wheelhouse else None
    files = _local_wheels(s.wheelhouse) if s.wheelhouse else None
    return lock_sources(s, spec, wheelhouse, files).to_args()


def _fetch_lock(s: Settings, spec: EngineSpec, controller_lock: str) -> None:
    fetch_lock(
        name="copy the lock back",
        src=f"{_env_dir(s.engine_root, spec.name)}/{LOCK_FILE}",
        dest=controller_lock,
        **_sources(s, spec),
    )


def _install(
    s: Settings,
    spec: EngineSpec,
    driver: Driver,
    controller_lock: str,
    state: EngineHost,
    user_exists: bool = False,
    device_nodes: list[str] | None = None,
) -> None:
    root = s.engine_root
    wheelhouse_dir = EngineTree(root).wheelhouse if s.wheelhouse else None
    files.directory(name="directories", path=EngineTree(root).envs, mode="755")
    if s.wheelhouse and wheelhouse_dir:
        sync_wheelhouse(name="sync the wheelhouse", src=s.wheelhouse, dest=wheelhouse_dir)
    else:
        shown = ", ".join(f"{i.name} {redact(i.url)}" for i in indexes(s, spec))
        main = redact(s.package_index_url) if s.package_index_url else "the installer's default"
        logger.debug(f"engine indexes: {shown}; main {main}")
    conf = pip_config(s, wheelhouse_dir)
    if conf is not None:
        put_file(
            name="pip.conf",
            src=conf,
            dest=EngineTree(root).pip_config,
            mode="600",
            dir_mode="755",
            secret=True,
        )
    bootstrap_uv(name=f"uv {s.uv_version}", engine_root=root, version=s.uv_version, state=state)
    # Root-only: index URLs may carry credentials; they never appear on a command line.
    put_file(
        name="project",
        src=project_toml(s, spec, wheelhouse_dir),
        dest=f"{_project_dir(root, spec.name)}/pyproject.toml",
        mode="600",
        dir_mode="700",
        secret=True,
    )
    lock_env(
        name="lock",
        engine_root=root,
        env_name=spec.name,
        controller_lock=controller_lock,
        **_sources(s, spec),
    )
    build_env(
        name="install",
        engine_root=root,
        env_name=spec.name,
        python=spec.python,
        offline=bool(s.wheelhouse),
        state=state,
    )
    # The check runs as the ranks will: their user must exist first (the model step's
    # call then finds it).
    service_user(
        name=f"service user {s.service_user}",
        user=s.service_user,
        exists=user_exists,
    )
    verify_env(
        name="check on the GPUs",
        engine_root=root,
        spec=spec,
        driver_version=driver.version,
        driver_cuda=driver.cuda,
        state=state,
        user=s.service_user,
        device_nodes=device_nodes,
    )
    if not os.path.isfile(controller_lock):
        _fetch_lock(s, spec, controller_lock)
