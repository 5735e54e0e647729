"""Roots in places another user can shape: every directory root writes or runs under, and every
component above it, is root's alone, read on the host by the real HostResources command (lstat,
component by component, and again along where a link resolves), or preflight refuses the host
before any change, naming the path. The attack: a local user makes (or is given) a directory on
the way to engine_root, where the EngineState fact would run ENGINE_ROOT/tools/bin/uv as root."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from operations import kb
from operations.facts.host import HostResources, Resources, parse_resources
from operations.plan.preflight import check, root_paths, unsafe_roots
from operations.settings import Settings
from tests.unit.builders import QWEN36, gpu_facts, make_settings

NOBODY = 65534
pytestmark = [
    pytest.mark.integration,  # runs the facts' shell commands
    pytest.mark.skipif(os.geteuid() != 0, reason="plants directories owned by others"),
]


def host_resources(settings: Settings) -> Resources:
    """What the fact reads on this machine, through its real command."""
    roots = [path for _, path in root_paths(settings)]
    command = HostResources().command(settings.model_stage_dir, settings.engine_root, roots)
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    return parse_resources(out.stdout.splitlines())


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned 0755 directory whose every parent is root's alone (/run is; /tmp is not)."""
    path = Path(tempfile.mkdtemp(prefix="sglang-roots-", dir="/run"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def refusals(settings: Settings, resources: Resources) -> list[str]:
    return [
        f"{key}: {component}: {why}" for key, _, component, why in unsafe_roots(settings, resources)
    ]


def with_root(base: Path, engine_root: Path) -> Settings:
    # Past the settings check on purpose: the host may differ from what a path reads as.
    return dataclasses.replace(make_settings(), engine_root=str(engine_root))


def test_a_root_chain_only_root_writes_passes(base: Path) -> None:
    settings = with_root(base, base / "opt" / "sglang")
    (base / "opt").mkdir(mode=0o755)
    resources = host_resources(settings)
    assert resources.components[str(base / "opt")].uid == 0
    assert refusals(settings, resources) == []


def test_a_directory_another_user_made_on_the_way_is_refused(base: Path) -> None:
    planted = base / "shared"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    settings = with_root(base, planted / "sglang")
    (line,) = refusals(settings, host_resources(settings))
    assert line == f"engine_root: {planted}: owned by uid {NOBODY}, not root", line


def test_preflight_refuses_the_host_naming_the_path(base: Path) -> None:
    planted = base / "shared"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    settings = with_root(base, planted / "sglang")
    fs = check(settings, kb.load(), gpu_facts("rtx-pro-6000-x8"), host_resources(settings), QWEN36)
    (failure,) = [f for f in fs if f.check == "root-only paths"]
    assert f"engine_root {planted / 'sglang'} and every directory" in failure.expected, failure
    assert failure.found == f"{planted}: owned by uid {NOBODY}, not root", failure
    assert f"chown root:root {planted}" in failure.fix and "set engine_root" in failure.fix


def test_a_world_writable_directory_is_refused_even_if_roots(base: Path) -> None:
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)  # sticky like /tmp: others still make ENGINE_ROOT first
    settings = with_root(base, open_dir / "sglang")
    (line,) = refusals(settings, host_resources(settings))
    assert f"{open_dir}: writable by every user (mode 1777)" in line, line


def test_a_group_writable_directory_of_another_group_is_refused(base: Path) -> None:
    group_dir = base / "team"
    group_dir.mkdir()
    os.chown(group_dir, 0, NOBODY)
    group_dir.chmod(0o775)
    settings = with_root(base, group_dir / "sglang")
    (line,) = refusals(settings, host_resources(settings))
    assert f"{group_dir}: writable by group {NOBODY}" in line, line


def test_a_root_owned_link_to_a_user_directory_is_followed_and_refused(base: Path) -> None:
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (base / "link").symlink_to(theirs)
    settings = with_root(base, base / "link" / "sglang")
    resources = host_resources(settings)
    assert resources.components[str(base / "link")].is_link
    (line,) = refusals(settings, resources)
    assert f"{theirs}: owned by uid {NOBODY}" in line, line


def test_under_tmp_the_host_check_refuses_what_the_settings_check_would(tmp_path: Path) -> None:
    settings = with_root(tmp_path, tmp_path / "sglang")
    found = unsafe_roots(settings, host_resources(settings))
    assert (
        "engine_root",
        str(tmp_path / "sglang"),
        "/tmp",
        "writable by every user (mode 1777)",
    ) in found


def test_the_stage_dir_itself_may_be_sticky_like_dev_shm(base: Path) -> None:
    stage = base / "shm"
    stage.mkdir()
    stage.chmod(0o1777)
    settings = dataclasses.replace(make_settings(), model_stage_dir=str(stage))
    assert refusals(settings, host_resources(settings)) == []
    stage.chmod(0o777)  # not sticky: another user could rename the models tree away
    (line,) = refusals(settings, host_resources(settings))
    assert f"{stage}: writable by every user (mode 777)" in line, line
