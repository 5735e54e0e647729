"""The Proxmox side's pure plan (operations/plan/pve_plan.py): facts parsed from the node
fixtures in tests/fixtures/pve and the simulated node's (operations/simulated/captured/pve_node;
see SOURCE.md and README.md there), settings through the real loader."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from operations import kb as kbmod
from operations.facts.pve import (
    CtConfig,
    GuestState,
    NodeUnitState,
    NvidiaDevices,
    parse_ct_config,
    parse_devices,
    parse_module_version,
    parse_pveversion,
)
from operations.plan import preflight
from operations.plan.pve_plan import MIB, PveFacts, PvePlan, plan, summary
from operations.simulated import pve_node
from tests.unit.builders import make_settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pve"
KB = kbmod.load()


def fixture(name: str) -> list[str]:
    """A file of tests/fixtures/pve, or of the simulated node's own captures."""
    path = FIXTURES / name
    if not path.exists():
        path = pve_node.CAPTURED / name
    return path.read_text().splitlines()


def node_devices(gpus: int = 8, caps: bool = False, uvm: bool = True) -> NvidiaDevices:
    nodes = [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl"]
    if uvm:
        nodes += ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if caps:
        nodes += ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    return parse_devices([f"@@node={n}" for n in nodes] + fixture("proc-devices.txt"))


MODPROBE = "/usr/bin/nvidia-modprobe"
BARE = ["arch: amd64", "cores: 16", "hostname: ct200", "memory: 2048", "ostype: debian"]


def facts(
    *,
    pve: str = "pveversion-8.1.txt",
    config: list[str] | None = None,
    kind: str = "ct",
    module: str | None = "565.57.01",
    devices: NvidiaDevices | None = None,
    status: str = "running",
    guest: GuestState | None = None,
    node_unit: NodeUnitState | None = None,
) -> PveFacts:
    lines = [f"@@kind={kind}", *(BARE if config is None else config)]
    return PveFacts(
        versions=parse_pveversion(fixture(pve)),
        module=module,
        devices=devices or node_devices(),
        config=parse_ct_config(lines),
        status=status,
        guest=guest or GuestState(running=True, driver_versions=["565.57.01"]),
        node_unit=node_unit or NodeUnitState(modprobe=MODPROBE),
    )


def planned(f: PveFacts, **settings: Any) -> PvePlan:
    return plan("ct200", make_settings(pve_ctid=200, **settings), KB, f)


def test_module_version_from_sys_then_proc() -> None:
    assert parse_module_version(["@@sys=570.172.08"]) == "570.172.08"
    open_line = fixture("nvidia-version-open-565.txt")[0]
    assert parse_module_version(["@@sys=", open_line]) == "565.57.01"
    assert parse_module_version(["@@sys=", fixture("nvidia-version-515.txt")[0]]) == "515.76"
    assert parse_module_version(["@@sys="]) is None


def test_bare_config_gets_every_gpu_node_memory_and_swap() -> None:
    result = planned(facts())
    assert result.ok, result.errors
    assert result.form == "dev"
    devs = [(k, v) for k, v in result.options if k.startswith("dev")]
    # mode=0666: without it pve-container makes the node 0660 root:root in the container.
    assert devs == [(f"dev{i}", f"/dev/nvidia{i},mode=0666") for i in range(8)] + [
        ("dev8", "/dev/nvidiactl,mode=0666"),
        ("dev9", "/dev/nvidia-uvm,mode=0666"),
        ("dev10", "/dev/nvidia-uvm-tools,mode=0666"),
    ]
    size = preflight.model_bytes(make_settings(), KB, None)
    assert size is not None
    want = math.ceil(preflight.memory_needed(make_settings(), size) / MIB)
    assert ("memory", str(want)) in result.options
    # pve-container's default swap (512 MiB) applies when the key is absent.
    assert ("swap", "0") in result.options
    assert result.restart == "advise"
    assert "pct reboot 200" in summary("ct200", result)


def test_memory_follows_preflight_rule_with_measured_model() -> None:
    guest = GuestState(running=True, driver_versions=["565.57.01"], model_bytes=10 * 1024**3)
    result = planned(facts(guest=guest), dp_size=4, ram_per_rank_gb=2)
    # + 128 MiB: pve-container's memory.high is memory - 128 MiB from 16 GiB up.
    assert ("memory", str(10 * 1024 + 4 * 2 * 1024 + 128)) in result.options


def test_converged_config_changes_nothing() -> None:
    first = planned(facts())
    config = BARE[:3] + [f"{k}: {v}" for k, v in first.options] + BARE[4:]
    config = [c for c in config if not c.startswith("memory: 2048")]
    again = planned(facts(config=config))
    assert again.ok and not again.config_changes and again.restart == ""
    assert "nothing to change" in summary("ct200", again)


def test_more_memory_than_needed_is_kept_and_existing_dev_entries_reused() -> None:
    config = [*BARE[:3], "dev0: path=/dev/nvidia0,mode=0666", "dev3: /dev/tty0"]
    config += ["memory: 999999", "swap: 0"]
    result = planned(facts(config=config))
    assert result.options[0] == ("dev1", "/dev/nvidia1,mode=0666")
    assert ("dev3", "/dev/nvidia2") not in result.options
    assert not [o for o in result.options if o[0] in ("memory", "swap")]


def test_before_pve_container_5_0_7_raw_lines_with_majors_from_proc_devices() -> None:
    result = planned(
        facts(pve="pveversion-7.4.txt", devices=node_devices(gpus=2, caps=True)), gpu_count=2
    )
    assert result.form == "lxc" and not [o for o in result.options if o[0].startswith("dev")]
    # Only the container's own GPUs (195:N) and nvidiactl (195:255): never c 195:* (every GPU).
    assert result.raw_lines[:5] == [
        "lxc.cgroup2.devices.allow: c 195:0 rwm",
        "lxc.cgroup2.devices.allow: c 195:1 rwm",
        "lxc.cgroup2.devices.allow: c 195:255 rwm",
        "lxc.cgroup2.devices.allow: c 510:* rwm",
        "lxc.cgroup2.devices.allow: c 235:* rwm",
    ]
    assert not [ln for ln in result.raw_lines if "195:*" in ln]
    assert "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file" in (
        result.raw_lines
    )
    assert result.raw_lines[-1].startswith("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps")
    # Lines already there (inner spacing aside) are not added twice.
    config = [*BARE, "lxc.cgroup2.devices.allow: c 195:0   rwm"]
    again = planned(facts(pve="pveversion-7.4.txt", config=config), gpu_count=8)
    assert "lxc.cgroup2.devices.allow: c 195:0 rwm" not in again.raw_lines
    assert "lxc.cgroup2.devices.allow: c 195:7 rwm" in again.raw_lines
    wide = planned(
        facts(pve="pveversion-7.4.txt", config=[*config, "lxc.cgroup2.devices.allow: c 195:* rwm"])
    )
    assert any("allows 'c 195:* rwm', every GPU of the node" in n for n in wide.notes), wide.notes
    assert "container: 200 is hostname ct200 on this node" in summary("ct200", wide)


@pytest.mark.parametrize(
    ("change", "settings", "message"),
    [
        ({"kind": "missing"}, {}, "no container 200 on this node"),
        ({"kind": "vm"}, {}, "is a virtual machine"),
        ({"module": None}, {}, "no NVIDIA kernel module loaded"),
        (
            {"devices": node_devices(gpus=4)},
            {},
            "gpu_count = 8 (set in default) but the node has 4",
        ),
        ({"devices": node_devices(uvm=False)}, {}, "no /dev/nvidia-uvm"),
        ({"pve": "pveversion-empty"}, {}, "not a Proxmox VE node"),
    ],
)
def test_bad_input_is_refused(
    change: dict[str, Any], settings: dict[str, Any], message: str, tmp_path: Path
) -> None:
    if change.get("pve") == "pveversion-empty":
        f = facts()
        f = PveFacts(parse_pveversion([]), f.module, f.devices, f.config, f.status, f.guest)
    else:
        f = facts(**change)
    result = planned(f, **settings)
    assert not result.ok
    assert any(message in e for e in result.errors), result.errors
    assert not result.options and not result.raw_lines


def test_no_ctid_is_refused_naming_the_key() -> None:
    result = plan("ct200", make_settings(), KB, facts())
    assert result.errors and "pve_ctid is not set" in result.errors[0]


def test_unknown_model_size_of_a_stopped_container_is_refused() -> None:
    f = facts(status="stopped", guest=GuestState(running=False))
    result = planned(f, model_name="acme/unknown-model")
    assert any("cannot size the container's memory" in e for e in result.errors)


def test_driver_version_is_told_and_installed_only_when_opted_in() -> None:
    old = GuestState(running=True, driver_versions=["570.172.08"])
    told = planned(facts(guest=old))
    assert not told.driver_install
    assert any(
        "needs NVIDIA user space 565.57.01 exactly, it has 570.172.08" in n for n in told.notes
    )
    sha = "ab" * 32
    install = planned(
        facts(guest=old), pve_install_driver=True, pve_driver_hashes={"565.57.01": sha}
    )
    assert install.driver_install and install.driver_sha256 == sha
    assert install.driver_url.endswith("/565.57.01/NVIDIA-Linux-x86_64-565.57.01.run")
    assert any(f"sha256 {sha} (pve_driver_hashes)" in n for n in install.notes)
    # Wrapped at 80 columns: the words are the same, the line breaks fall between them.
    assert f"sha256 {sha}" in " ".join(summary("ct200", install).split())


def test_a_driver_without_a_pinned_sha256_is_not_installed() -> None:
    old = GuestState(running=True, driver_versions=["570.172.08"])
    unpinned = planned(
        facts(guest=old), pve_install_driver=True, pve_driver_hashes={"570.172.08": "cd" * 32}
    )
    assert not unpinned.driver_install and not unpinned.ok
    assert any("has no sha256 for driver 565.57.01" in e for e in unpinned.errors)


def test_restart_only_with_opt_in_and_only_when_running() -> None:
    assert planned(facts(), pve_restart=True).restart == "now"
    stopped = planned(facts(status="stopped", guest=GuestState(running=False)), pve_restart=True)
    assert stopped.restart == ""


def test_ct_config_devices_parse_path_forms() -> None:
    config = CtConfig("ct", [("dev0", "path=/dev/nvidia0,mode=0666"), ("dev7", "/dev/nvidiactl")])
    assert config.devices() == {"dev0": "/dev/nvidia0", "dev7": "/dev/nvidiactl"}


@pytest.mark.integration
def test_a_sparse_model_file_cannot_size_the_nodes_memory(tmp_path: Path) -> None:
    """The attack: a container's model directory holds a sparse file that claims 1 TiB (du -sb
    inside the container said so, and a container's root may fake du). The GuestDriver fact's
    real command, run here with stand-ins for pct and lxc-info (the container's root is this
    machine's /), measures real blocks on the node: the plan sizes memory from what the file
    holds, capped at the node's MemTotal, and shows both."""
    from operations.facts.pve import GuestDriver, parse_guest

    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model-00001.safetensors", "wb") as fh:
        fh.truncate(1024**4)  # 1 TiB apparent, no block written
    (model / "config.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pct").write_text(
        '#!/bin/sh\n[ "$1" = status ] && { echo "status: running"; exit 0; }\n'
        'while [ "$1" != -- ]; do shift; done; shift; exec "$@"\n'
    )
    (bin_dir / "lxc-info").write_text(f"#!/bin/sh\necho {os.getpid()}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    command = GuestDriver().command(200, str(model)).get_raw_value()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, check=True)
    guest = parse_guest(out.stdout.splitlines())
    assert guest.running and guest.node_mem_bytes, out
    assert guest.model_bytes is not None and guest.model_bytes < 1024**2, guest

    result = planned(facts(guest=guest), model_name="org/unknown-model", dp_size=1)
    (memory,) = [int(v) for k, v in result.options if k == "memory"]
    assert memory < guest.node_mem_bytes // MIB, result.options
    note = next(n for n in result.notes if n.startswith("memory:"))
    assert "the node's measure of its real blocks 0.0 GiB" in note, note
    assert "the node's MemTotal 23.5 GiB" in note, note


def test_the_model_size_is_capped_at_the_knowledge_base_and_memtotal() -> None:
    huge = GuestState(running=True, driver_versions=["565.57.01"], model_bytes=2**50)
    capped = planned(facts(guest=huge), dp_size=1, ram_per_rank_gb=1)
    known = KB.models[make_settings().model_name].size_gb
    assert known is not None
    want = math.ceil((int(known * 1e9) + 1024**3) / MIB) + 128
    assert ("memory", str(want)) in capped.options, capped.options
    # An unknown model: capped at the node's MemTotal, which then refuses the ranks on top.
    small_node = GuestState(
        running=True, driver_versions=["565.57.01"], model_bytes=2**50, node_mem_bytes=64 * 2**30
    )
    refused = planned(facts(guest=small_node), model_name="org/unknown-model")
    assert any("more than the node's MemTotal of 65536 MiB" in e for e in refused.errors), refused


def test_existing_nvidia_entries_without_mode_0666_are_rewritten_and_then_left_alone() -> None:
    """Entries an earlier pve.py (or a user) wrote bare: pve-container makes their nodes 0660
    owned by the container's root (src/PVE/LXC.pm create_passthrough_device_node), so they
    are rewritten in place (same devN), uid/gid kept, deny-write dropped."""
    config = [
        *BARE[:3],
        "dev0: /dev/nvidia0",
        "dev1: path=/dev/nvidia1,gid=44,mode=0660",
        "dev2: /dev/nvidia2,deny-write=1,mode=0666",
        "dev3: /dev/nvidia3,mode=0666",
        "dev4: /dev/tty0",
    ]
    result = planned(facts(config=config, devices=node_devices(gpus=4)), gpu_count=4)
    devs = dict(o for o in result.options if o[0].startswith("dev"))
    assert devs["dev0"] == "/dev/nvidia0,mode=0666"
    assert devs["dev1"] == "/dev/nvidia1,gid=44,mode=0666"
    assert devs["dev2"] == "/dev/nvidia2,mode=0666"
    assert "dev3" not in devs and "dev4" not in devs, devs
    assert any("dev0, dev1, dev2 lack mode=0666" in n for n in result.notes), result.notes
    rewritten = [ln for ln in config if ln.split(":")[0] not in devs]
    rewritten += [f"{k}: {v}" for k, v in result.options if k.startswith("dev")]
    again = planned(facts(config=rewritten, devices=node_devices(gpus=4)), gpu_count=4)
    assert not [o for o in again.options if o[0].startswith("dev")], again.options


def test_the_uvm_boot_unit_is_installed_once_and_refused_without_nvidia_modprobe() -> None:
    fresh = planned(facts())
    assert fresh.unit_steps == ["write", "enable", "start"]
    text = fresh.unit_text
    assert f"ExecStart={MODPROBE} -u -c=0\n" in text
    assert "Before=pve-guests.service\n" in text and "Type=oneshot\n" in text
    assert "WantedBy=multi-user.target pve-guests.service\n" in text
    assert "nvidia-uvm-nodes.service on the node" in summary("ct200", fresh)
    digest = hashlib.sha256(text.encode()).hexdigest()
    state = NodeUnitState(sha256=digest, enabled="enabled", active="active", modprobe=MODPROBE)
    assert planned(facts(node_unit=state)).unit_steps == []
    # Edited by hand: written back and re-enabled (its [Install] may differ).
    edited = NodeUnitState(sha256="0" * 64, enabled="enabled", active="active", modprobe=MODPROBE)
    assert planned(facts(node_unit=edited)).unit_steps == ["write", "enable"]
    missing = planned(facts(node_unit=NodeUnitState(modprobe=None)))
    assert not missing.ok and any("no nvidia-modprobe on PATH" in e for e in missing.errors)
    assert not missing.options


def test_a_stale_uvm_major_is_replaced_not_doubled() -> None:
    """After a driver or kernel update nvidia-uvm got another dynamic major: the old line (a
    major no driver holds now) is removed, the new one added; a major another driver holds
    (misc, 10) is the user's and stays."""
    config = [
        *BARE,
        "lxc.cgroup2.devices.allow: c 195:0 rwm",
        "lxc.cgroup2.devices.allow: c 505:* rwm",
        "lxc.cgroup2.devices.allow: c 10:* rwm",
    ]
    result = planned(facts(pve="pveversion-7.4.txt", config=config), gpu_count=1)
    assert result.raw_remove == ["lxc.cgroup2.devices.allow: c 505:* rwm"]
    assert "lxc.cgroup2.devices.allow: c 510:* rwm" in result.raw_lines
    told = summary("ct200", result)
    assert (
        "change: remove from /etc/pve/lxc/200.conf:\n      lxc.cgroup2.devices.allow: c 505:* rwm\n"
        in told
    ), told
    assert all(len(line) <= 80 for line in told.splitlines()), told
    fixed = [ln for ln in config if "505" not in ln] + result.raw_lines
    again = planned(facts(pve="pveversion-7.4.txt", config=fixed), gpu_count=1)
    assert again.raw_remove == [] and again.raw_lines == []


@pytest.mark.parametrize("in_use_mib", [1025, 8 * 1024, 16 * 1024 - 128, 16 * 1024, 60 * 1024])
def test_memory_needed_leaves_pve_containers_memory_high_margin(in_use_mib: int) -> None:
    """preflight.memory_needed is the one rule: pve.py sets it, preflight judges the container
    by it. Its memory.high (Config.pm calculate_memory_constraints) holds what is in use, and
    1 MiB less would not."""
    s = make_settings(dp_size=1, ram_per_rank_gb=0)
    size = in_use_mib * MIB
    need = preflight.memory_needed(s, size)
    mib = math.ceil(need / MIB)
    assert preflight.memory_high(mib * MIB) >= size
    assert preflight.memory_high((mib - 1) * MIB) < size


def test_nesting_only_with_the_setting_and_other_features_kept() -> None:
    config = [*BARE, "features: keyctl=1"]
    told = planned(facts(config=config))
    assert not [o for o in told.options if o[0] == "features"]
    assert any("set pve_nesting = true" in n for n in told.notes), told.notes
    on = planned(facts(config=config), pve_nesting=True)
    assert ("features", "keyctl=1,nesting=1") in on.options
    done = planned(facts(config=[*BARE, "features: keyctl=1,nesting=1"]), pve_nesting=True)
    assert not [o for o in done.options if o[0] == "features"]


def test_ram_per_rank_below_sglangs_host_use_is_warned() -> None:
    low = planned(facts(), ram_per_rank_gb=1)
    assert any("ram_per_rank_gb = 1 (set in" in w for w in low.warnings), low.warnings
    assert "warning: ram_per_rank_gb" in summary("ct200", low)
    assert planned(facts()).warnings == []


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_pve_demo_previews_a_simulated_node_and_refuses_a_real_run() -> None:
    """`make pve-demo`: pve.py's real facts and plan over pyinfra's @fake connector answering as
    CT200's node (operations/simulated/pve_node.py); a run without --dry is refused up front."""
    pyinfra = str(REPO / ".venv" / "bin" / "pyinfra")
    dry = subprocess.run(
        [pyinfra, "inventory/pve_demo.py", "pve.py", "--dry"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out
    # One option a line, a shell command continued with backslashes.
    assert "  change: pct set 200 \\\n      --dev0 /dev/nvidia0,mode=0666 \\\n" in out, out
    assert "      --dev9 /dev/nvidia-uvm,mode=0666 \\\n" in out, out
    assert "      --swap 0\n" in out, out
    assert "write, enable, start nvidia-uvm-nodes.service on the node" in out, out
    assert "Traceback" not in out
    # The node is named as the node: pyinfra's lines and pve.py's.
    assert "[pve1/ct200] Connected" in out and "pve1/ct200: container 200: ready" in out, out
    assert "@fake" not in out, out
    # Every line fits 80 columns: the toolkit's (the plan, wrapped under its labels) and
    # pyinfra's own (its table of detected changes pads its rows with spaces to the longest
    # operation name: ours are at most 40 characters, so a row of one host fits).
    wide = [line for line in out.splitlines() if len(line.rstrip()) > 80]
    assert wide == [], "\n".join(wide)
    memory = out[out.index("  memory: ") :].split("\n  swap: ")[0]
    assert "(" not in memory and ")" not in memory, memory
    real = subprocess.run(
        [pyinfra, "-y", "inventory/pve_demo.py", "pve.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert real.returncode != 0
    assert "simulates a Proxmox node: run it with --dry" in real.stderr, real.stderr
    assert "Traceback" not in real.stdout + real.stderr


def test_an_unreachable_node_is_named_as_the_node(caplog: pytest.LogCaptureFixture) -> None:
    """pyinfra logs "[ct200] Could not connect (...)" (Host.connect) under the inventory name,
    which for pve.py is the container's: the message names the node and what to check."""
    import logging

    from operations.steps.pve import name_the_node_on_connect_errors

    name_the_node_on_connect_errors("ct9", "root@pve9", "PVE_HOST=pve9: check it")
    log = logging.getLogger("pyinfra")
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        log.error("[\x1b[1mct9\x1b[0m] \x1b[31mCould not connect (Errno 111)\x1b[0m")
        log.error("[ct8] Could not connect (Errno 111)")
    first, other = (r.getMessage() for r in caplog.records)
    assert first == (
        "[ct9] the Proxmox node root@pve9 (where pve.py runs pct for ct9): "
        "Could not connect (Errno 111); PVE_HOST=pve9: check it"
    ), first
    assert other == "[ct8] Could not connect (Errno 111)"


@pytest.mark.integration
def test_the_raw_line_edit_removes_and_adds_in_the_main_section_only(tmp_path: Path) -> None:
    """ct_config's perl edit, run for real on a config file: the stale line goes from the main
    section (inner spacing aside), the same line in a snapshot section stays, the new line comes
    at the end of the main section, every other byte is kept."""
    import shlex

    from operations.steps.pve import _EDIT_LINES

    conf = tmp_path / "200.conf"
    main = "arch: amd64\nlxc.cgroup2.devices.allow: c  505:* rwm\nswap: 0\n"
    snapshot = "\n[before]\nlxc.cgroup2.devices.allow: c 505:* rwm\n"
    conf.write_text(main + snapshot)
    args = ["-lxc.cgroup2.devices.allow: c 505:* rwm", "+lxc.cgroup2.devices.allow: c 510:* rwm"]
    script = " ".join(shlex.quote(a) for a in ["perl", "-e", _EDIT_LINES, str(conf), *args])
    subprocess.run(["sh", "-c", script], check=True)
    assert conf.read_text() == (
        "arch: amd64\nswap: 0\nlxc.cgroup2.devices.allow: c 510:* rwm\n" + snapshot
    )


def test_the_container_plan_warns_about_low_ram_per_rank_too(tmp_path: Path) -> None:
    """The same warning in the container's plan (host_plan.decide), from the one function."""
    from operations.facts.serve import Serving
    from tests.unit.test_host_report import gathered, report, staging

    facts = gathered(Serving(), staging(None))
    low = report(make_settings(ram_per_rank_gb=0.5), facts).plan.warnings
    assert any("ram_per_rank_gb = 0.5 (set in" in w for w in low), low
    default = report(make_settings(), facts).plan.warnings
    assert not any("ram_per_rank_gb" in w for w in default), default


@pytest.mark.integration
def test_the_uvm_boot_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    import shutil

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is part of systemd (Debian: apt-get install systemd)"
    modprobe = tmp_path / "nvidia-modprobe"
    modprobe.write_text("#!/bin/sh\n")
    modprobe.chmod(0o755)
    text = planned(facts(node_unit=NodeUnitState(modprobe=str(modprobe)))).unit_text
    (tmp_path / "nvidia-uvm-nodes.service").write_text(text)
    (tmp_path / "pve-guests.service").write_text(
        (REPO / "tests/doubles/pve-guests.service").read_text()
    )
    proc = subprocess.run(
        [analyze, "verify", "--man=no", "./nvidia-uvm-nodes.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_capability_nodes_are_passed_but_never_widened() -> None:
    """The capability nodes gate privileged actions (mig-config): no mode=0666 for them."""
    config = [*BARE, "dev0: /dev/nvidia-caps/nvidia-cap1"]
    result = planned(facts(config=config, devices=node_devices(gpus=1, caps=True)), gpu_count=1)
    devs = dict(o for o in result.options if o[0].startswith("dev"))
    assert "dev0" not in devs, devs
    assert "/dev/nvidia-caps/nvidia-cap2" in devs.values(), devs
    assert devs["dev1"] == "/dev/nvidia0,mode=0666", devs
