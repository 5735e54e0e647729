"""Preflight's first checks, of what lies outside the host (operations/plan/preflight.py runs
them first): the model source where model_source says (a directory, every link of it one the
staging copy's scan follows) and what the controller must have for the settings (rsync, ssh).
Pure: runtime/gather.py reads the controller (`ControllerTools`), these decide. Every fix names
the machine where it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from operations.facts.host import Model, Resources
from operations.settings import Settings


@dataclass(frozen=True)
class Failure:
    check: str
    expected: str
    found: str
    fix: str


Connector = Literal["ssh", "local", "other"]


@dataclass(frozen=True)
class ControllerTools:
    """What the controller offers the deploy, read there by runtime/gather.py: the commands
    on its PATH (None: not on it) and how the host is reached (pyinfra's connector: "ssh"
    sends rsync over `ssh`, "local" runs it here, "other" such as @fake runs none)."""

    rsync: str | None = None
    ssh: str | None = None
    connector: Connector = "other"


# How each controller tool is installed, by the controller's kind of system.
INSTALL = {
    "rsync": "apt-get install rsync (Debian, Ubuntu), dnf install rsync (Fedora, RHEL), "
    "brew install rsync (macOS)",
    "ssh": "apt-get install openssh-client (Debian, Ubuntu), dnf install openssh-clients "
    "(Fedora, RHEL); macOS has it",
}


def source_failures(s: Settings, model: Model) -> list[Failure]:
    """The model source is a directory where model_source says, and the staging copy's scan
    reads all of it: a link it refuses is named, first (the size is unknown until then)."""
    source = s.source
    on_controller = source.kind == "controller"
    where = source.controller_dir if on_controller else source.target_dir
    on = "the controller" if on_controller else "the target"
    if source.kind == "hf" and not model.exists:
        return []  # downloaded by the model step; its size comes from the knowledge base
    if not model.exists:
        fix = (
            f"on the controller: copy the model directory to {where} (config.json and its "
            "shards), or set model_source (inventory or group_data) to where it is"
            if on_controller
            else f"in the container: mount the weights at {where} (on the Proxmox node: "
            "pct set CTID --mpN /host/dir,mp=" + f"{where}), or set model_source"
        )
        expected = f"a model directory at {where} on {on} (model_source {s.model_source})"
        return [Failure("model source", expected, f"no such directory on {on}", fix)]
    if model.scan_error is None:
        return []
    return [
        Failure(
            "model source",
            f"every file of {where} on {on} readable by the staging copy's scan, each link "
            "resolving to a regular file inside the source (model_source "
            f"{s.model_source}); its size, and so every capacity check, waits for it",
            model.scan_error,
            f"on {on}: replace the link with the file it points to (cp --remove-destination "
            "TARGET LINK), or point model_source at a directory without it",
        )
    ]


def controller_failures(
    s: Settings, tools: ControllerTools | None, resources: Resources
) -> list[Failure]:
    """What the deploy runs on the controller for these settings: a controller source is sent
    with rsync (over ssh for an SSH host); the host's end of rsync runs on the target."""
    if tools is None or s.source.kind != "controller" or tools.connector == "other":
        return []
    need = ["rsync", "ssh"] if tools.connector == "ssh" else ["rsync"]
    missing = [tool for tool in need if getattr(tools, tool) is None]
    failures = [
        Failure(
            "controller tools",
            f"{tool} on the controller's PATH (model_source {s.model_source} is sent to the "
            f"target with rsync{' over ssh' if tools.connector == 'ssh' else ''})",
            f"no {tool} command on the controller",
            f"on the controller: {INSTALL[tool]}",
        )
        for tool in missing
    ]
    if resources.rsync is False:
        failures.append(
            Failure(
                "target tools",
                f"rsync on the target (the receiving end of model_source {s.model_source})",
                "no rsync command on the target",
                f"in the container: {INSTALL['rsync']}",
            )
        )
    return failures
