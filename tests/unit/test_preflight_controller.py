"""Preflight's first checks: what the controller must have for the settings (rsync, and ssh for
an SSH host, found on its PATH by runtime/gather.py), the model source where model_source says
(a missing controller directory is missing ON THE CONTROLLER), a source whose scan refuses a
link named first with no capacity judged on a guessed size, and every fix naming the machine
where it is made."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from operations import kb
from operations.facts.gpu import GpuAccess, NodeAccess
from operations.facts.host import Model, PathStat, Resources, parse_model, parse_resources
from operations.plan.preflight import check
from operations.plan.preflight_source import ControllerTools
from operations.programs.stage_manifest import describe
from operations.runtime.gather import controller_tools
from operations.simulated import ct200 as simulated_ct200
from tests.unit.builders import QWEN36, gpu_facts, make_settings

CT200 = parse_resources(simulated_ct200.captured("host-resources.txt"))
GIB = 1024**3
SOURCE = "controller:/srv/models/Qwen3.6-27B"
# Where each fix is made: every preflight fix names one of these.
MACHINES = ("on the controller", "in the container", "on the Proxmox node", "on the target")


def failures(
    scenario: str = "rtx-pro-6000-x8",
    resources: Resources = CT200,
    model: Model = QWEN36,
    tools: ControllerTools | None = None,
    access: GpuAccess | None = None,
    **settings: Any,
) -> list[Any]:
    s = make_settings(**settings)
    return check(s, kb.load(), gpu_facts(scenario), resources, model, access, tools)


def test_a_controller_source_needs_rsync_and_ssh_on_the_controller() -> None:
    bare = ControllerTools(rsync=None, ssh=None, connector="ssh")
    found = failures(tools=bare, model_source=SOURCE)
    assert [(f.check, f.found) for f in found] == [
        ("controller tools", "no rsync command on the controller"),
        ("controller tools", "no ssh command on the controller"),
    ]
    assert found[0].fix.startswith("on the controller: apt-get install rsync")
    assert "openssh-client" in found[1].fix and "over ssh" in found[0].expected


def test_what_the_controller_needs_follows_the_settings_and_the_connector() -> None:
    # @local runs rsync here: no ssh; @fake (the demo) runs none; a target source sends nothing.
    local = ControllerTools(rsync=None, ssh=None, connector="local")
    assert [f.found for f in failures(tools=local, model_source=SOURCE)] == [
        "no rsync command on the controller"
    ]
    assert failures(tools=ControllerTools(connector="other"), model_source=SOURCE) == []
    assert failures(tools=ControllerTools(connector="ssh")) == []
    ready = ControllerTools("/usr/bin/rsync", "/usr/bin/ssh", "ssh")
    assert failures(tools=ready, model_source=SOURCE) == []


def test_the_receiving_rsync_is_checked_on_the_target() -> None:
    ready = ControllerTools("/usr/bin/rsync", "/usr/bin/ssh", "ssh")
    no_rsync = dataclasses.replace(CT200, rsync=False)
    (f,) = failures(resources=no_rsync, tools=ready, model_source=SOURCE)
    assert f.check == "target tools" and f.fix.startswith("in the container: apt-get install rsync")
    assert parse_resources(["rsync=0"]).rsync is False
    assert parse_resources(["rsync=1"]).rsync is True and parse_resources([]).rsync is None


def _executable(path: Path) -> None:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_gather_reads_the_controllers_path_and_the_hosts_connector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = Inventory((["ct200.example", "@local"], {}))
    State(inventory, Config())
    ssh_host, local_host = inventory.get_host("ct200.example"), inventory.get_host("@local")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert controller_tools(ssh_host) == ControllerTools(None, None, "ssh")
    _executable(tmp_path / "rsync")
    found = controller_tools(local_host)
    assert found == ControllerTools(str(tmp_path / "rsync"), None, "local")


def test_a_missing_controller_directory_is_missing_on_the_controller() -> None:
    (f,) = failures(model=Model(exists=False), model_source="controller:/nonexistent/dir")
    assert f.check == "model source" and f.found == "no such directory on the controller"
    assert "/nonexistent/dir on the controller" in f.expected
    assert f.fix.startswith("on the controller: copy the model directory to /nonexistent/dir")
    assert "mount" not in f.fix


def test_a_missing_target_directory_is_mounted_in_the_container() -> None:
    (f,) = failures(model=Model(exists=False))
    assert f.found == "no such directory on the target"
    assert f.fix.startswith("in the container: mount the weights at /mnt/models/Qwen3.6-27B")


def test_a_link_the_scan_refuses_is_the_first_failure_and_no_size_is_guessed(
    tmp_path: Path,
) -> None:
    """The staging copy's own describe (what the ModelSource fact runs) over a source whose
    tokenizer.json leaves it: the link is named first; the small /dev/shm and memory limit
    that the knowledge base's 50 GiB would fail are not judged on that guess."""
    source = tmp_path / "Qwen3.6-27B"
    source.mkdir()
    (source / "config.json").write_text('{"architectures": ["Qwen3_5ForConditionalGeneration"]}')
    (source / "model.safetensors").write_bytes(b"\0" * 1024)
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    os.symlink(outside, source / "tokenizer.json")
    model = parse_model(describe(str(source)))
    assert model.size_bytes is None and model.scan_error is not None
    assert str(source / "tokenizer.json") in model.scan_error

    small = dataclasses.replace(
        CT200, stage_total_bytes=int(2.4 * GIB), cgroup_limit_bytes=int(23.5 * GIB)
    )
    found = failures("no-driver", resources=small, model=model, model_source=str(source))
    assert found[0].check == "model source" and found[0].found == model.scan_error
    assert found[0].fix.startswith("on the target: replace the link")
    checks = [f.check for f in found]
    assert "/dev/shm size" not in checks and "container memory" not in checks, checks
    # The same host with a readable source of the knowledge base's size is refused for both.
    sized = [f.check for f in failures(resources=small, model=QWEN36)]
    assert "/dev/shm size" in sized and "container memory" in sized


