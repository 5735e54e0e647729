"""(settings, facts) -> HostReport: host_plan.decide, fed facts as the three fact commands
would return them, with every decision the deploy's steps act on checked as the plan command
prints it (`HostReport.to_json`). Before, the roll, the smoke targets, the secret and router
restarts, the copy key and the prune were decided inside the steps and only e2e saw them."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from operations import kb, layout
from operations.facts.host import parse_resources
from operations.facts.model import Copy, Staging
from operations.facts.preflight import HostFacts
from operations.facts.serve import Serving, UnitState
from operations.kb import pins
from operations.plan.host_plan import Gathered, HostReport, decide
from operations.plan.planned_files import sha256
from operations.plan.resolver import Rank
from operations.settings import Settings
from operations.simulated import ct200 as simulated_ct200
from tests.unit.builders import QWEN36, ROUTER_KEY, gpu_facts, make_settings

ROOT = Path(__file__).resolve().parents[2]
NEW, OLD = "52cd26977905ef55", "0123456789abcdef"
SLUG = "Qwen--Qwen3.6-27B"
MODELS = "/dev/shm/models"
BYTES = 53_800_000_000
ROUTER = {"host": "ct200", "port": 8000}


def resources() -> Any:
    return parse_resources(simulated_ct200.captured("host-resources.txt"))


def staging(staged: str | None, current_key: str | None = None) -> Staging:
    """The ModelStaging fact: the source at NEW, a copy of `staged` (a digest) or none."""
    copy = Copy(staged, BYTES, 19) if staged else None
    key = current_key or staged
    return Staging(
        source=Copy(NEW, BYTES, 19),
        staged=copy,
        copy_bytes=0 if staged == NEW else BYTES,
        up_to_date=staged == NEW,
        current=f"{MODELS}/.{SLUG}@{key}" if key else None,
    )


def gathered(
    serving: Serving, staged: Staging | None, *, gpus: str = "rtx-pro-6000-x8"
) -> Gathered:
    return Gathered(
        host=HostFacts(gpu=gpu_facts(gpus), resources=resources(), model=QWEN36),
        serving=serving,
        staging=staged,
        model=QWEN36,
        model_key=NEW,
    )


def report(settings: Settings, facts: Gathered) -> HostReport:
    return decide("ct200", settings, facts, kb.load(), [("ct200", settings)])


def exec_start(rank: Rank) -> str:
    (line,) = [x for x in rank.unit.splitlines() if x.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=")


def serving_of(
    ranks: list[Rank],
    *,
    changed: tuple[int, ...] = (),
    files: dict[str, str] | None = None,
    router: UnitState | None = None,
    model_target: str | None = None,
    exec_of: Callable[[Rank], str] = exec_start,
) -> Serving:
    """The ServingState fact of a host whose rank units are these ranks' (running), but for
    `changed` ranks, whose unit file has other text."""
    units = {
        r.rank: UnitState(
            unit_sha256=sha256(r.unit + ("# older\n" if r.rank in changed else "")),
            exec_start=exec_of(r),
            load="loaded",
            active="active",
        )
        for r in ranks
    }
    return Serving(
        ranks=units,
        files=files or {},
        router=router,
        model_target=model_target if model_target is not None else f".{SLUG}@{NEW}",
        user_exists=True,
    )


def converged(settings: Settings, **changes: Any) -> Serving:
    """What serves on a host the deploy already brought to these settings."""
    first = report(settings, gathered(Serving(), staging(None)))
    assert first.ok, first.errors
    return serving_of(first.plan.ranks, **changes)


PYTHON = "/opt/sglang/envs/{}/bin/python"


def rank_targets(*ranks: int) -> list[str]:
    return [f"sglang@{r}.service=http://127.0.0.1:{30000 + r}/v1" for r in ranks]


def case_never_deployed(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings()
    return (
        s,
        gathered(Serving(), staging(None)),
        {
            "staging": ("beside", "a first copy", []),
            "start": list(range(8)),
            "batches": [],
            "smoke": rank_targets(*range(8)),
            "summary": "start rank(s) 0, 1, 2, 3, 4, 5, 6, 7 together",
        },
    )


def case_converged(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings()
    return (
        s,
        gathered(converged(s), staging(NEW)),
        {
            "staging": ("unchanged", "unchanged", []),
            "start": [],
            "batches": [],
            "unchanged": list(range(8)),
            "smoke": [],
            "summary": "every rank runs what the plan says: nothing to restart",
        },
    )


def case_two_units_changed(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings(restart_batch_size=1)
    return (
        s,
        gathered(converged(s, changed=(2, 5)), staging(NEW)),
        {
            "batches": [[2], [5]],
            "batch_smoke": [None, None],
            # No router: nothing drains, so the smoke step asks both after the roll.
            "smoke": rank_targets(2, 5),
            "summary": "restart (unit changed) in batches [2] then [5] (not drain-protected: "
            "no router)",
        },
    )


def case_api_key_changed(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    key = tmp_path / "key"
    key.write_text("new-key\n")
    s = make_settings(api_key_file=str(key), restart_batch_size=4)
    old = sha256('api-key: "old-key"\n')
    return (
        s,
        gathered(converged(s, files={layout.SECRETS_FILE: old}), staging(NEW)),
        {
            "secret_changed": True,
            "batches": [[0, 1, 2, 3], [4, 5, 6, 7]],
            "smoke": rank_targets(*range(8)),
        },
    )


def case_api_key_dropped(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings()
    return (
        s,
        gathered(converged(s, files={layout.SECRETS_FILE: "ab" * 32}), staging(NEW)),
        {"secret_changed": False, "remove_secret": True, "batches": [], "smoke": []},
    )


def case_dp_size_shrank(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings(dp_size=4)
    serving = converged(make_settings())
    return (
        s,
        gathered(serving, staging(NEW)),
        {"remove": [4, 5, 6, 7], "unchanged": [0, 1, 2, 3], "batches": [], "smoke": []},
    )


def case_router_not_running(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    """The router's host, its ranks converged and rank 1's unit changed, the router not
    installed: rank 1 is drained and asked before it rejoins, the router restarts and is asked
    after the roll."""
    s = make_settings(router=ROUTER, restart_batch_size=1)
    return (
        s,
        gathered(converged(s, changed=(1,)), staging(NEW)),
        {
            "router_restart": True,
            "batches": [[1]],
            "batch_smoke": [rank_targets(1)],
            "smoke": ["router=http://127.0.0.1:8000/v1*4"],
        },
    )


def case_router_converged(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    s = make_settings(router=ROUTER)
    first = report(s, gathered(Serving(), staging(None)))
    assert first.router is not None
    files = {
        layout.unit_path(layout.ROUTER_UNIT): sha256(first.router.unit),
        layout.router_marker(first.router.env_dir): "cd" * 32,
        # The controller's control-plane key, written by an earlier run.
        layout.CONTROL_PLANE_KEY_FILE: sha256(ROUTER_KEY.read_text()),
    }
    serving = serving_of(first.plan.ranks, files=files, router=UnitState(active="active"))
    return (s, gathered(serving, staging(NEW)), {"router_restart": False, "smoke": []})


def case_new_model_revision(tmp_path: Path) -> tuple[Settings, Gathered, dict[str, Any]]:
    """The units name the OLD copy: it is kept while they do (--keep), staged beside, every rank
    rolls onto NEW, then the OLD copy goes."""
    s = make_settings(restart_batch_size=8)
    old_copy = f"{MODELS}/.{SLUG}@{OLD}"

    def old_exec(rank: Rank) -> str:
        return exec_start(rank).replace(f".{SLUG}@{NEW}", f".{SLUG}@{OLD}")

    serving = converged(s, changed=tuple(range(8)), exec_of=old_exec, model_target=f".{SLUG}@{OLD}")
    return (
        s,
        gathered(serving, staging(OLD)),
        {
            "staging": (
                "beside",
                "beside the current copy: ranks serve it until they roll onto the new one",
                [OLD],
            ),
            "batches": [list(range(8))],
            "prune_keep": [NEW],
            "prune_doomed": [old_copy],
        },
    )


CASES = {
    "never deployed": case_never_deployed,
    "converged": case_converged,
    "two units changed": case_two_units_changed,
    "API key changed": case_api_key_changed,
    "API key dropped": case_api_key_dropped,
    "dp_size shrank": case_dp_size_shrank,
    "router not running": case_router_not_running,
    "router converged": case_router_converged,
    "new model revision": case_new_model_revision,
}


@pytest.mark.parametrize("name", CASES)
def test_the_report_carries_each_decision(name: str, tmp_path: Path) -> None:
    settings, facts, expected = CASES[name](tmp_path)
    result = report(settings, facts)
    assert result.errors == []
    shown = result.to_json()
    serve, stage = shown["serve"], shown["staging"]
    assert shown["model_key"] == NEW
    assert stage["key"] == NEW
    engine = result.plan.engine
    assert engine is not None
    python = PYTHON.format(engine.name)
    for key, value in expected.items():
        if key == "staging":
            assert (stage["mode"], stage["what"], stage["keep"]) == value
        elif key == "smoke":
            assert serve["smoke"]["targets"] == value
            assert serve["smoke"]["python"] == (python if value else "")
        elif key == "batch_smoke":
            assert [b["targets"] if b else None for b in serve["batch_smoke"]] == value
            assert all(b["python"] == python for b in serve["batch_smoke"] if b)
        else:
            assert serve[key] == value, key  # type: ignore[literal-required]
    # The ranks every unit names: the copy under its key, the engine's own interpreter.
    assert {r["model_path"] for r in shown["ranks"]} == {f"{MODELS}/.{SLUG}@{NEW}"}
    assert {r["argv"][0] for r in shown["ranks"]} == {python}


def test_a_refused_host_decides_no_change() -> None:
    """Preflight refuses (4 GPUs where gpu_count says 8): no staging, no roll, no smoke."""
    s = make_settings()
    facts = gathered(Serving(), staging(None))
    four = dataclasses.replace(facts.host.gpu, gpus=facts.host.gpu.gpus[:4])
    facts = dataclasses.replace(facts, host=dataclasses.replace(facts.host, gpu=four))
    result = report(s, facts)
    assert [f.check for f in result.failures] == ["GPU count"]
    assert result.staging is None and result.serve is None
    assert result.engine_step is None and result.model_step is None
    shown = result.to_json()
    assert "serve" not in shown and "staging" not in shown
    assert shown.get("engine_step") is None and shown.get("model_step") is None


def test_the_plan_shows_every_file_the_serve_and_smoke_steps_write(tmp_path: Path) -> None:
    """Issue 29: `plan --json` shows each file the two steps write, in the order they do, with
    the digest wanted and the one the fact read, from the registry's entry; a secret's content
    never, and a key generated for this run not even its digest; units with their text."""
    key = tmp_path / "key"
    key.write_text("sk-shown-nowhere\n")
    s = make_settings(router=ROUTER, api_key_file=str(key))
    result = report(s, gathered(Serving(), staging(None)))
    assert result.errors == []
    serve = result.to_json()["serve"]
    router = serve["router_step"]
    assert router is not None and router["install"] and router["restart"]
    shown = [*serve["files"], *serve["smoke_files"], *serve["rank_units"], *router["files"]]
    cp_key = serve["control_plane_key"]
    assert cp_key is not None
    shown.append(cp_key)
    assert [f["path"] for f in serve["files"]] == [
        layout.WAIT_SCRIPT,
        layout.SECRETS_FILE,
        layout.ROUTER_WORKERS_SCRIPT,
        layout.unit_path(layout.TARGET),
        layout.TARGETS_FILE,
        layout.DASHBOARD_FILE,
    ]
    # No batch is rolled: the smoke step ships its script.
    assert [f["path"] for f in serve["smoke_files"]] == [layout.SMOKE_SCRIPT]
    tree = layout.engine_tree(s)
    assert [f["path"] for f in router["files"]] == [
        tree.uv_config,
        layout.env_requirements(layout.router_env_dir(s)),
        layout.ROUTER_LAUNCH_SCRIPT,
        layout.unit_path(layout.ROUTER_UNIT),
    ]
    registry = {f.path: f for f in layout.managed_files(s)}
    for file in shown:
        entry = registry[file["path"]]
        assert (file["mode"], file["group"], file["secret"]) == (
            entry.mode,
            entry.group,
            entry.secret,
        )
        # New on a fresh host, or not read by the facts (a secret: its write reads FileAt).
        assert file["changes"] is not False and file["sha256_now"] is None, file["path"]
    text = repr(result.to_json())
    assert "sk-shown-nowhere" not in text
    assert all(f["content"] is None for f in shown if f["secret"])
    assert cp_key["sha256"] is None  # generated on the host's first deploy
    units = {f["path"]: f["content"] for f in shown if f["content"] is not None}
    assert units[layout.unit_path(layout.ROUTER_UNIT)] == result.router.unit  # type: ignore[union-attr]
    for rank in result.plan.ranks:
        assert units[layout.rank_unit_path(rank.rank)] == rank.unit
    assert "[Unit]" in units[layout.unit_path(layout.TARGET)]


def test_a_converged_host_plans_no_write(tmp_path: Path) -> None:
    """Every file the serve and smoke steps would write already has the wanted digest: none
    changes, no rank unit is written, no control-plane key, no router install."""
    s = make_settings(router=ROUTER)
    first = report(s, gathered(Serving(), staging(None)))
    serve = first.serve
    assert serve is not None and serve.router is not None
    files = {f.path: str(f.sha256) for f in [*serve.files, *serve.smoke_files, *serve.router.files]}
    files[layout.router_marker(serve.router.env_dir)] = "cd" * 32
    files[layout.CONTROL_PLANE_KEY_FILE] = sha256(ROUTER_KEY.read_text())
    serving = serving_of(first.plan.ranks, files=files, router=UnitState(active="active"))
    again = report(s, gathered(serving, staging(NEW)))
    assert again.serve is not None and again.serve.router is not None
    shown = again.to_json()["serve"]
    assert [f["path"] for f in shown["files"] if f["changes"]] == []
    assert [f["path"] for f in shown["smoke_files"] if f["changes"]] == []
    assert shown["rank_units"] == [] and shown["control_plane_key"] is None
    assert not again.serve.target_changes and not again.serve.router.install
    # A file the fact does not checksum is not planned either (the uv config, requirements).
    assert [f.path for f in again.serve.router.files if f.changes] == []


def test_a_release_with_no_pinned_router_requirements_is_refused_before_any_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the serve step found the missing pins in the middle of a deploy."""
    # Every pin file but the router's.
    kept = tmp_path / "operations" / "kb" / "pins"
    kept.mkdir(parents=True)
    for f in pins.PINS_DIR.iterdir():
        if f.is_file() and not f.name.startswith("smg-"):
            shutil.copy(f, kept / f.name)
    monkeypatch.setattr(pins, "PINS_DIR", kept)
    result = report(make_settings(router=ROUTER), gathered(Serving(), staging(None)))
    assert [e for e in result.errors if "pinned" in e] == [
        "router version '1.13.0': no pinned requirements for smg 1.13.0 on Python 3.11 "
        "(operations/kb/pins/smg-1.13.0-py3.11.txt is missing): run scripts/pin_installs.py"
    ]
    assert not result.ok


