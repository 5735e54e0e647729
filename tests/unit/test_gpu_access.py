"""GpuNodeAccess's parser and preflight's judgement of who can open the GPU nodes (issue 27).

The lines are what the fact printed on the testbed's variants (tests/e2e/test_gpu_access.py):
nodes 0660 root:root (EACCES for the service user), 0666 in a user namespace whose systemd
attaches no device filter (rank 0's probe opened /dev/nvidia1), and the sandbox failing to
start (226/NAMESPACE, as without `features: nesting=1`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from operations.facts.gpu import PROBE_SCRIPT, GpuNodeAccess, parse_gpu_access
from operations.plan import preflight
from operations.render import host_scripts
from tests.unit.builders import make_settings

NODES = ["/dev/nvidiactl", "/dev/nvidia-uvm", *(f"/dev/nvidia{i}" for i in range(8))]


def lines(mode: str, opened: dict[str, str], user: bool = True, rc: int = 0) -> list[str]:
    out = ["svc=999|997|997"] if user else []
    out += [f"node={n}|0|0|{mode}" for n in NODES]
    out += [f"open={n}|{opened.get(n, 'ok')}" for n in NODES]
    return [*out, f"probe_rc={rc}"]


def test_parse_reads_user_nodes_and_probe() -> None:
    access = parse_gpu_access(lines("660", {"/dev/nvidia0": "EACCES"}))
    assert access.user_ids == (999, 997, (997,))
    assert access.nodes["/dev/nvidia0"].mode == 0o660
    assert access.nodes["/dev/nvidia0"].opened == "EACCES"
    assert access.probe_rc == 0 and access.probe_error is None


def test_0660_root_nodes_are_refused_naming_each_node_and_the_pct_fix() -> None:
    s = make_settings()
    denied = {n: "EACCES" for n in NODES}
    (failure,) = preflight.access_failures(s, parse_gpu_access(lines("660", denied)))
    assert failure.check == "GPU access"
    assert "/dev/nvidiactl (owner 0:0, mode 0660)" in failure.found
    assert "/dev/nvidia7 (owner 0:0, mode 0660)" in failure.found
    assert "pct set CTID --devN /dev/nvidia-uvm,mode=0666" in failure.fix


def test_a_user_still_to_be_made_is_judged_by_the_other_bits() -> None:
    s = make_settings()
    # The probe ran as nobody and (as root's group member) could not tell: the bits decide.
    access = parse_gpu_access(lines("660", {}, user=False))
    (failure,) = preflight.access_failures(s, access)
    assert "to be made" in failure.expected
    assert preflight.access_failures(s, parse_gpu_access(lines("666", {}, user=False))) == []


def test_open_nodes_pass_and_a_missing_filter_is_a_plan_warning() -> None:
    s = make_settings()
    access = parse_gpu_access(lines("666", {}))
    assert preflight.access_failures(s, access) == []
    assert preflight.filter_holds(s, access) is False
    (warning,) = preflight.access_warnings(s, access)
    assert "every rank can open every GPU" in warning


def test_a_filter_that_holds_gives_eperm_and_no_warning() -> None:
    s = make_settings()
    others = {f"/dev/nvidia{i}": "EPERM" for i in range(1, 8)}
    access = parse_gpu_access(lines("666", others))
    assert preflight.filter_holds(s, access) is True
    assert preflight.access_warnings(s, access) == []
    assert preflight.access_failures(s, access) == []


def test_namespace_failure_names_nesting() -> None:
    s = make_settings()
    out = ["svc=999|997|997", *(f"node={n}|0|0|666" for n in NODES)]
    out += ["Job for sglang-deploy-gpu-probe-77.service failed.", "probe_rc=226"]
    (failure,) = preflight.access_failures(s, parse_gpu_access(out))
    assert failure.check == "rank sandbox"
    assert "226/NAMESPACE" in failure.found
    assert "nesting=1" in failure.fix and "pve_nesting" in failure.fix


def test_not_asked_is_no_check() -> None:
    s = make_settings()
    assert preflight.access_failures(s, None) == []
    assert preflight.access_failures(s, parse_gpu_access([])) == []


def test_the_probe_units_program_holds_nothing_systemd_would_expand() -> None:
    """The probe runs as one argument of a transient unit's ExecStart, where systemd expands
    `%` specifiers and `$` variables (systemd.service(5), "Command lines")."""
    text = host_scripts.script_text(PROBE_SCRIPT)
    assert "%" not in text and "$" not in text
    command = GpuNodeAccess().command("sglang", ["/dev/nvidia0"], []).get_raw_value()
    assert "def opened(node: str)" in command  # the bundled program, as the unit runs it


@pytest.mark.integration
def test_the_probe_units_program_opens_each_node_read_write(tmp_path: Path) -> None:
    readonly = tmp_path / "readonly"
    readonly.write_text("")
    readonly.chmod(0o444)
    nodes = ["/dev/null", str(tmp_path / "absent"), str(readonly)]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", host_scripts.script_text(PROBE_SCRIPT), *nodes],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    access = parse_gpu_access(proc.stdout.splitlines())
    assert access.probe_error is None
    denied = "ok" if os.geteuid() == 0 else "EACCES"  # root opens a 0444 file read-write
    assert proc.stdout.splitlines() == [
        "open=/dev/null|ok",
        f"open={tmp_path / 'absent'}|ENOENT",
        f"open={readonly}|{denied}",
    ]
