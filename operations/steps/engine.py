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

An environment gets its marker file (layout.ENGINE_MARKER) only after the engine check passed,
so a cut download, a full disk or a failed check leaves a partial environment that `current`
never points to and that the next run removes. Everything the step does is decided by the plan
(operations/plan/engine_plan.py, pure and tested on its own, carried on the HostReport); each
operation gets its part of it and turns it into commands, asking no fact. See
docs/how-it-works/engine.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as _q
from typing import cast

from pyinfra import logger
from pyinfra.api.command import (
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    StringCommand,
)
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.operations import files

from operations.kb.pins import PinError, uv_requirement
from operations.layout import LOCK_FILE, EngineTree, env_python
from operations.plan.engine_plan import REDIST_DIR, EnginePlan, redist_dir
from operations.plan.engine_spec import EngineError, EngineSpec, indexes
from operations.plan.host_plan import HostReport
from operations.plan.vocabulary import EnvNow
from operations.redact import redact
from operations.render.host_scripts import script_text
from operations.runtime.host_call import Commands
from operations.runtime.on_controller import fail, keep_lock, local_dir, upload_refusal
from operations.runtime.pyinfra_internals import temp_filename
from operations.settings import Settings
from operations.steps.cuda_toolkit import host_packages, install_toolkit, sync_archives
from operations.steps.engine_check import verify_env
from operations.steps.host_files import new_file, put_planned
from operations.steps.users import service_user

# -- operations -----------------------------------------------------------------------------


@operation(is_idempotent=False)
def require_wheels(wheelhouse: str, missing: list[str], is_dir: bool = True) -> Commands:
    """
    Fail the host before any change when the controller's wheelhouse lacks a pinned wheel.

    + wheelhouse: the directory of wheels on the controller
    + missing: the pinned `name==version` requirements no wheel there satisfies (the plan's)
    + is_dir: whether the wheelhouse is a directory
    """
    if not missing:
        host.noop(f"the wheelhouse {wheelhouse} holds every pinned wheel")
        return
    where = f"in {wheelhouse}" if is_dir else f"({wheelhouse} is not a directory)"
    yield FunctionCommand(
        fail, (f"wheelhouse: no wheel for {', '.join(missing)} {where}; nothing changed",), {}
    )


@operation()
def sync_wheelhouse(src: str, dest: str, todo: list[str], count: int) -> Commands:
    """
    Copy the controller's wheels to the host: only files missing there or of another size
    (wheels are immutable by name, so a different size means a cut upload). Every file is
    uploaded under .partial/ and they are all renamed into place by one command once every
    upload finished, so a cut transfer never looks complete (and a wheelhouse of a few hundred
    wheels costs one remote command, not one per wheel).

    + src: the wheelhouse on the controller
    + dest: its copy on the host
    + todo: the wheels it lacks or holds at another size (the plan's, from WheelhouseFiles)
    + count: the wheels of src
    """
    if not todo:
        host.noop(f"{dest} already holds the {count} wheel(s) of {src}")
        return
    yield StringCommand("mkdir", "-p", _q(f"{dest}/.partial"))
    for file_name in todo:
        # Under `_sudo` pyinfra uploads through a temp file in the host's /tmp, by default
        # /tmp/pyinfra-<sha1 of dest>, which a local user could create first: a random name.
        yield FileUploadCommand(
            os.path.join(src, file_name),
            f"{dest}/.partial/{file_name}",
            remote_temp_filename=temp_filename(host),
        )
    names = " ".join(_q(n) for n in todo)
    yield StringCommand(f"cd {_q(dest + '/.partial')} && mv -f -- {names} ..")


