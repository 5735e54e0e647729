"""Step 2 of the deploy: the pinned SGLang for the host's CUDA lane, atomic and reversible.

Layout on the host (ENGINE_ROOT, default /opt/sglang):

    envs/<release>-<lane>-<hash>/   one virtual environment per resolved set (see EngineSpec)
    current -> envs/<name>          what the servers run; switched only after the checks pass
    tools/bin/uv                    uv, bootstrapped from the package index or the wheelhouse
    uv.toml, pip.conf               where packages come from (root-only: URLs may hold tokens)
    wheelhouse/                     the controller's wheels, for offline installs
    cache/                          uv's cache

An environment gets its marker file (facts/engine.py MARKER) only after its checks pass, so a cut
download, a full disk or a failed check leaves a partial environment that `current` never points
to and that the next run removes. Everything the step decides is pure and tested on its own
(EngineSpec, lane_indexes, the probe parser and evaluate, envs_to_prune); the operations only
turn those decisions into commands. See docs/engine.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from io import StringIO
from typing import Any, cast

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from pyinfra import logger
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.operations import files

from operations import kb as kbmod
from operations.facts.engine import MARKER, EngineHost, EngineState, WheelhouseFiles
from operations.host_plan import HostReport
from operations.kb import Knowledge
from operations.settings import Settings

HASH_LENGTH = 8


class EngineError(Exception):
    """The engine cannot be planned for this host (a bug upstream or bad data)."""


# -- what to install: pure ------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    """The resolved set of one engine environment and what its checks expect."""

    release: str
    lane: str
    cuda: str  # the lane's CUDA version, what torch.version.cuda must say
    python: str  # the release's Python specifier (knowledge base)
    torch: str  # e.g. "2.11.0+cu128"
    arch: str | None  # e.g. "sm_120": must be compiled into torch when GPUs are visible
    requirements: tuple[str, ...]

    @property
    def digest(self) -> str:
        # Only what decides the environment's contents: two hosts (or two runs) with the same
        # pins get the same name, whatever index or wheelhouse the wheels came from.
        canonical = json.dumps(
            {"requirements": sorted(self.requirements), "python": self.python}, sort_keys=True
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]

    @property
    def name(self) -> str:
        return f"{self.release}-{self.lane}-{self.digest}"

    def to_json(self) -> dict[str, Any]:
        # pyinfra's serialisation hook (op fixtures, --debug-operations).
        return {**asdict(self), "requirements": list(self.requirements), "name": self.name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSpec:
        fields = {k: v for k, v in data.items() if k != "name"}
        return cls(**{**fields, "requirements": tuple(data["requirements"])})

    def marker(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "lane": self.lane,
            "python": self.python,
            "requirements": list(self.requirements),
        }


def engine_spec(settings: Settings, kb: Knowledge) -> EngineSpec:
    """The environment the settings ask for. The resolver has already refused bad pins and
    lanes with the user-facing message; this only guards against being called without it."""
    release = kb.releases.get(settings.sglang_version)
    lane = kb.lanes.get(settings.cuda_lane)
    if release is None or lane is None:
        raise EngineError(
            f"sglang {settings.sglang_version} on {settings.cuda_lane} is not in the knowledge "
            "base (the resolver should have refused this host)"
        )
    tag = settings.cuda_lane
    kernel = release["kernel"]
    # The lane's builds carry it as their local version (torch-2.11.0+cu128,
    # sgl_kernel-0.3.21+cu128 on https://docs.sglang.io/whl/cu128/sgl-kernel): pinning it keeps a
    # CUDA 13 build (plain 2.11.0 on PyPI, or +cu130) from ever satisfying the requirement.
    torch = f"{release['torch']}+{tag}"
    requirements = (
        f"sglang=={settings.sglang_version}",
        f"torch=={torch}",
        f"{kernel['package']}=={kernel['version']}+{tag}",
        f"flashinfer-python=={release['flashinfer']}",
    )
    gpu = kb.gpus.get(settings.gpu_compute_cap)
    return EngineSpec(
        release=settings.sglang_version,
        lane=settings.cuda_lane,
        cuda=str(lane["cuda"]),
        python=str(release["python"]),
        torch=torch,
        arch=str(gpu["arch"]) if gpu else None,
        requirements=requirements,
    )


@dataclass(frozen=True)
class Indexes:
    main: str
    torch: str
    kernel: str


def lane_indexes(settings: Settings, lane: str) -> Indexes:
    """The three index URLs of a lane: `{lane}` in a setting is replaced by the lane's name."""
    return Indexes(
        main=settings.package_index_url,
        torch=settings.torch_index_url.replace("{lane}", lane),
        kernel=settings.kernel_index_url.replace("{lane}", lane),
    )


