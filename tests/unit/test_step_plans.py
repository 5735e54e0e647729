"""The engine and model steps carry out their plans (issue 29): no operation of theirs asks a
fact, and `plan --json` (HostReport.to_json) lists every file the two steps write.

The second test builds the report with host_plan.decide from the facts of a host with nothing
on it yet (every file is to write), adds the real engine and model steps to a pyinfra State
over the @fake connector, and reads every command their operations yield: each file a command
writes (put_file's `mv -f "$tmp" DEST`, a `> DEST` redirection, `cp SRC DEST`, `uv export -o
DEST`, an upload) must be one the plan lists."""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.config import Config
from pyinfra.api.connect import connect_all
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state

from operations import kb, layout
from operations.facts.serve import Serving
from operations.plan.engine_plan import EngineFacts
from operations.plan.host_plan import HostReport, decide
from operations.plan.planned_files import sha256
from operations.steps.engine import install_engine
from operations.steps.model import stage_model
from tests.unit.builders import make_settings
from tests.unit.test_host_report import gathered, staging

ROOT = Path(__file__).resolve().parents[2]
STEPS = [ROOT / "operations/steps/engine.py", ROOT / "operations/steps/model.py"]
TOKEN = "hf_plan-test-token-0123456789"
# A lock the lock check passes (just the project), as the controller keeps it.
LOCK = 'version = 1\n\n[[package]]\nname = "sglang-engine"\nversion = "0"\n'
LOCK += 'source = { virtual = "." }\n'
REVISION = "a" * 40


@pytest.mark.parametrize("path", STEPS, ids=lambda p: p.name)
def test_no_operation_of_the_engine_or_model_step_asks_a_fact(path: Path) -> None:
    """Every fact is the plan's (runtime/gather.py): a `host.get_fact` or `gathered(...)` here
    would be a second place deciding from the host's state (and a round trip of its own)."""
    tree = ast.parse(path.read_text())
    asked = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "get_fact")
            or (isinstance(node.func, ast.Name) and node.func.id in ("gathered", "get_fact"))
        )
    ]
    assert asked == []
    imported = [
        f"{path.name}:{node.lineno} {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and (node.module.startswith("operations.facts") or node.module == "pyinfra.facts.files")
    ]
    assert imported == []


def fresh_report(tmp_path: Path, lock: bool, **settings: Any) -> HostReport:
    """The report of a host with no engine, no model copy and no stage unit yet; `lock`: the
    controller has the engine's lock (uploaded, not resolved again)."""
    s = make_settings(engine_lock_dir=str(tmp_path / "locks"), **settings)
    base = gathered(Serving(), staging(None))
    facts = dataclasses.replace(
        base,
        engine=EngineFacts(cwd=str(tmp_path)),
        hub_cli_installed=False,
        hub_token=TOKEN,
    )
    report = decide("ct200", s, facts, kb.load(), [("ct200", s)])
    assert report.ok and report.plan.engine is not None, report.errors
    if lock:
        # The lock of the engine the plan resolved, on the controller, as the upload reads it.
        name = f"{report.plan.engine.name}.lock"
        (tmp_path / "locks").mkdir()
        (tmp_path / "locks" / name).write_text(LOCK)
        engine = EngineFacts(cwd=str(tmp_path), locks={name: sha256(LOCK)})
        report = decide("ct200", s, dataclasses.replace(facts, engine=engine), kb.load())
    return report


_WRITES = (
    re.compile(r"""mv -f "\$tmp" ([^\s;]+)"""),
    re.compile(r"""(?<![0-9&])> ?('[^']+'|[^\s;&|]+)"""),
    re.compile(r"""mv -f ('[^']+'|[^\s;&|]+) ('[^']+'|[^\s;&|]+)"""),
    re.compile(r"""\bcp ('[^']+'|[^\s;&|]+) ('[^']+'|[^\s;&|]+)"""),
    re.compile(r""" -o ('[^']+'|[^\s;&|]+) """),
)