def test_a_host_behind_sglang_router_0_3_2_moves_to_smg_in_one_run() -> None:
    """The plan names the move and its window; the old environment goes, the new one's does
    not; going back names the release to set."""
    old = "/opt/sglang/router/sglang-router-0.3.2"
    new = "/opt/sglang/router/smg-1.13.0"
    result = report(
        make_settings(router=ROUTER), gathered(Serving(router_envs=[old, new]), staging(None))
    )
    assert result.serve is not None and result.serve.router is not None
    step = result.serve.router
    assert (step.package, step.env_dir, step.retired, step.restart) == ("smg", new, [old], True)
    moves = [d for d in result.plan.decisions if d.what == "router move"]
    assert len(moves) == 1, result.plan.decisions
    assert moves[0].value == (
        "move the router sglang-router-0.3.2 -> smg 1.13.0: clients of its port are refused "
        "for about 2s"
    )
    assert "router.version to the old release (0.3.2)" in moves[0].why
    assert "move the router sglang-router-0.3.2 -> smg 1.13.0" in result.serve.summary()
    # Going back: the same, the other way.
    back = report(
        make_settings(router={**ROUTER, "version": "0.3.2"}),
        gathered(Serving(router_envs=[new]), staging(None)),
    )
    assert back.serve is not None and back.serve.router is not None
    assert back.serve.router.retired == [new] and back.serve.router.package == "sglang-router"


def test_a_running_router_that_moves_goes_before_the_ranks_roll() -> None:
    """A host the previous version left behind sglang-router 0.3.2: the router moves first, so
    the drains speak smg's API (0.3.2 answers smg's settle update 405); the plan says so."""
    old = "/opt/sglang/router/sglang-router-0.3.2"
    running = UnitState(load="loaded", active="active", sub="running")
    result = report(
        make_settings(router=ROUTER),
        gathered(Serving(router=running, router_envs=[old]), staging(None)),
    )
    assert result.serve is not None and result.serve.order.first
    assert result.serve.to_json()["router_first"] is True
    assert "the router moves before the ranks roll" in result.serve.summary()
    # Not running yet (a first deploy): it starts after the ranks, as smg needs one ready.
    fresh = report(
        make_settings(router=ROUTER), gathered(Serving(router_envs=[old]), staging(None))
    )
    assert fresh.serve is not None and not fresh.serve.order.first