def redact(url: str) -> str:
    """A URL fit for a log line: credentials (user:token@) removed."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def uv_config(indexes: Indexes | None, wheelhouse_dir: str | None) -> str:
    """uv.toml: the lane's indexes in priority order (uv takes a package from the first index
    that has it, so torch only ever comes from the torch index), or the wheelhouse alone."""
    if indexes is None:
        assert wheelhouse_dir is not None
        return f"no-index = true\nfind-links = [{_toml_string(wheelhouse_dir)}]\n"
    blocks = [
        f"[[index]]\nname = {_toml_string(name)}\nurl = {_toml_string(url)}\n{extra}"
        for name, url, extra in (
            ("torch", indexes.torch, ""),
            ("kernel", indexes.kernel, ""),
            ("main", indexes.main, "default = true\n"),
        )
    ]
    return "\n".join(blocks)


def pip_config(indexes: Indexes | None, wheelhouse_dir: str | None) -> str:
    """pip.conf for bootstrapping uv with the system Python's pip."""
    if indexes is None:
        return f"[global]\nno-index = true\nfind-links = {wheelhouse_dir}\n"
    return f"[global]\nindex-url = {indexes.main}\n"


def missing_wheels(requirements: tuple[str, ...], wheel_names: list[str]) -> list[str]:
    """The `name==version` requirements that no wheel file in `wheel_names` satisfies."""
    have: set[tuple[str, Version]] = set()
    for file_name in wheel_names:
        try:
            project, found, _, _ = parse_wheel_filename(file_name)
        except ValueError:
            continue
        have.add((canonicalize_name(project), found))
    missing = []
    for requirement in requirements:
        name, _, pin = requirement.partition("==")
        if (canonicalize_name(name), Version(pin)) not in have:
            missing.append(requirement)
    return missing


# -- the checks: a probe run with the new environment's Python, judged here ----------------

PROBE_SCRIPT = r"""
import json
from importlib import import_module, metadata
out = {}
try:
    out["sglang"] = metadata.version("sglang")
except Exception as e:
    out["sglang_error"] = repr(e)
try:
    torch = import_module("torch")
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["arch_list"] = list(torch.cuda.get_arch_list())
except Exception as e:
    out["torch_error"] = repr(e)
try:
    import_module("sglang.launch_server")
    out["launch_server"] = "ok"
except BaseException as e:
    out["launch_server"] = repr(e)
print("@@probe " + json.dumps(out))
"""

PROBE_PREFIX = "@@probe "


@dataclass(frozen=True)
class Probe:
    sglang: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    cuda_available: bool = False
    arch_list: tuple[str, ...] = ()
    launch_server: str | None = None
    errors: tuple[str, ...] = ()


def parse_probe(text: str) -> Probe:
    """The probe's JSON line among whatever else the imports printed."""
    for line in reversed(text.splitlines()):
        if line.startswith(PROBE_PREFIX):
            data = json.loads(line[len(PROBE_PREFIX) :])
            break
    else:
        tail = text.strip().splitlines()[-3:]
        return Probe(errors=("the probe printed no result: " + " / ".join(tail),))
    errors = tuple(f"{k}: {data[k]}" for k in ("sglang_error", "torch_error") if k in data)
    return Probe(
        sglang=data.get("sglang"),
        torch=data.get("torch"),
        torch_cuda=data.get("torch_cuda"),
        cuda_available=bool(data.get("cuda_available")),
        arch_list=tuple(data.get("arch_list") or ()),
        launch_server=data.get("launch_server"),
        errors=errors,
    )


