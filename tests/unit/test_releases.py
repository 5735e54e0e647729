"""`python -m operations.releases INVENTORY`: what fits the simulated CT200, release by release,
read off the knowledge base (no release is named here) and decided by the plan itself.

Issue 28's "done when", on the same path: every release the knowledge base knows plans on the
simulated CT200 (inventory/demo.py, driver 570) when it has a CUDA 12 lane, else on a
580-driver CT200 with cu130, with 8 rank command lines its real CLI table accepts; and an
explicit `mamba_cache_strategy=no_buffer` never plans a rank its release asserts on at start."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import kb
from operations.cli import releases as releases_mod
from operations.kb.argv import cli_problems
from operations.plan import host_plan
from operations.plan.host_plan import Gathered, HostReport
from operations.settings import Settings
from operations.simulated import converged

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


def _inventory_580(folder: Path) -> Path:
    """The simulated CT200 after `pve.py` moved its node driver to 580."""
    inventory = folder / "ct200_580.py"
    inventory.write_text(
        "from tests.doubles.ct200 import fake_responses\n"
        "ct200 = [('@fake/ct200', {'fake_responses': "
        "fake_responses('rtx-pro-6000-x8-driver-580'), 'fake_delay': 0, "
        "'fake_delay_jitter': 0})]\n"
    )
    return inventory


def test_on_a_580_driver_every_release_fits_on_cu130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = _run(_inventory_580(tmp_path), capsys)
    for (release, lane), v in found.items():
        if lane == "cu130":
            assert v["fits"], (release, v["why"])


def test_an_unreadable_inventory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert releases_mod.main(["no/such/inventory.py"]) == 1
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1


@dataclasses.dataclass
class Asked:
    """What `operations.releases` asked the plan on one host: the facts it gathered once, the
    host's settings, and the report of each (release, lane)."""

    host: str
    settings: Settings
    facts: Gathered
    reports: dict[tuple[str, str], HostReport]

    def decide(self, release: str, lane: str, **changes: Any) -> HostReport:
        pinned = dataclasses.replace(
            self.settings, sglang_version=release, cuda_lane=lane, **changes
        )
        return host_plan.decide(self.host, pinned, self.facts, KNOWLEDGE)


def _asked(inventory: Path) -> Asked:
    """Run `operations.releases` on `inventory`, recording each call of the plan it makes."""
    calls: list[tuple[str, Settings, Gathered, HostReport]] = []
    real = host_plan.decide

    def recording(
        host: str, settings: Settings, facts: Gathered, knowledge: kb.Knowledge
    ) -> HostReport:
        report = real(host, settings, facts, knowledge)
        calls.append((host, settings, facts, report))
        return report

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(releases_mod, "decide", recording)
        result = releases_mod.run(str(inventory), {})
    assert all(not isinstance(v, str) for v in result.values()), result
    host, settings, facts, _ = calls[0]
    reports = {(s.sglang_version, s.cuda_lane): r for _, s, _, r in calls}
    return Asked(host, settings, facts, reports)


@pytest.fixture(scope="module")
def on_570() -> Asked:
    return _asked(REPO / "inventory" / "demo.py")


@pytest.fixture(scope="module")
def on_580(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asked]:
    yield _asked(_inventory_580(tmp_path_factory.mktemp("ct200-580")))


def _serves_the_model(release: str) -> bool:
    model = KNOWLEDGE.models["Qwen/Qwen3.6-27B"]
    return not model.min_release or kb.version(release) >= kb.version(model.min_release)


def _where(release: str) -> tuple[str, str]:
    """Where the release is to plan: its first CUDA 12 lane on the 570 CT200, else cu130 on the
    580 one (SGLang's CUDA 12 lane ended after 0.5.19: sgl-project/sglang#38404)."""
    cuda12 = [lane for lane in KNOWLEDGE.releases[release].lanes if _cuda12_lane(lane)]
    return ("570", cuda12[0]) if cuda12 else ("580", "cu130")


def _cuda12_lane(lane: str) -> bool:
    return KNOWLEDGE.lanes[lane].cuda.startswith("12.")


SERVING = [r for r in KNOWLEDGE.supported_releases() if _serves_the_model(r)]