def written(command: str) -> set[str]:
    """The files one shell command writes (the destinations of its writes)."""
    found = set()
    for pattern in _WRITES:
        for match in pattern.finditer(command):
            path = shlex.split(match.groups()[-1])[0]
            if path.startswith("/") and not path.startswith("/dev/"):
                found.add(path)
    return found


def step_writes(report: HostReport) -> tuple[set[str], set[str]]:
    """The files the engine and model steps' operations write, and the wheels they upload."""
    inventory = Inventory((["@fake/ct200"], {"fake_delay": 0, "fake_delay_jitter": 0}))
    state = State(inventory, Config())
    connect_all(state)
    (host,) = inventory
    files: set[str] = set()
    uploads: set[str] = set()
    with ctx_state.use(state), ctx_host.use(host):
        install_engine(report)
        stage_model(report)
        for op_hash in state.get_op_order():
            data = state.ops[host].get(op_hash)
            if data is None:
                continue
            for command in data.command_generator():
                if isinstance(command, FileUploadCommand):
                    uploads.add(command.dest)
                elif isinstance(command, StringCommand):
                    files |= written(command.get_raw_value())
    return files, uploads


def listed(report: HostReport) -> set[str]:
    doc = report.to_json()
    engine, model = doc.get("engine_step"), doc.get("model_step")
    assert engine is not None and model is not None
    return {f["path"] for f in engine["files"]} | {f["path"] for f in model["files"]}


# Temp names a write goes through before its rename (in the same command), not files left.
_TEMPS = re.compile(r"\.tmp$|/\.partial/")


@pytest.mark.parametrize(
    "settings,lock",
    [
        ({"model_source": f"hf://Qwen/Qwen3.6-27B@{REVISION}"}, False),
        ({"package_index_url": "https://user:pw@pypi.example/simple"}, True),
    ],
    ids=["hub source, fresh lock", "index with credentials, the controller's lock"],
)
def test_plan_json_lists_every_file_the_engine_and_model_steps_write(
    tmp_path: Path, settings: dict[str, Any], lock: bool
) -> None:
    report = fresh_report(tmp_path, lock, **settings)
    files, uploads = step_writes(report)
    wanted = listed(report)
    unlisted = sorted(p for p in files - wanted if not _TEMPS.search(p))
    assert unlisted == [], f"written by the steps but not in plan --json: {unlisted}"
    assert uploads == set(), uploads  # no wheelhouse here
    assert {layout.STAGE_SCRIPT, layout.unit_path(layout.STAGE_UNIT)} <= wanted
    doc = str(report.to_json())
    if "model_source" in settings:
        assert layout.HUB_TOKEN_FILE in wanted and layout.HUB_TOKEN_FILE in files
        assert TOKEN not in doc and sha256(TOKEN) not in doc  # nor its digest
        model = report.to_json().get("model_step")
        assert model is not None
        (entry,) = [f for f in model["files"] if f["secret"]]
        assert entry["sha256"] is None, entry
    else:
        assert "user:pw" not in doc  # pip.conf and pyproject.toml hold it
        engine = report.to_json().get("engine_step")
        assert engine is not None
        secrets = [f for f in engine["files"] if f["secret"]]
        assert secrets and all(f["sha256"] is None for f in secrets), secrets
        tree = layout.engine_tree(report.settings)
        assert tree.pip_config in wanted and tree.pip_config in files
        assert report.plan.engine is not None
        assert tree.project_lock(report.plan.engine.name) in files  # the controller's, uploaded


def test_the_stage_unit_text_is_in_the_plan(tmp_path: Path) -> None:
    report = fresh_report(tmp_path, False)
    model = report.to_json().get("model_step")
    assert model is not None
    (unit,) = model["units"]
    assert unit["path"] == layout.unit_path(layout.STAGE_UNIT)
    assert "ExecStart=" in unit["text"] and layout.STAGE_SCRIPT in unit["text"]