def evaluate(probe: Probe, spec: EngineSpec) -> list[str]:
    """Every failed check as 'what: expected X, found Y'; empty when the environment is good."""
    problems = list(probe.errors)
    if probe.sglang != spec.release:
        problems.append(f"sglang version: expected {spec.release}, found {probe.sglang}")
    if probe.torch != spec.torch:
        problems.append(
            f"torch build: expected {spec.torch} (the {spec.lane} lane), found {probe.torch}"
        )
    if probe.torch_cuda != spec.cuda:
        problems.append(
            f"torch.version.cuda: expected {spec.cuda} (the {spec.lane} lane), "
            f"found {probe.torch_cuda}"
        )
    if probe.cuda_available and spec.arch and spec.arch not in probe.arch_list:
        problems.append(
            f"torch.cuda.get_arch_list(): expected {spec.arch} among them, found "
            f"{', '.join(probe.arch_list) or 'none'}"
        )
    if probe.launch_server != "ok":
        problems.append(
            f"python -c 'import sglang.launch_server': expected it to import, found "
            f"{probe.launch_server}"
        )
    return problems


def envs_to_prune(
    state: EngineHost, target: str, keep: int, serving: str | None = None
) -> list[str]:
    """Environments to delete once `target` is current: partial ones (never the target, which
    its build step replaces), and complete ones beyond the `keep` most recently activated. The
    environment that was serving while this run started is kept too: its servers run until the
    serve step restarts them."""
    complete = [n for n, e in state["envs"].items() if e["complete"] and n != target]
    complete.sort(key=lambda n: (state["envs"][n]["activated_at"] or 0, n), reverse=True)
    kept = {target, *complete[: max(keep - 1, 0)]}
    if serving:
        kept.add(serving)
    return sorted(n for n in state["envs"] if n not in kept)


# -- operations -----------------------------------------------------------------------------


def _q(text: str) -> str:
    return shlex.quote(text)


def _env_dir(engine_root: str, name: str) -> str:
    return f"{engine_root}/envs/{name}"


def _state(engine_root: str) -> EngineHost:
    state: EngineHost | None = host.get_fact(EngineState, engine_root=engine_root)
    # None when the connector could not answer (pyinfra's @fake connector in `make demo`):
    # plan as for a host with no engine yet.
    return state or {"current": None, "envs": {}, "uv": None}


def _complete(state: Mapping[str, Any], name: str) -> bool:
    env = state["envs"].get(name)
    return bool(env and env["complete"])


@operation(is_idempotent=False)
def require_wheels(wheelhouse: str, requirements: list[str]) -> Any:
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


def _fail(state: Any, host: Any, message: str) -> bool:
    logger.error(f"{host.print_prefix}{message}")
    return False