def _accepted_ranks(report: HostReport, release: str) -> None:
    assert report.ok, report.errors
    assert len(report.plan.ranks) == 8, report.plan.ranks
    table = KNOWLEDGE.cli_table("sglang", release)
    assert table is not None
    for rank in report.plan.ranks:
        errors, _ = cli_problems(rank.argv[3:], table, "rank")
        assert not errors, errors


@pytest.mark.parametrize("release", SERVING)
def test_every_release_plans_8_ranks_its_table_accepts_where_it_can_run(
    release: str, on_570: Asked, on_580: Asked
) -> None:
    driver, lane = _where(release)
    asked = on_570 if driver == "570" else on_580
    _accepted_ranks(asked.reports[(release, lane)], release)
    if driver == "580":  # and on the 570 CT200 it is refused, naming the driver
        errors = on_570.reports[(release, lane)].errors
        assert any("driver 570" in e and ">= 580" in e for e in errors), errors


def _asserts(release: str) -> dict[str, list[str]]:
    """The release's start-up asserts, read from its wheel (operations/kb/knowledge/asserts/)."""
    path = kb.KNOWLEDGE_DIR / "asserts" / f"sglang-{release}.json"
    table: dict[str, list[str]] = json.loads(path.read_text())["asserts"]
    return table


@pytest.mark.parametrize("release", SERVING)
def test_no_buffer_never_plans_a_rank_its_release_asserts_on(
    release: str, on_570: Asked, on_580: Asked
) -> None:
    """ServerArgs._validate_mamba_no_buffer (0.5.14+) asserts the overlap schedule off, page
    size 1 and no trtllm_mha for an explicit no_buffer: the plan writes what the release's own
    asserts ask, or refuses; where the release does not assert it, nothing is added."""
    driver, lane = _where(release)
    report = (on_570 if driver == "570" else on_580).decide(
        release, lane, mamba_cache_strategy="no_buffer"
    )
    messages = _asserts(release).get("validate_mamba_no_buffer", [])
    if not report.ok:
        assert any("no_buffer" in e for e in report.errors), report.errors
        return
    _accepted_ranks(report, release)
    overlap = any("overlap schedule" in m for m in messages)
    spelling = KNOWLEDGE.flags.mamba_cache_strategy.spelling(release)
    assert spelling is not None and spelling.option is not None
    for rank in report.plan.ranks:
        argv = rank.argv[3:]
        assert ("--disable-overlap-schedule" in argv) == overlap, (release, argv)
        assert argv[argv.index(spelling.option) + 1] == "no_buffer", argv
        if messages:
            if "--page-size" in argv:
                assert argv[argv.index("--page-size") + 1] == "1", argv
            backend = argv[argv.index("--attention-backend") + 1]
            assert backend != "trtllm_mha", argv


def test_the_table_fits_80_columns_says_each_reason_once_and_marks_the_pin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row a release, a column a lane; the driver's reason for the 13 cu130 builds is one
    note; the host's own pin is marked; nothing is wider than the terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    assert releases_mod.main([str(REPO / "inventory" / "demo.py")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    rows = {line.split()[0]: line for line in lines if line.startswith("  0.5.")}
    assert set(rows) == set(KNOWLEDGE.supported_releases())
    assert out.count("cannot run CUDA 13.0") == 1
    # Each unproven reason once, with the range of versions it holds for (it was one note a
    # kernel version: 81 lines for 19 releases).
    prose = " ".join(out.split())
    assert prose.count("is a CUDA 12.9 build") == 1
    assert prose.count("is not on SGLang's cu129 kernel index") == 1
    assert prose.count("left out (CUDA 13 builds only)") == 1
    assert "sglang-kernel 0.4.1 to 0.4.4+cu129 is a CUDA 12.9 build" in prose
    assert len(lines) <= 2 * len(rows) + 15, len(lines)
    # group_data pins 0.5.11 on cu128 for the demo CT200: that cell, and only it, is marked.
    assert [r for r, line in rows.items() if "<" in line] == ["0.5.11"]
    assert "this host's pin (sglang_version 0.5.11, cuda_lane cu128)" in out


