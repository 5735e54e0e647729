"""End-to-end testbed: Debian 12 systemd containers reachable over SSH on 127.0.0.N.

tarball = ensure_testbed()          # host packages + cached root file system
bed = Testbed(tarball)
a, b = bed.boot(ContainerSpec(), ContainerSpec(scenario="h200-x8"))
rc, out, err = a.ssh_run("nvidia-smi --query-gpu=name --format=csv,noheader")
inv = inventory_file(tmp_path, [a, b])
bed.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tests.testbed.container import (
    FIXTURES_DIR,
    Container,
    ContainerSpec,
    Testbed,
    scenario_devices,
)
from tests.testbed.inventory import inventory_file
from tests.testbed.rootfs import (
    PACKAGES,
    TestbedSetupError,
    ensure_host_packages,
    ensure_rootfs,
)


class BootContainers(Protocol):
    """The pytest factory fixture: boots containers and stops them after the test."""

    def __call__(self, *specs: ContainerSpec, timeout: float = ...) -> list[Container]: ...


def ensure_testbed() -> Path:
    """Install what the host lacks and return the root file system tarball."""
    ensure_host_packages()
    return ensure_rootfs()


__all__ = [
    "FIXTURES_DIR",
    "PACKAGES",
    "BootContainers",
    "Container",
    "ContainerSpec",
    "Testbed",
    "TestbedSetupError",
    "ensure_host_packages",
    "ensure_rootfs",
    "ensure_testbed",
    "inventory_file",
    "scenario_devices",
]