def _denied_access() -> GpuAccess:
    node = NodeAccess("/dev/nvidia0", 0, 0, 0o660, "EACCES")
    return GpuAccess(user_ids=(999, 999, ()), nodes={"/dev/nvidia0": node}, probe_rc=226)


def every_failure() -> list[Any]:
    """One of each preflight failure this module can make."""
    unsafe = dataclasses.replace(
        CT200,
        glibc="2.31",
        systemd=None,
        rocm=True,
        engine_free_bytes=2 * GIB,
        python="3.9.2",
        stage_total_bytes=GIB,
        cgroup_limit_bytes=GIB,
        device_nodes=[],
        rsync=False,
        components={"/opt": PathStat(1000, 1000, 0o755, "directory")},
    )
    bare = ControllerTools(None, None, "ssh")
    found = [
        *failures("version-mismatch"),
        *failures("no-driver"),
        *failures("cuda-na"),
        *failures("gb10"),
        *failures(resources=unsafe, tools=bare, access=_denied_access(), model_source=SOURCE),
        *failures(model=Model(exists=False), model_source=SOURCE),
        *failures(model=Model(exists=False)),
        *failures(model=Model(True, 10, config_error="no readable config.json")),
        *failures(model=Model(True, None, scan_error="model source: x is a link that leaves")),
    ]
    return found


def test_every_fix_names_the_machine_where_it_is_made() -> None:
    found = every_failure()
    checks = {f.check for f in found}
    assert len(checks) >= 18, sorted(checks)
    for f in found:
        assert any(machine in f.fix for machine in MACHINES), (f.check, f.fix)


def test_the_scan_names_the_tokenizer_files_the_client_would_load(tmp_path: Path) -> None:
    """The staging copy's own describe over a real directory: the tokenizer files at its top
    (programs/tokenizer_files.py) reach the Model; a shard named like one deeper down does not
    count (the client loads from the top)."""
    source = tmp_path / "model"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text('{"architectures": ["Qwen3_5ForConditionalGeneration"]}')
    (source / "sub" / "tokenizer.json").write_text("{}")
    assert parse_model(describe(str(source))).tokenizer == ()
    (source / "tokenizer_config.json").write_text("{}")
    (source / "vocab.json").write_text("{}")
    assert parse_model(describe(str(source))).tokenizer == ("tokenizer_config.json",)
