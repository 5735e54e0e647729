"""The PreflightFacts command (operations/facts/preflight.py) run for real under sh, against the
nvidia-smi double (tests/doubles/nvidia-smi, the rtx-pro-6000-x8 capture): its parts run at
the same time and print, in order, exactly what they print one after the other where no
private directory can be made (TMPDIR that does not exist: mktemp -d fails, as on a full or
read-only /tmp); the parsed facts are the same; the directory is gone afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from operations.facts.preflight import PreflightFacts, parse_host_facts
from tests.doubles.ct200 import nvidia_smi_env

# It runs sh, the nvidia-smi double and coreutils.
pytestmark = pytest.mark.integration


def run(tmp_path: Path, tmpdir: Path) -> list[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    command = PreflightFacts().command(
        stage_dir=str(tmp_path), engine_root=str(tmp_path / "engine"), roots=[str(tmp_path)]
    )
    env = {**nvidia_smi_env(bindir, "rtx-pro-6000-x8"), "TMPDIR": str(tmpdir)}
    result = subprocess.run(
        ["sh", "-c", command.get_raw_value()],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.splitlines()


def stable(lines: list[str]) -> list[str]:
    # Free space moves between two runs; everything else must match line for line.
    return [line for line in lines if not line.startswith(("stage=", "engine_free="))]


def test_parts_at_once_print_what_parts_in_turn_print(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    together = run(tmp_path, scratch)
    in_turn = run(tmp_path, tmp_path / "no-such-dir")
    assert stable(together) == stable(in_turn)
    assert [line for line in together if line.startswith("@@preflight ")] == [
        "@@preflight gpu",
        "@@preflight resources",
    ]
    facts = parse_host_facts(together)
    assert facts.gpu.ok and len(facts.gpu.gpus) == 8 and facts.gpu.cuda_version == "12.8"
    assert facts.gpu == parse_host_facts(in_turn).gpu
    # The private directory is removed when the command ends.
    assert list(scratch.iterdir()) == []
