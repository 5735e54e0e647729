"""Fixtures for end-to-end tests against systemd containers over SSH (see tests/testbed)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.needs import missing
from tests.testbed import BootContainers, Container, ContainerSpec, Testbed, ensure_testbed
from tests.testbed.container import BOOT_TIMEOUT_S


def _unsupported_reason() -> str | None:
    if sys.platform != "linux":
        return "the e2e testbed needs Linux (systemd-nspawn)"
    if os.geteuid() != 0:
        return "the e2e testbed needs root (apt-get, debootstrap, systemd-nspawn)"
    return None


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Host packages and the cached root file system, ready to boot containers from."""
    reason = _unsupported_reason()
    if reason is not None:
        # CI runs as root on Linux: reaching this there means the CI machine is wrong.
        missing(reason)
    bed = Testbed(ensure_testbed())
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def boot_containers(testbed: Testbed) -> Iterator[BootContainers]:
    """boot_containers(ContainerSpec(...), ...) -> containers, all stopped after the test."""
    mine: list[Container] = []

    def boot(*specs: ContainerSpec, timeout: float = BOOT_TIMEOUT_S) -> list[Container]:
        containers = testbed.boot(*specs, timeout=timeout)
        mine.extend(containers)
        return containers

    yield boot
    for container in mine:
        testbed.destroy(container)
