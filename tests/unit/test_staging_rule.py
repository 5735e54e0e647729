"""One rule decides "up to date" and the leftovers: the staging script's `survey`, which its
`plan` (the ModelStaging fact) reports and its `stage` acts on, given the same copy key and
kept keys (--key, --keep). Played on real stage trees: what the plan calls leftovers is exactly
what the stage run removes first, and the plan is up to date exactly when the run changes
nothing. The deploy's plan is the fact's answer for the key and keep the stage run gets
(runtime/gather.py, which asks without the keep first)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from operations.facts.host import Resources
from operations.facts.model import ModelStaging, Staging, parse_staging, script_module
from operations.facts.preflight import HostFacts
from operations.facts.serve import Serving, UnitState
from operations.runtime import gather
from tests.unit.builders import gpu_facts, make_settings
from tests.unit.test_model_stage import make_model

sm = script_module()
SLUG = "m"


@dataclass(frozen=True)
class Tree:
    """Complete copies (key, "new": the source's or "old": another's), staged in this order,
    the one SLUG points at, and an interrupted copy when `killed`."""

    copies: list[tuple[str, str]]
    current: str
    killed: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    tree: Tree
    key: str | None
    keep: list[str] = field(default_factory=list)
    # The plan's answer: the leftovers (keys, "tmp": the interrupted copy), up to date.
    leftovers: list[str] = field(default_factory=list)
    up_to_date: bool = False
    # What the stage run copies (files), None when it copies nothing.
    copied: int | None = None


DIGEST = "DIGEST"  # the source's digest, filled in by the test
CASES = [
    Case("converged", Tree([("k1", "new")], "k1"), "k1", up_to_date=True),
    Case("a copy a unit names is kept", Tree([("k0", "old"), ("k1", "new")], "k1"), "k1",
         keep=["k0"], up_to_date=True),
    Case("a copy no unit names is a leftover", Tree([("k0", "old"), ("k1", "new")], "k1"), "k1",
         leftovers=["k0"]),
    Case("an interrupted copy is a leftover", Tree([("k1", "new")], "k1", killed=True), "k1",
         leftovers=["tmp"]),
    Case("the units' copy holds the source: a switch, no copy",
         Tree([("k1", "new"), ("k2", "new")], "k1"), "k2", keep=["k1"]),
    Case("the source's copy under another key: copied as links",
         Tree([("k1", "new")], "k1"), "k2", copied=0),
    Case("a stale copy under the units' key is a leftover, copied again",
         Tree([("k2", "old"), ("k1", "new")], "k1"), "k2", leftovers=["k2"], copied=0),
    Case("no key: the source's digest is the key", Tree([(DIGEST, "new")], DIGEST), None,
         up_to_date=True),
    Case("no key, the source under another key: copied as links", Tree([("k1", "new")], "k1"),
         None, copied=0),
]  # fmt: skip


def build(tmp_path: Path, tree: Tree) -> tuple[Path, Path, str]:
    src = make_model(tmp_path / "src", shards=2, shard_bytes=4096)
    old = make_model(tmp_path / "old", shards=2, shard_bytes=4096)
    digest = str(sm.scan(str(src))["digest"])
    shm = tmp_path / "shm"
    shm.mkdir()
    keys: list[str] = []
    for key, which in tree.copies:
        key = digest if key == DIGEST else key
        what = src if which == "new" else old
        sm.stage(str(what), str(shm), SLUG, progress_interval=0, key=key, keep=tuple(keys))
        keys.append(key)
    link = shm / "models" / SLUG
    link.unlink()
    link.symlink_to(f".{SLUG}@{digest if tree.current == DIGEST else tree.current}")
    if tree.killed:
        (shm / "models" / f".{SLUG}.tmp-99999").mkdir()
    return src, shm, digest


def path_of(shm: Path, key: str) -> str:
    name = f".{SLUG}.tmp-99999" if key == "tmp" else f".{SLUG}@{key}"
    return str(shm / "models" / name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_plan_is_what_the_stage_run_does(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, shm, digest = build(tmp_path, case.tree)
    capsys.readouterr()
    keep = tuple(case.keep)

    planned = sm.plan(str(src), str(shm), SLUG, "manifest", case.key, keep)

    assert planned["leftovers"] == [path_of(shm, k) for k in case.leftovers]
    assert planned["up_to_date"] is case.up_to_date
    result = sm.stage(str(src), str(shm), SLUG, progress_interval=0, key=case.key, keep=keep)
    removed = [
        line.removeprefix("stage: removing leftover ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("stage: removing leftover ")
    ]
    assert removed == planned["leftovers"]
    assert result["changed"] is not planned["up_to_date"]
    assert result.get("copied_files") == case.copied
    wanted = f".{SLUG}@{case.key or digest}"
    assert os.readlink(shm / "models" / SLUG) == wanted
    for kept in keep:
        assert Path(path_of(shm, kept)).is_dir()


@pytest.mark.integration
def test_the_fact_passes_key_and_keep_to_the_script(tmp_path: Path) -> None:
    """The ModelStaging fact's own command line (the script inline, `python3 -c`), run here."""
    src, shm, _ = build(tmp_path, Tree([("k0", "old"), ("k1", "new")], "k1"))
    args: dict[str, Any] = {"source": str(src), "stage_dir": str(shm), "slug": SLUG}
    for keep, leftovers in (([], [path_of(shm, "k0")]), (["k0"], [])):
        command = ModelStaging().command(**args, key="k1", keep=keep).get_raw_value()
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        fact = parse_staging(out.stdout.splitlines())
        assert fact.error is None and fact.leftovers == leftovers
        assert fact.up_to_date is not bool(leftovers)
        answer = json.loads(out.stdout.splitlines()[-1])
        assert answer == sm.plan(str(src), str(shm), SLUG, "manifest", "k1", tuple(keep))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_asked_without_the_kept_keys_the_plan_is_the_same_unless_a_leftover_is_kept(
    case: Case, tmp_path: Path
) -> None:
    """gather (runtime/gather.py) asks the plan without --keep, at the same time as
    ServingState, and asks again with the kept keys only when one of them is a leftover of that
    first answer: its premise, on every tree of CASES (keep only takes copies out of the
    leftovers)."""
    src, shm, _ = build(tmp_path, case.tree)
    keep = tuple(case.keep)
    unkept = sm.plan(str(src), str(shm), SLUG, "manifest", case.key, ())
    kept = sm.plan(str(src), str(shm), SLUG, "manifest", case.key, keep)
    asked_again = bool({path_of(shm, k) for k in keep} & set(unkept["leftovers"]))
    assert (unkept == kept) is not asked_again


