"""The router's part of the serve step: its environment (smg or sglang-router, pinned wheels
with hashes), launcher and unit as the plan's RouterStep has them, and its (re)start,
health-gated. operations/steps/serve.py calls `route` before or after the ranks, as the plan's
RouterOrder says."""

from __future__ import annotations

import shlex

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.operations import server, systemd

from operations import layout
from operations.layout import ROUTER_UNIT
from operations.plan.router_step import RouterStep
from operations.runtime.host_call import Commands
from operations.settings import Settings
from operations.steps.health import wait_healthy
from operations.steps.host_files import new_file, put_planned


@operation()
def router_env(
    engine_root: str,
    env_dir: str,
    package: str,
    version: str,
    module: str,
    install: bool,
    requirements: str,
) -> Commands:
    """
    The router (smg, or sglang-router) in its own environment, with the engine's uv and package
    sources: exactly the pinned wheels, hashes checked (`--require-hashes --only-binary :all:`),
    kept in the environment as requirements.txt. Both packages install an `smg` command: each
    release has its own environment, never another's.

    + engine_root: ENGINE_ROOT (uv and its config live there)
    + env_dir: the router's environment
    + package: smg or sglang-router
    + version: the router release
    + module: its launcher module, which the install must import
    + install: the plan's RouterStep.install (the environment has no complete install)
    + requirements: PACKAGE==VERSION and its dependencies with hashes (operations/kb/pins)
    """
    if not install:
        host.noop(f"{package} {version} is installed")
        return
    tree = layout.EngineTree(engine_root)
    uv = QuoteString(tree.uv)
    common = [
        "--config-file",
        QuoteString(tree.uv_config),
        "--cache-dir",
        QuoteString(tree.cache),
        "--no-progress",
    ]
    env = QuoteString(env_dir)
    python = QuoteString(layout.env_python(env_dir))
    yield StringCommand("rm", "-rf", env)
    yield StringCommand(
        uv,
        "venv",
        *common,
        "--no-python-downloads",
        "--python-preference",
        "system",
        "--python",
        "python3",
        env,
    )
    pinned = layout.env_requirements(env_dir)
    yield from new_file(requirements, pinned)
    yield StringCommand(
        uv,
        "pip",
        "install",
        *common,
        "--python",
        python,
        "--require-hashes",
        "--only-binary",
        ":all:",
        "-r",
        QuoteString(pinned),
    )
    yield StringCommand(
        python,
        "-c",
        QuoteString(f"import {module}"),
        "&&",
        "touch",
        QuoteString(layout.router_marker(env_dir)),
    )


def route(s: Settings, plan: RouterStep) -> None:
    """The router's environment, launcher and unit as the plan's RouterStep has them; a
    (re)start, health-gated, when it says so."""
    if plan.uv_config is not None:
        put_planned(plan.uv_config)
    router_env(
        name=f"Router: install {plan.package} {plan.version}",
        engine_root=plan.engine_root,
        env_dir=plan.env_dir,
        package=plan.package,
        version=plan.version,
        module=plan.launcher_module,
        install=plan.install,
        requirements=plan.requirements.text,
    )
    put_planned(plan.launcher)
    put_planned(plan.unit)
    if plan.restart:
        systemd.daemon_reload(name="Router: reload systemd")
        server.shell(
            name="Router: (re)start",
            commands=[
                f"systemctl enable {ROUTER_UNIT}",
                f"systemctl reset-failed {ROUTER_UNIT} || true",
                f"systemctl restart {ROUTER_UNIT}",
            ],
        )
        wait_healthy(
            name="Router: /health",
            checks=[(ROUTER_UNIT, plan.health_url)],
            timeout_s=s.health_timeout_s,
            service_user=s.service_user,
        )
    if plan.retired:
        # Only once this release serves (a failed start above stops the run first): another
        # release's environment, e.g. sglang-router 0.3.2's after the move to smg.
        server.shell(
            name=f"Router: remove the environments of other releases ({len(plan.retired)})",
            commands=[shlex.join(["rm", "-rf", "--", *plan.retired])],
        )
