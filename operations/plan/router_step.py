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


@dataclass(frozen=True)
class RouterOrder:
    """Whether the router's restart and the control-plane key come before the ranks roll
    (`first`), what the plan says of it, and why the run cannot keep both promises (`refused`)."""

    first: bool
    said: str = ""
    refused: str = ""


def router_order(
    router_running: bool | None, moves: bool, key_changes: bool, api_key_changes: bool
) -> RouterOrder:
    """Before or after the ranks: every drain must speak the API, and send the control-plane
    key, of the router that is running when it drains.

    - The router moves to another release or package (`moves`: the router's host has another
      release's environment), or its control-plane key changes (`key_changes`): the router
      restarts FIRST, so that the ranks then roll through the router this run leaves (the drains
      speak the new router's API with the new key; sglang-router 0.3.2 answers smg's settle
      update 405). The key is written on every host behind it before its ranks roll.
    - The ranks' API key changes (`api_key_changes`: the key file's text, or no key any more):
      the router restarts LAST, as smg holds that key for the ranks it starts with
      (render/units.router_unit) and the old ranks answer a new key 401; a rolled rank is
      re-added with its own key (drain.py). A move in the same run is refused: it needs the
      router first and the key change needs it last.
    - A router that is not running now (a first deploy: smg is ready only once a rank is)
      starts last.

    router_running: the router unit is active on this host (None: the router runs on another
    host; its hosts decide the key's place alike: first when the key changes, unless the API
    key changes too)."""
    if api_key_changes:
        if moves:
            return RouterOrder(
                False,
                refused="the router moves to another release in the same run as the ranks' "
                "API key changes (api_key_file): the drains need the new router before the "
                "ranks roll, and it would refuse the old ranks with the new key; deploy the "
                "move first with the API key as it was, then the new key",
            )
        return RouterOrder(False)
    if router_running is False or not (moves or key_changes):
        return RouterOrder(False)
    what = "moves" if moves else "takes its new control-plane key"
    return RouterOrder(
        True,
        said=f"the router {what} before the ranks roll, so that every drain speaks the API "
        "of the router then running, with its key",
    )


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