@operation()
def bootstrap_uv(engine_root: str, version: str, installed: str | None) -> Commands:
    """
    Install uv (exactly `version`) under ENGINE_ROOT/tools with the system Python's venv and
    pip, which read ENGINE_ROOT/pip.conf when there is one (a main index or the wheelhouse):
    only the wheel whose sha256 operations/kb/pins/uv.txt pins (`--require-hashes --only-binary
    :all:`), whatever the index serves.

    + engine_root: the engine root on the host
    + version: the uv release
    + installed: the uv release there now (the plan's EngineState), None: none
    """
    if installed == version:
        host.noop(f"uv {version} is installed")
        return
    pinned = uv_requirement(version)
    if pinned is None:
        raise PinError(f"uv {version}: no pinned hash in operations/kb/pins/uv.txt")
    tree = EngineTree(engine_root)
    tools, conf = tree.tools, tree.pip_config
    requirements = tree.tools_requirements
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
    upload: bool,
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
    + upload: whether the controller has it (the plan's)
    + registries/wheelhouse/wheelhouse_files: where its packages may come from
      (lock_check.LockSources); no check when registries is None
    """
    tree = EngineTree(engine_root)
    project = tree.project(env_name)
    if upload:
        if registries is not None:
            refusal = upload_refusal(controller_lock, registries, wheelhouse, wheelhouse_files)
            if refusal is not None:
                yield FunctionCommand(fail, (refusal,), {})
                return
        # The project directory exists (its pyproject.toml was written just before).
        yield from new_file(Path(controller_lock), tree.project_lock(env_name), mode="600")
        return
    yield (
        f"cd {_q(project)} && rm -f {LOCK_FILE} && {_uv(engine_root)} lock {_cache(engine_root)} "
        "--no-progress --no-python-downloads"
    )


@operation()
def build_env(
    engine_root: str,
    env_name: str,
    python: str,
    offline: bool,
    now: EnvNow = "absent",
) -> Commands:
    """
    Create ENGINE_ROOT/envs/ENV_NAME and install exactly the project's lock into it; a partial
    environment of the same name (an earlier run cut short) is removed first.

    + engine_root: the engine root on the host
    + env_name: the environment's name (release-lane-hash)
    + python: the CPython minor the engine is locked for ("3.11"): the host's own, which uv
      must find (it never downloads one)
    + offline: install the exported lock from the wheelhouse (hashes checked), not the indexes
    + now: the environment on the host as the plan read it: "complete", "partial" or "absent"
    """
    tree = EngineTree(engine_root)
    env = tree.env(env_name)
    if now == "complete":
        host.noop(f"{env_name} is installed")
        return
    project = tree.project(env_name)
    uv, cache = _uv(engine_root), _cache(engine_root)
    if now == "partial":
        yield f"rm -rf {_q(env)}"
    yield (
        f"{uv} venv {cache} --no-progress --no-python-downloads --python-preference only-system "
        f"--python {_q(python)} {_q(env)}"
    )
    if offline:
        requirements = tree.project_requirements(env_name)
        yield (
            f"cd {_q(project)} && {uv} export --frozen --no-header --no-annotate "
            f"--no-emit-project --format requirements-txt -o {_q(requirements)} --quiet"
        )
        # Every pin exact (`===`): `==V` would also take a local build `V+cu129` that a mixed
        # fleet's wheelhouse holds beside V (programs/exact_pins.py says why).
        yield (f"{_q(env_python(env))} -I -c {_q(script_text('exact_pins.py'))} {_q(requirements)}")
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
    yield f"cp {_q(tree.project_lock(env_name))} {_q(tree.env_lock(env_name))}"


@operation()
def switch(engine_root: str, env_name: str, current: str | None) -> Commands:
    """
    Point ENGINE_ROOT/current at envs/ENV_NAME atomically (a new link under a name unique to
    this run, renamed over the old one: a reader sees the old or the new environment).

    + engine_root: the engine root on the host
    + env_name: the environment to make current
    + current: what `current` names as the plan read it (nothing before this operation moves
      it); None: no link
    """
    if current == env_name:
        host.noop(f"current is {env_name}")
        return
    tree = EngineTree(engine_root)
    yield (
        f"tmp=$(mktemp -u {_q(tree.current_temp_pattern)}) && "
        f'ln -s {_q(tree.current_target(env_name))} "$tmp" && '
        f'mv -T "$tmp" {_q(tree.current)} && '
        f"touch {_q(tree.env_marker(env_name))}"
    )


@operation()
def prune(engine_root: str, doomed: list[str], count: int, keep: int) -> Commands:
    """
    Remove the environments the plan dooms (partial ones, complete ones beyond the `keep` most
    recently activated, never one a rank unit names: engine_plan.envs_to_prune), with their
    projects.

    + engine_root: the engine root on the host
    + doomed: the environments to remove (names)
    + count: the environments on the host, for the no-op's line
    + keep: how many environments are kept, the current one included
    """
    if not doomed:
        host.noop(f"{count} environment(s), at most {keep} kept")
        return
    tree = EngineTree(engine_root)
    paths = [p for n in doomed for p in (tree.env(n), tree.project(n))]
    yield "rm -rf " + " ".join(_q(p) for p in paths)


@operation()
def compile_cache(engine_root: str, env_name: str, user: str, ready: bool) -> Commands:
    """
    The environment's compile caches (layout.EngineTree.compile_cache): a directory of the
    service user's, which every rank of this engine writes its JIT modules, kernels and autotune
    results into (plan/resolver/caches.py), kept until the environment is pruned.

    + engine_root: the engine root on the host
    + env_name: the environment's name
    + user: the service user (owner and group)
    + ready: the plan's word: it is there, the user's
    """
    path = EngineTree(engine_root).compile_cache(env_name)
    if ready:
        host.noop(f"{path} is {user}'s")
        return
    yield StringCommand(
        "install",
        "-d",
        "-m",
        "755",
        _q(EngineTree(engine_root).caches),
        "&&",
        "install",
        "-d",
        "-m",
        "750",
        "-o",
        _q(user),
        "-g",
        _q(user),
        _q(path),
        "&&",
        "chown",
        _q(f"{user}:{user}"),
        _q(path),
    )


@operation()
def prune_caches(engine_root: str, doomed: list[str]) -> Commands:
    """
    Remove the compile caches of pruned (or vanished) environments.

    + engine_root: the engine root on the host
    + doomed: their environments' names (the plan's)
    """
    if not doomed:
        host.noop("every compile cache belongs to a kept environment")
        return
    tree = EngineTree(engine_root)
    yield "rm -rf " + " ".join(_q(tree.compile_cache(n)) for n in doomed)


# -- the step -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineStep:
    """What later steps need: where the engine is, and whether `current` moved in this run."""

    spec: EngineSpec
    path: str
    switched: OperationMeta


@deploy("Engine")
def _engine_deploy(report: HostReport) -> EngineStep:
    plan = report.engine_step
    if plan is None:
        raise EngineError("the plan has no engine step for a host it accepted (a bug)")
    s, spec, root = report.settings, plan.spec, plan.root
    if plan.wheelhouse and plan.install:
        # First of all: a wheelhouse that lacks a pinned wheel changes nothing on the host.
        require_wheels(
            name="wheelhouse holds every pin",
            wheelhouse=plan.wheelhouse,
            missing=list(plan.missing_wheels),
            is_dir=plan.wheelhouse_is_dir,
        )
    # Before the install: the engine check compiles with this compiler. Outside it too: an
    # engine built before engines had a compiler gets one without being rebuilt.
    _compiler(s, plan)
    if plan.install:
        gpu = report.gpu
        _install(s, plan, [g.name for g in gpu.gpus] if gpu is not None and gpu.ok else [])
    elif plan.fetch_lock:
        _fetch_lock(plan)
    # One call for every host (pyinfra orders operations by where they are called): after the
    # install, whose service user owns it.
    _compile_cache(plan)
    switched = switch(
        name="switch current", engine_root=root, env_name=spec.name, current=plan.current_now
    )
    prune(
        name="prune old environments",
        engine_root=root,
        doomed=list(plan.prune),
        count=plan.env_count,
        keep=plan.keep,
    )
    prune_caches(name="prune old compile caches", engine_root=root, doomed=list(plan.prune_caches))
    return EngineStep(spec, EngineTree(root).current, switched)


# @deploy types every call as returning OperationMeta; this step returns an EngineStep.
install_engine = cast(Callable[[HostReport], EngineStep], _engine_deploy)


def _compile_cache(plan: EnginePlan) -> None:
    compile_cache(
        name="compile caches of the engine",
        engine_root=plan.root,
        env_name=plan.spec.name,
        user=plan.user,
        ready=plan.cache_ready,
    )


def _compiler(s: Settings, plan: EnginePlan) -> None:
    compiler = plan.compiler
    host_packages(name="libnuma1 and g++", installed=list(compiler.packages_now))
    tools = compiler.toolkit
    if tools is None:
        return
    if compiler.sync_archives:
        sync_archives(
            name="sync nvcc archives",
            src=redist_dir(plan.wheelhouse or ""),
            dest=EngineTree(plan.root).redist(REDIST_DIR),
            tools=tools.to_json(),
        )
    args_file = EngineTree(plan.root).toolkit_args(tools.name)
    install_toolkit(
        name=f"nvcc {tools.version}",
        engine_root=plan.root,
        tools=tools.to_json(),
        installed=[tools.name] if compiler.toolkit_installed else [],
        arguments="" if compiler.toolkit_installed else plan.file(args_file).text,
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
    (operations/plan/engine_lock_check.py), else deleted and the step fails naming each package and
    what is wrong.

    + src: the lock in the environment on the host
    + dest: the lock's path on the controller
    + registries/wheelhouse/wheelhouse_files: where its packages may come from
      (lock_check.LockSources)
    """
    # One name per host: the first hosts of an engine may all fetch at once.
    partial = f"{dest}.{re.sub(r'[^A-Za-z0-9_.-]', '_', host.name)}.partial"
    yield FunctionCommand(local_dir, (os.path.dirname(dest),), {})
    # A random temp name for the `_sudo` copy pyinfra downloads (not one derived from dest).
    yield FileDownloadCommand(src, partial, remote_temp_filename=temp_filename(host))
    yield FunctionCommand(keep_lock, (partial, dest, registries, wheelhouse, wheelhouse_files), {})


