"""`python -m operations.releases INVENTORY`: what fits the simulated CT200, release by release,
read off the knowledge base (no release is named here) and decided by the plan itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from operations import kb
from operations import releases as releases_mod

KNOWLEDGE = kb.load()
REPO = Path(__file__).resolve().parents[2]


def _run(inventory: Path, capsys: pytest.CaptureFixture[str]) -> dict[tuple[str, str], Any]:
    assert releases_mod.main([str(inventory), "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    (host,) = document["hosts"].values()
    return {(v["release"], v["lane"]): v for v in host}


def _cuda12(release: str) -> bool:
    return any(
        KNOWLEDGE.lanes[lane].cuda.startswith("12.") for lane in KNOWLEDGE.releases[release].lanes
    )


def test_on_the_570_ct200_every_cuda12_release_fits_and_the_rest_need_the_driver(
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = _run(REPO / "inventory" / "demo.py", capsys)
    assert {r for r, _ in found} == set(KNOWLEDGE.supported_releases())
    model = KNOWLEDGE.models["Qwen/Qwen3.6-27B"]
    for release in KNOWLEDGE.supported_releases():
        mine = {lane: v for (r, lane), v in found.items() if r == release}
        if model.min_release and kb.version(release) < kb.version(model.min_release):
            assert not any(v["fits"] for v in mine.values())
            continue
        if _cuda12(release):
            assert any(v["fits"] for v in mine.values()), (release, mine)
        for lane, v in mine.items():
            if KNOWLEDGE.lanes[lane].cuda.startswith("13"):
                assert not v["fits"]
                assert any("driver 570" in w and ">= 580" in w for w in v["why"]), v
                assert any("driver >= 580" in u and "pve.py" in u for u in v["unlock"]), v


def test_on_a_580_driver_every_release_fits_on_cu130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "ct200_580.py"
    inventory.write_text(
        "from tests.doubles.ct200 import fake_responses\n"
        "ct200 = [('@fake/ct200', {'fake_responses': "
        "fake_responses('rtx-pro-6000-x8-driver-580'), 'fake_delay': 0, "
        "'fake_delay_jitter': 0})]\n"
    )
    found = _run(inventory, capsys)
    for (release, lane), v in found.items():
        if lane == "cu130":
            assert v["fits"], (release, v["why"])


def test_an_unreadable_inventory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert releases_mod.main(["no/such/inventory.py"]) == 1
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1