@operation()
def sync_wheelhouse(src: str, dest: str) -> Any:
    """
    Copy the controller's wheels to the host: only files missing there or of another size
    (wheels are immutable by name, so a different size means a cut upload). Each file is
    uploaded under a temporary name and renamed, so a cut transfer never looks complete.

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
        partial = f"{dest}/.partial/{file_name}"
        yield FileUploadCommand(os.path.join(src, file_name), partial)
        yield StringCommand("mv", "-f", _q(partial), _q(f"{dest}/{file_name}"))


def _local_wheels(directory: str) -> list[str]:
    # os.* rather than pathlib: pyinfra-testing fakes local files through os and os.path.
    return sorted(n for n in os.listdir(directory) if n.endswith(".whl"))


@operation()
def bootstrap_uv(engine_root: str, version: str) -> Any:
    """
    Install uv (exactly `version`) under ENGINE_ROOT/tools with the system Python's venv and
    pip, which read ENGINE_ROOT/pip.conf (the main index, or the wheelhouse with no index).

    + engine_root: the engine root on the host
    + version: the uv release
    """
    found = _state(engine_root)["uv"]
    if found == version:
        host.noop(f"uv {version} is installed")
        return
    tools = f"{engine_root}/tools"
    yield (
        f"rm -rf {_q(tools)} && python3 -m venv {_q(tools)} && "
        f"PIP_CONFIG_FILE={_q(engine_root + '/pip.conf')} {_q(tools + '/bin/pip')} install "
        f"--disable-pip-version-check --no-input --quiet {_q('uv==' + version)}"
    )


@operation()
def build_env(engine_root: str, env_name: str, requirements: list[str], python: str) -> Any:
    """
    Create ENGINE_ROOT/envs/ENV_NAME and install the pinned set into it with uv; a partial
    environment of the same name (an earlier run cut short) is removed first.

    + engine_root: the engine root on the host
    + env_name: the environment's name (release-lane-hash)
    + requirements: the exact pins, lane tags included
    + python: the Python specifier the release supports (system Python preferred; uv never
      downloads one)
    """
    state = _state(engine_root)
    env = _env_dir(engine_root, env_name)
    if _complete(state, env_name):
        host.noop(f"{env_name} is installed")
        return
    uv = f"{engine_root}/tools/bin/uv"
    common = (
        f"--config-file {_q(engine_root + '/uv.toml')} --cache-dir {_q(engine_root + '/cache')}"
    )
    if env_name in state["envs"]:
        yield f"rm -rf {_q(env)}"
    yield (
        f"{_q(uv)} venv {common} --no-progress --no-python-downloads --python-preference system "
        f"--python {_q(python)} {_q(env)}"
    )
    yield (
        f"{_q(uv)} pip install {common} --no-progress --python {_q(env + '/bin/python')} "
        + " ".join(_q(r) for r in requirements)
    )


def _verify(state: Any, host: Any, env: str, wanted: dict[str, Any]) -> bool:
    spec = EngineSpec.from_json(wanted)
    status, output = host.run_shell_command(
        StringCommand(_q(f"{env}/bin/python"), "-c", _q(PROBE_SCRIPT))
    )
    probe = parse_probe(output.stdout + "\n" + output.stderr)
    problems = evaluate(probe, spec)
    if not status and not problems:
        problems = [f"the probe failed: {output.stderr.strip()[-500:]}"]
    if problems:
        logger.error(
            f"{host.print_prefix}engine {spec.name} failed its checks; `current` is unchanged:"
            + "".join(f"\n    {p}" for p in problems)
        )
        return False
    logger.info(f"{host.print_prefix}engine {spec.name} passed its checks")
    return True


@operation()
def verify_env(engine_root: str, spec: EngineSpec) -> Any:
    """
    Check the new environment before anything points at it: sglang is the pin, torch is the
    lane's CUDA build, sm_XXX is compiled in when GPUs are visible, the launch module imports.
    Then write its marker: from here on it is complete.

    + engine_root: the engine root on the host
    + spec: what the environment must hold
    """
    if _complete(_state(engine_root), spec.name):
        host.noop(f"{spec.name} passed its checks when it was installed")
        return
    env = _env_dir(engine_root, spec.name)
    yield FunctionCommand(_verify, (env, spec.to_json()), {})
    marker = json.dumps(spec.marker(), sort_keys=True)
    yield (
        f"printf '%s\\n' {_q(marker)} > {_q(env + '/' + MARKER + '.tmp')} && "
        f"mv -f {_q(env + '/' + MARKER + '.tmp')} {_q(env + '/' + MARKER)}"
    )


@operation()
def switch(engine_root: str, env_name: str, state: Mapping[str, Any] | None = None) -> Any:
    """
    Point ENGINE_ROOT/current at envs/ENV_NAME atomically (a new link renamed over the old one:
    a reader sees the old or the new environment, never none).

    + engine_root: the engine root on the host
    + env_name: the environment to make current
    + state: the EngineState fact as the step read it (nothing before this operation moves
      `current`); read here when omitted
    """
    state = _state(engine_root) if state is None else cast(EngineHost, state)
    if state["current"] == env_name:
        host.noop(f"current is {env_name}")
        return
    tmp = f"{engine_root}/.current.tmp"
    yield (
        f"ln -sfn {_q('envs/' + env_name)} {_q(tmp)} && "
        f"mv -T {_q(tmp)} {_q(engine_root + '/current')} && "
        f"touch {_q(_env_dir(engine_root, env_name) + '/' + MARKER)}"
    )


@operation()
def prune(
    engine_root: str,
    env_name: str,
    keep: int,
    serving: str | None = None,
    state: Mapping[str, Any] | None = None,
) -> Any:
    """
    Remove partial environments and complete ones beyond the `keep` most recently activated.

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
    yield "rm -rf " + " ".join(_q(_env_dir(engine_root, n)) for n in doomed)


