"""Issue 44: once the engine check passed on this host's GPUs, the engine step records it beside
the environment (layout.ENGINE_PROVEN): the record the step's own command writes, run by a real
shell, is what the EngineState fact's own script reads back and its parser accepts; a cut or
odd record proves nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from operations.facts.engine import parse_engine_state, parse_proven, state_script
from operations.layout import EngineTree
from operations.steps.engine_check import proven_command

GPUS = ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8


def sh(command: str) -> str:
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.integration  # a real shell
def test_the_steps_record_is_what_the_fact_reads_back(tmp_path: Path) -> None:
    tree = EngineTree(str(tmp_path))
    for name in ("done", "cut"):
        Path(tree.env(name)).mkdir(parents=True)
        Path(tree.env_marker(name)).write_text("{}\n")
    sh(proven_command(tree.env_proven("done"), GPUS, "570.172.08", "sglang"))
    Path(tree.env_proven("cut")).write_text('{"date": "2026-12-01", "driver": "57')
    day = sh("date -u +%Y-%m-%d").strip()
    state = parse_engine_state(sh(state_script(str(tmp_path))).splitlines())
    assert state.get("proven") == {
        "done": {"date": day, "gpus": GPUS, "driver": "570.172.08", "user": "sglang"}
    }
    assert state["envs"]["cut"]["complete"]


@pytest.mark.parametrize(
    "record",
    [
        "",
        "[]",
        '{"date": "yesterday", "driver": "570", "gpus": ["X"], "user": "sglang"}',
        '{"date": "2026-12-01", "driver": "570", "gpus": [], "user": "sglang"}',
        '{"date": "2026-12-01", "driver": "", "gpus": ["X"], "user": "sglang"}',
        '{"date": "2026-12-01", "driver": "570", "gpus": [1], "user": "sglang"}',
        '{"date": "2026-12-01", "driver": "570", "gpus": ["X"]}',
    ],
)
def test_a_record_that_is_not_one_proves_nothing(record: str) -> None:
    assert parse_proven(record) is None


@pytest.mark.integration  # a real shell
def test_a_name_with_quotes_survives_the_shell(tmp_path: Path) -> None:
    name = "GPU 'x' \"y\" 100%"
    path = str(tmp_path / "p.json")
    sh(proven_command(path, [name], "570", "root"))
    record = parse_proven(Path(path).read_text())
    assert record is not None and record["gpus"] == [name]
    assert json.loads(Path(path).read_text())["user"] == "root"