def test_a_value_the_command_tried_is_said_to_be_tried(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The inventory sets 0.5.11/cu128: a reason about 0.5.9 or cu130 never says the inventory
    set them."""
    found = _run(REPO / "inventory" / "demo.py", capsys)
    refused = [w for v in found.values() for w in v["why"]]
    assert refused
    assert not [w for w in refused if "set in the inventory" in w], refused
    assert any("sglang_version '0.5.9' (tried by the releases command)" in w for w in refused)


def test_behind_the_router_every_release_is_judged_and_smgs_pairing_is_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With smg in front (the default router), a release the host cannot run plans no rank:
    the plan asks no rank then (it once took the first of none), and each release that fits
    says whether smg's CI ran it over HTTP (the knowledge base's routers."1.13.0".engines)."""
    demo = str(REPO / "inventory" / "demo.py")
    router = 'router={"host": "@fake/ct200"}'
    assert releases_mod.main([demo, "--data", router, "--json"]) == 0
    (host,) = json.loads(capsys.readouterr().out)["hosts"].values()
    found = {(v["release"], v["lane"]): v for v in host}
    assert not found[("0.5.9", "cu128")]["fits"]
    engines = KNOWLEDGE.routers["1.13.0"].engines
    assert engines is not None
    for (release, _), v in found.items():
        if v["fits"] and release not in engines.tested:
            assert any("over HTTP" in u for u in v["unproven"]), (release, v)


def test_a_reason_about_each_release_s_own_version_is_one_note_with_the_range() -> None:
    """The same sentence about each release's kernel, or about what each release leaves out,
    is one reason; a different sentence (or source) is another."""
    kernel = "sglang-kernel {} is a CUDA 12.9 build: whether it loads (source: https://a/)"
    why, parts = releases_mod.reason(kernel.format("0.4.1"))
    assert (why, parts) == (releases_mod.reason(kernel.format("0.4.4+cu129"))[0], ["0.4.1"])
    assert releases_mod.said(why, {"0.4.1": "0.5.10", "0.4.4+cu129": "0.5.15"}) == kernel.format(
        "0.4.1 to 0.4.4+cu129"
    )
    assert releases_mod.reason(kernel.replace("a/", "b/").format("0.4.1"))[0] != why
    left = "left out (CUDA 13 builds only): {}; the paths that use them are unavailable"
    one, first = releases_mod.reason(left.format("sgl-deep-gemm"))
    two, second = releases_mod.reason(left.format("sgl-deep-ep, sgl-deep-gemm"))
    assert one == two and (first, second) == (["sgl-deep-gemm"], ["sgl-deep-ep", "sgl-deep-gemm"])
    parts_ = {"sgl-deep-gemm": "0.5.16", "sgl-deep-ep": "0.5.18"}
    assert releases_mod.said(one, parts_) == left.format(
        "sgl-deep-gemm (from 0.5.16), sgl-deep-ep (from 0.5.18)"
    )
    plain = "SGLang's last CUDA 12 image is v0.5.19-cu129"
    assert releases_mod.said(releases_mod.reason(plain)[0], {}) == plain


def test_a_release_proven_on_the_host_is_marked_with_its_day(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: the day-2 CT200 (inventory/demo_day2.py) recorded that the engine check
    passed in its 0.5.11 build on its GPUs: that row is marked proven, with the day, and no
    longer points to the unproven kernel; the table still fits 80 columns."""
    day2 = str(REPO / "inventory" / "demo_day2.py")
    monkeypatch.setenv("COLUMNS", "80")
    assert releases_mod.main([day2]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    rows = {line.split()[0]: line for line in lines if line.startswith("  0.5.")}
    assert [r for r, line in rows.items() if " p " in line + " "] == ["0.5.11"], out
    assert "fits p <" in rows["0.5.11"]
    day = time.strftime("%Y-%m-%d", time.gmtime(converged.STARTED))
    assert f"p: proven on this host's GPUs: 0.5.11 cu128 on {day}" in out
    found = _run(REPO / "inventory" / "demo_day2.py", capsys)
    assert found[("0.5.11", "cu128")]["proven"] == day
    assert found[("0.5.11", "cu128")]["unproven"] == []
    assert found[("0.5.12", "cu128")]["proven"] is None
    # The simulated CT200 of `make demo` has no record: nothing is marked.
    assert all(v["proven"] is None for v in _run(REPO / "inventory" / "demo.py", capsys).values())
