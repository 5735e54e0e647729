"""engine_plan.decide and model_plan.decide: every decision the engine and model steps carry
out, made from settings and facts alone (before, engine.py's step made them from raw facts,
and its operations asked the EngineState and WheelhouseFiles facts again when an argument was
missing; the model step scanned the controller's directory a third time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from operations import kb, layout
from operations.facts.engine import EngineHost
from operations.facts.model import Copy, Staging, script_text
from operations.plan.engine_plan import EngineFacts, EnginePlan, decide
from operations.plan.engine_probe import Driver
from operations.plan.engine_spec import engine_spec
from operations.plan.model_plan import ModelPlan, stage_unit_text
from operations.plan.model_plan import decide as decide_model
from operations.plan.planned_files import sha256
from operations.plan.staging import ControllerScan, decide_stage
from operations.settings import Settings
from tests.unit.builders import make_settings

KB = kb.load()
DRIVER = Driver("570.124.06", "12.8")


def plan(facts: EngineFacts, **overrides: Any) -> tuple[Settings, EnginePlan]:
    settings = make_settings(**overrides)
    spec = engine_spec(settings, KB, "3.11")
    return settings, decide(settings, spec, facts, DRIVER, ["/dev/nvidia0"])


def state(*envs: tuple[str, bool, int | None], current: str | None = None) -> EngineHost:
    return {
        "current": current,
        "envs": {n: {"complete": c, "activated_at": t} for n, c, t in envs},
        "uv": "0.13.9",
        "toolkits": [],
        "packages": ["libnuma1", "g++"],
    }


def name_of(**overrides: Any) -> str:
    return engine_spec(make_settings(**overrides), KB, "3.11").name


def test_a_converged_engine_plans_nothing_but_noops() -> None:
    name = name_of()
    spec = engine_spec(make_settings(), KB, "3.11")
    assert spec.toolkit is not None
    st = state((name, True, 5), current=name)
    st["toolkits"] = [spec.toolkit.name]
    _, p = plan(EngineFacts(state=st, locks={f"{name}.lock": "0" * 64}))
    assert not p.install and not p.switch and p.prune == () and not p.fetch_lock
    assert p.files == ()  # nothing is written
    doc = p.to_json()
    assert doc["switch"] == {"from": name, "to": name} and doc["packages_missing"] == []


def test_a_fresh_host_installs_and_lists_every_file_a_secret_without_its_digest() -> None:
    index = "https://user:s3cret@pypi.example/simple"
    s, p = plan(EngineFacts(), package_index_url=index)
    tree = layout.engine_tree(s)
    assert p.install and not p.partial and p.fetch_lock and not p.lock_upload
    paths = {f.path: f for f in p.files}
    assert paths[tree.pip_config].secret and paths[tree.project_toml(p.spec.name)].secret
    assert paths[tree.project_lock(p.spec.name)].made_by == "uv lock"
    assert paths[tree.tools_requirements].content is not None
    marker = json.loads(str(paths[tree.env_marker(p.spec.name)].content))
    assert marker == json.loads(json.dumps(p.spec.marker()))
    shown = json.dumps(p.to_json())
    # The index's credentials are in pip.conf: neither they nor the file's digest are shown.
    assert "s3cret" not in shown and str(paths[tree.pip_config].sha256) not in shown


def test_a_partial_environment_is_rebuilt_and_the_controllers_lock_uploaded(
    tmp_path: Path,
) -> None:
    name = name_of()
    facts = EngineFacts(
        state=state((name, False, None)), cwd=str(tmp_path), locks={f"{name}.lock": "ab" * 32}
    )
    s, p = plan(facts, engine_lock_dir="locks")
    assert p.install and p.partial and p.lock_upload and not p.fetch_lock
    assert p.controller_lock == str(tmp_path / "locks" / f"{name}.lock")
    lock = p.file(layout.engine_tree(s).project_lock(name))
    assert lock.sha256 == "ab" * 32 and lock.made_by is None


def test_prune_keeps_the_current_and_every_environment_a_rank_unit_names() -> None:
    name = name_of()
    old = [(f"0.5.{i}-cu128-0000000{i}", True, i) for i in range(1, 5)]
    facts = EngineFacts(
        state=state((name, True, 9), *old, ("cut-0", False, None), current=old[0][0]),
        referenced=frozenset({old[1][0]}),
    )
    _, p = plan(facts, engine_keep=2)
    # keep 2: the target and the newest other (0.5.4); plus current (0.5.1) and 0.5.2 (a unit).
    assert p.prune == ("0.5.3-cu128-00000003", "cut-0")
    assert p.switch and p.current_now == old[0][0]


def test_the_wheelhouse_check_and_sync_are_decided_from_both_sides(tmp_path: Path) -> None:
    wheels = {"torch-2.11.0+cu128-cp311-cp311-linux_x86_64.whl": 10, "a-1.0-py3-none-any.whl": 3}
    facts = EngineFacts(wheels=wheels, wheels_now={"a-1.0-py3-none-any.whl": 2})
    s, p = plan(facts, wheelhouse=str(tmp_path))
    assert p.wheelhouse_is_dir and p.wheels_count == 2
    assert set(p.wheels_todo) == set(wheels)  # one absent, one of another size (a cut upload)
    assert "uv==0.13.9" in p.missing_wheels and not any(
        m.startswith("torch==") for m in p.missing_wheels
    )
    assert p.compiler.sync_archives  # offline, the compiler not installed yet
    tree = layout.engine_tree(s)
    assert p.file(tree.project_requirements(p.spec.name)).made_by == "uv export"
    absent = EngineFacts(wheels=None)
    _, q = plan(absent, wheelhouse=str(tmp_path / "nowhere"))
    assert not q.wheelhouse_is_dir and len(q.missing_wheels) == len(q.spec.requirements) + 1


# ----------------------------------------------------------------------------- the model plan

DIGEST = "52cd26977905ef55"


def model(settings: Settings, staging: Staging | None, **kw: Any) -> ModelPlan:
    controller = kw.pop("controller", None)
    key = kw.pop("key", DIGEST)
    decision = decide_stage(settings, None, key, staging, set(), controller)
    args: dict[str, Any] = {
        "digests": {},
        "enabled": {},
        "user_exists": False,
        "engine_installs": False,
        "python": "3.11",
        "controller": controller,
        "hub_cli_installed": None,
        "hub_token": None,
        **kw,
    }
    return decide_model(settings, decision, key, **args)


def test_a_converged_model_plan_reads_the_digests_and_changes_nothing() -> None:
    s = make_settings()
    copy = Copy(DIGEST, 100, 2)
    staged = Staging(source=copy, staged=copy, up_to_date=True)
    unit = layout.unit_path(layout.STAGE_UNIT)
    digests = {layout.STAGE_SCRIPT: sha256(script_text()), unit: sha256(stage_unit_text(s, DIGEST))}
    m = model(s, staged, digests=digests, enabled={layout.STAGE_UNIT: "enabled"})
    assert m.script.changes is False and m.unit.changes is False
    doc = m.to_json()
    assert (
        doc["stage"] == "unchanged" and not doc["enable_stage_unit"] and doc["source"] == "target"
    )
    assert doc["units"][0]["text"] == stage_unit_text(s, DIGEST)
    drifted = model(s, staged, digests={**digests, unit: "0" * 64})
    assert drifted.unit.changes is True


def test_a_hub_download_to_do_plans_the_cli_and_the_token_and_shows_no_token() -> None:
    revision = "b" * 40
    s = make_settings(model_source=f"hf://Qwen/Qwen3.6-27B@{revision}")
    key = layout.hub_key(revision)
    m = model(s, None, key=key, hub_cli_installed=False, hub_token="hf_secret-token")
    assert m.hub is not None and m.hub.download and m.hub.install_cli
    assert m.hub.token is not None and m.hub.token.path == layout.HUB_TOKEN_FILE
    paths = {f.path for f in m.files}
    assert {layout.HUB_TOKEN_FILE, layout.hub_cli_requirements(s.model_hub_cli)} <= paths
    assert "hf_secret-token" not in json.dumps(m.to_json()) + repr(m)
    done = Staging(source=Copy(DIGEST, 1, 1), hub_revision=revision)
    again = model(s, done, key=key, hub_token="hf_secret-token")
    assert again.hub is not None and not again.hub.download and again.hub.token is None


def test_a_controller_source_is_synced_from_its_one_scan(tmp_path: Path) -> None:
    s = make_settings(model_source=f"controller:{tmp_path}")
    scan = ControllerScan("c" * 16, 42)
    cached = Staging(source=Copy("d" * 16, 42, 1))
    m = model(s, cached, key=scan.digest, controller=scan)
    assert m.sync is not None and m.sync.needed and m.sync.local_bytes == 42
    same = model(s, Staging(source=Copy("c" * 16, 42, 1)), key=scan.digest, controller=scan)
    assert same.sync is not None and not same.sync.needed
