"""The engine check on the GPUs, before anything points at a new environment (step 2 of the
deploy, operations/steps/engine.py): run as a rank runs (the service user, in a transient unit
with the rank unit's sandbox), judged on the controller (operations/plan/engine_probe.py), and
only then the environment's marker written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from shlex import quote as _q

from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import StringCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from operations.layout import EngineTree, env_python
from operations.plan.engine_probe import Driver, evaluate, parse_probe
from operations.plan.engine_spec import EngineSpec, EngineSpecJson
from operations.plan.preflight import NESTING_FIX
from operations.render import units
from operations.render.host_scripts import script_text
from operations.runtime.host_call import Commands, HostCall, run
from operations.runtime.host_lines import host_text

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
        said = f"engine {spec.name} failed its check on the GPUs; `current` and the serving "
        said += "ranks are unchanged:" + "".join(f"\n    {p}" for p in problems)
        logger.error(host_text(host, said))
        return False
    where = f" as {user}, in a rank's sandbox" if user else ""
    passed = f"engine {spec.name} passed its check on {spec.gpu_count} GPU(s){where}"
    logger.info(host_text(host, passed))
    return True


@operation()
def verify_env(
    engine_root: str,
    spec: EngineSpecJson,
    driver_version: str | None = None,
    driver_cuda: str | None = None,
    complete: bool = False,
    user: str | None = None,
    device_nodes: list[str] | None = None,
    gpus: list[str] | None = None,
) -> Commands:
    """
    The engine check, before anything points at the new environment, as a rank runs (the
    service user, in a transient unit with the rank unit's sandbox, every GPU allowed): the
    installed builds are the pins; torch is the lane's CUDA build, sees every GPU with the
    expected capability and runs a small CUDA operation on each; the kernel, flashinfer,
    torchvision, torchaudio and the launch module import. Then write its marker: from here on
    it is complete.

    + engine_root: the engine root on the host
    + spec: what the environment must hold (the plan's EngineSpec, as its to_json(): plain
      values, as every operation gets)
    + driver_version/driver_cuda: the host's driver as preflight's nvidia-smi read it, for the
      advice in a failure
    + complete: the environment passed its check when it was installed (the plan's)
    + user: the service user the check runs as (it must exist); None runs it as root, bare
    + device_nodes: the host's NVIDIA nodes (HostResources), for the optional DeviceAllow= lines
    + gpus: the GPUs' names by index (preflight's nvidia-smi): once the check passed, they are
      recorded beside the marker with the driver, the day and the user (layout.ENGINE_PROVEN)
    """
    engine = EngineSpec.from_json(spec)
    if complete:
        host.noop(f"{engine.name} passed its check when it was installed")
        return
    tree = EngineTree(engine_root)
    # A record from an earlier check of this environment goes first: only this check counts.
    yield f"rm -f {_q(tree.env_proven(engine.name))}"
    yield HostCall(
        _verify,
        (tree.env(engine.name), engine.to_json(), [driver_version, driver_cuda], engine_root, user,
         device_nodes),
        {},
    )  # fmt: skip
    marker = json.dumps(engine.marker(), sort_keys=True)
    path = tree.env_marker(engine.name)
    yield (
        f"printf '%s\\n' {_q(marker)} > {_q(path + '.tmp')} && mv -f {_q(path + '.tmp')} {_q(path)}"
    )
    if gpus and driver_version:
        yield proven_command(tree.env_proven(engine.name), gpus, driver_version, user or "root")


def proven_command(path: str, gpus: list[str], driver: str, user: str) -> str:
    """Write the record that the check passed on these GPUs (facts/engine.py's Proven), the day
    the host's clock says (UTC): after the check and the marker, so only a check that passed
    leaves one."""
    rest = json.dumps({"driver": driver, "gpus": gpus, "user": user}, sort_keys=True)
    tmp = _q(path + ".tmp")
    return (
        f'printf \'{{"date": "%s", %s\\n\' "$(date -u +%Y-%m-%d)" {_q(rest[1:])} > {tmp} '
        f"&& mv -f {tmp} {_q(path)}"
    )