SOURCE_HF = "hf://Qwen/Qwen3.6-27B@6a9e0b1"
MODELS = "/dev/shm/models/.Qwen--Qwen3.6-27B"


@pytest.mark.parametrize(
    ("named", "first_leftovers", "asked_keep"),
    [
        # Converged: the units name the copy the plan wants, nothing to keep besides it.
        ("hf-6a9e0b1", [], [[]]),
        # A unit names an older copy that the first answer calls a leftover: asked again.
        ("hf-5f00d", [f"{MODELS}@hf-5f00d"], [[], ["hf-5f00d"]]),
        # A unit names an older copy that is not on the host any more: nothing to ask again.
        ("hf-5f00d", [f"{MODELS}@hf-0ld"], [[]]),
    ],
    ids=["converged", "a-kept-copy-is-a-leftover", "the-kept-copy-is-gone"],
)
def test_gather_asks_every_fact_at_once_and_the_plan_again_only_for_a_kept_leftover(
    monkeypatch: pytest.MonkeyPatch,
    named: str,
    first_leftovers: list[str],
    asked_keep: list[list[str]],
) -> None:
    """PreflightFacts, ServingState and ModelStaging (without --keep) in one `together`, the
    hub revision's key as --key; ModelStaging again with the kept keys when one is a leftover,
    and then that answer is the plan's."""
    settings = make_settings(model_source=SOURCE_HF)
    argv = f"python -m sglang.launch_server --model-path {MODELS}@{named} --port 30000"
    serving = Serving(ranks={0: UnitState(unit_sha256="x", exec_start=argv)})
    staged: list[dict[str, Any]] = []
    together_calls: list[int] = []

    def fake_gathered(fact: type, **kwargs: Any) -> Any:
        if fact is ModelStaging:
            staged.append(kwargs)
            leftovers = first_leftovers if len(staged) == 1 else []
            return Staging(leftovers=leftovers, hub_revision=f"again {len(staged)}")
        return HostFacts(gpu_facts("rtx-pro-6000-x8"), Resources())

    def in_turn(*calls: Callable[[], Any]) -> tuple[Any, ...]:
        together_calls.append(len(calls))
        return tuple(call() for call in calls)  # once.together without a host: in turn

    monkeypatch.setattr(gather, "gathered", fake_gathered)
    monkeypatch.setattr(gather, "serving_state", lambda s, router_list=None: serving)
    monkeypatch.setattr(gather, "together", in_turn)

    found = gather.gather(None, settings)  # type: ignore[arg-type]

    assert together_calls == [4]  # preflight, serving, staging, canary
    assert [kwargs["keep"] for kwargs in staged] == asked_keep
    assert all(kwargs["key"] == "hf-6a9e0b1" for kwargs in staged)
    assert found.staging is not None and found.staging.hub_revision == f"again {len(asked_keep)}"
    assert found.model_key == "hf-6a9e0b1"