def _fetch_lock(plan: EnginePlan) -> None:
    fetch_lock(
        name="copy the lock back",
        src=EngineTree(plan.root).env_lock(plan.spec.name),
        dest=plan.controller_lock,
        **plan.lock_sources,
    )


def _install(s: Settings, plan: EnginePlan, gpus: list[str]) -> None:
    """Build the environment, check it on the GPUs (`gpus`: their names, recorded once it
    passed), then copy its lock back."""
    root, spec = plan.root, plan.spec
    tree = EngineTree(root)
    files.directory(name="directories", path=tree.envs, mode="755")
    if plan.wheelhouse and plan.wheelhouse_dest:
        sync_wheelhouse(
            name="sync the wheelhouse",
            src=plan.wheelhouse,
            dest=plan.wheelhouse_dest,
            todo=list(plan.wheels_todo),
            count=plan.wheels_count,
        )
    else:
        shown = ", ".join(f"{i.name} {redact(i.url)}" for i in indexes(s, spec))
        main = redact(s.package_index_url) if s.package_index_url else "the installer's default"
        logger.debug(f"engine indexes: {shown}; main {main}")
    if any(f.path == tree.pip_config for f in plan.files):
        put_planned(plan.file(tree.pip_config), name="pip.conf")
    bootstrap_uv(
        name=f"uv {plan.uv_version}",
        engine_root=root,
        version=plan.uv_version,
        installed=plan.uv_now,
    )
    # Root-only: index URLs may carry credentials; they never appear on a command line.
    put_planned(plan.file(tree.project_toml(spec.name)), name="project")
    lock_env(
        name="lock",
        engine_root=root,
        env_name=spec.name,
        controller_lock=plan.controller_lock,
        upload=plan.lock_upload,
        **plan.lock_sources,
    )
    build_env(
        name="install",
        engine_root=root,
        env_name=spec.name,
        python=spec.python,
        offline=bool(plan.wheelhouse),
        now="partial" if plan.partial else "absent",
    )
    # The check runs as the ranks will: their user must exist first (the model step's
    # call then finds it).
    service_user(
        name=f"service user {plan.user}",
        user=plan.user,
        make=not plan.user_exists,
    )
    verify_env(
        name="check on the GPUs",
        engine_root=root,
        spec=spec.to_json(),
        driver_version=plan.driver.version,
        driver_cuda=plan.driver.cuda,
        complete=False,
        user=plan.user,
        device_nodes=list(plan.device_nodes) if plan.device_nodes is not None else None,
        gpus=gpus,
    )
    if plan.fetch_lock:
        _fetch_lock(plan)
