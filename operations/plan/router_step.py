"""The router's part of the serve step, as the plan decides it: its environment, the files it
writes, whether it (re)starts, and what its clients see when it does (a move between router
releases or packages names both). Built by serve_plan; carried out by steps/serve.py."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from operations.plan.planned_files import PlannedFile
from operations.plan.vocabulary import Decision, RouterStepJson


@dataclass(frozen=True)
class RouterStep:
    """What the serve step does for the router on the host that runs it: its environment
    (installed when the marker is missing), the files it writes, whether it (re)starts."""

    version: str
    # The router's package (smg, sglang-router) and the module its install must import.
    package: str
    launcher_module: str
    env_dir: str
    engine_root: str
    # Router environments of other releases on this host, removed once this one serves (the
    # move from sglang-router 0.3.2 to smg, or back): the ServingState fact's `router_envs`.
    retired: list[str]
    # The marker is missing: the environment is built afresh (steps/serve.py's install).
    install: bool
    # The pinned requirements the install writes into the environment and installs from.
    requirements: PlannedFile
    # The package sources (a secret: the index URL may carry credentials), before an install.
    uv_config: PlannedFile | None
    launcher: PlannedFile
    unit: PlannedFile
    restart: bool
    health_url: str

    @property
    def files(self) -> list[PlannedFile]:
        """In the order the step writes them (the uv config and requirements: installs only)."""
        first = [self.uv_config, self.requirements] if self.install else []
        return [f for f in (*first, self.launcher, self.unit) if f is not None]

    def to_json(self) -> RouterStepJson:
        return {
            "version": self.version,
            "package": self.package,
            "env_dir": self.env_dir,
            "retired": self.retired,
            "install": self.install,
            "restart": self.restart,
            "files": [f.to_json() for f in self.files],
        }


# How long clients of the router's port are refused while the router restarts (its old
# process stops, the new one starts and lists the ranks ready): measured under steady client
# load by tests/e2e/test_router_move.py (the move from sglang-router 0.3.2 to smg 1.13.0 on the
# 2-core testbed, 8 ranks: 0.26, 0.36 and 0.82 s), with room for a loaded host.
ROUTER_RESTART_WINDOW_S = 2


def router_change(step: RouterStep) -> Decision:
    """What a router restart does and what its clients see (a move between releases or
    packages names both)."""
    new = f"{step.package} {step.version}"
    olds = [posixpath.basename(env) for env in step.retired]
    said = f"move the router {', '.join(olds)} -> {new}" if olds else f"restart the router ({new})"
    return Decision(
        "router move" if olds else "router restart",
        f"{said}: clients of its port are refused for about {ROUTER_RESTART_WINDOW_S}s",
        "the router is one process on one port: the old one stops, the new one starts and reads "
        "every rank's /health before it routes (requests in flight on the ranks finish; a client "
        "that retries a refused connection after the window is served)"
        + (
            f"; the old environment{'s' if len(olds) > 1 else ''} ({', '.join(step.retired)}) "
            f"go{'' if len(olds) > 1 else 'es'} once {new} answers /health; to go back, set "
            f"router.version to the old release ({', '.join(o.rpartition('-')[2] for o in olds)})"
            if olds
            else ""
        ),
    )