# -- the step -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineStep:
    """What later steps need: where the engine is, and whether `current` moved in this run."""

    spec: EngineSpec
    path: str
    switched: OperationMeta

    def current_changed(self) -> bool:
        """Pass as `_if=engine.current_changed` to restart servers only after a switch."""
        return bool(self.switched.did_change())


@deploy("Engine: the pinned SGLang for the host's CUDA lane")
def _engine_deploy(report: HostReport) -> EngineStep:
    s = report.settings
    spec = engine_spec(s, kbmod.load())
    root = s.engine_root
    state = _state(root)
    # A converged host stops at this one fact: the target is complete and current.
    if not _complete(state, spec.name):
        _install(s, spec)
    # The fact read above, passed on: read again, it would cost a round trip per operation
    # and one more for `switched.will_change`, which the serve step asks.
    switched = switch(
        name=f"Engine: current -> {spec.name}", engine_root=root, env_name=spec.name, state=state
    )
    prune(
        name="Engine: prune old environments",
        engine_root=root,
        env_name=spec.name,
        keep=s.engine_keep,
        serving=state["current"],
        state=state,
    )
    return EngineStep(spec, f"{root}/current", switched)


# @deploy types every call as returning OperationMeta; this step returns an EngineStep.
install_engine = cast(Callable[[HostReport], EngineStep], _engine_deploy)


def _install(s: Settings, spec: EngineSpec) -> None:
    root = s.engine_root
    wheelhouse_dir = f"{root}/wheelhouse" if s.wheelhouse else None
    indexes = None if s.wheelhouse else lane_indexes(s, s.cuda_lane)
    if s.wheelhouse:
        require_wheels(
            name="Engine: the wheelhouse holds every pinned wheel",
            wheelhouse=s.wheelhouse,
            requirements=[*spec.requirements, f"uv=={s.uv_version}"],
        )
    files.directory(name="Engine: directories", path=f"{root}/envs", mode="755")
    if s.wheelhouse and wheelhouse_dir:
        sync_wheelhouse(name="Engine: sync the wheelhouse", src=s.wheelhouse, dest=wheelhouse_dir)
    else:
        assert indexes is not None
        logger.debug(
            f"engine indexes: torch {redact(indexes.torch)}, kernel {redact(indexes.kernel)}, "
            f"main {redact(indexes.main)}"
        )
    # Root-only: index URLs may carry credentials; they never appear on a command line.
    for file_name, text in (
        ("uv.toml", uv_config(indexes, wheelhouse_dir)),
        ("pip.conf", pip_config(indexes, wheelhouse_dir)),
    ):
        files.put(
            name=f"Engine: {file_name}",
            src=StringIO(text),
            dest=f"{root}/{file_name}",
            mode="600",
        )
    bootstrap_uv(name=f"Engine: uv {s.uv_version}", engine_root=root, version=s.uv_version)
    build_env(
        name=f"Engine: install {spec.name}",
        engine_root=root,
        env_name=spec.name,
        requirements=list(spec.requirements),
        python=spec.python,
    )
    verify_env(name=f"Engine: check {spec.name}", engine_root=root, spec=spec)
