"""The toolkit's version: one number in pyproject.toml, operations/version.py and CHANGELOG.md;
the host's record of it (facts/toolkit_record.py), what the plan says of it
(plan/toolkit_version.py), and what status shows."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from operations import layout
from operations.cli import status as st
from operations.facts.serve import Serving, parse_serving
from operations.facts.toolkit_record import ToolkitRecord, parse_record, record_text
from operations.plan import toolkit_version as tv
from operations.plan.planned_files import sha256
from operations.version import RELEASED, VERSION
from tests.unit.builders import make_settings

ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^## \[([0-9]+\.[0-9]+\.[0-9]+)\] - ([0-9]{4}-[0-9]{2}-[0-9]{2})$", re.M)
TODAY = "2026-12-06"
# The plan names 0.12.0 here (decide's `version`), dated as this version's entry (RELEASED).
ANCHOR = f"CHANGELOG.md#0120---{RELEASED}"


def releases() -> list[tuple[str, str]]:
    return HEADING.findall((ROOT / "CHANGELOG.md").read_text())


# -- one version everywhere --------------------------------------------------------------------


def test_the_version_is_pyprojects_and_the_changelogs_newest() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == VERSION
    assert releases()[0] == (VERSION, RELEASED)
    # uv.lock records the project's version too: `uv sync --locked` refuses a stale one.
    lock = (ROOT / "uv.lock").read_text()
    assert f'name = "sglang-deploy"\nversion = "{VERSION}"' in lock


def test_every_release_is_an_entry_that_says_what_an_upgrade_does() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    found = releases()
    numbers = [tuple(int(p) for p in v.split(".")) for v, _ in found]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    assert [v for v, _ in found][-1] == "0.1.0"
    dates = [d for _, d in found]
    assert dates == sorted(dates, reverse=True)
    entries = HEADING.split(text)[1:]
    for version, _, body in zip(entries[::3], entries[1::3], entries[2::3], strict=True):
        assert "**On a serving host:**" in body, version
        if version != VERSION:
            # Each released version names its commit, so a test can check it out.
            assert re.search(r"Commit `[0-9a-f]{7}`", body), version


def test_the_plans_link_is_the_anchor_github_makes_of_the_heading() -> None:
    assert tv.changelog_anchor("0.12.0", "2026-12-06") == "CHANGELOG.md#0120---2026-12-06"
    assert tv.changelog_anchor() == f"CHANGELOG.md#{VERSION.replace('.', '')}---{RELEASED}"


# -- the record and its parser -----------------------------------------------------------------


def test_the_record_as_written_is_read_back() -> None:
    text = record_text("0.12.0", TODAY)
    assert text == '{"recorded": "2026-12-06", "version": "0.12.0"}\n'
    assert parse_record(text.strip()) == ToolkitRecord("0.12.0", TODAY)
    assert parse_record(record_text("0.12.0", None)) == ToolkitRecord("0.12.0", None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ('["0.12.0"]', "not a JSON object"),
        ('{"version": "latest"}', "version 'latest' is not MAJOR.MINOR.PATCH"),
        ('{"version": "0.12"}', "is not MAJOR.MINOR.PATCH"),
        ('{"version": "0.12.0", "recorded": "yesterday"}', "date 'yesterday' is not YYYY-MM-DD"),
    ],
)
def test_a_record_that_is_not_one_says_why(text: str, problem: str) -> None:
    found = parse_record(text)
    assert found is not None and found.version is None and found.problem is not None
    assert problem in found.problem


def test_no_file_is_no_record() -> None:
    assert parse_record("") is None
    assert parse_serving(["toolkit "]).toolkit is None
    assert parse_serving(["user yes"]).toolkit is None


# -- what the plan says and writes ---------------------------------------------------------


def decide(found: ToolkitRecord | None, on_host: str | None = None) -> tv.VersionPlan:
    digests = {layout.TOOLKIT_RECORD: sha256(on_host)} if on_host is not None else {}
    return tv.decide(make_settings(), found, digests, TODAY, version="0.12.0")


def test_an_upgrade_names_both_versions_and_this_versions_entry() -> None:
    found = ToolkitRecord("0.11.0", "2026-12-04")
    plan = decide(found, record_text("0.11.0", "2026-12-04"))
    assert plan.change == "upgrade"
    assert plan.said == (f"upgrade from 0.11.0 (recorded 2026-12-04) to 0.12.0: see {ANCHOR}")
    assert plan.file.text == record_text("0.12.0", TODAY) and plan.file.changes is True
    assert plan.decision().what == "toolkit" and plan.decision().value == plan.said


def test_versions_compare_as_numbers() -> None:
    # As strings "0.9.0" > "0.12.0": that would call this upgrade a downgrade.
    assert decide(ToolkitRecord("0.9.0", "2026-12-03")).change == "upgrade"
    assert decide(ToolkitRecord("1.0.0", "2027-01-01")).change == "downgrade"


def test_a_downgrade_says_so() -> None:
    plan = decide(ToolkitRecord("0.13.0", "2027-01-02"), record_text("0.13.0", "2027-01-02"))
    assert plan.change == "downgrade"
    assert plan.said.startswith("downgrade from 0.13.0 (recorded 2027-01-02) to 0.12.0: ")
    assert ANCHOR in plan.said
    assert plan.file.text == record_text("0.12.0", TODAY) and plan.file.changes is True


def test_the_same_version_keeps_its_date_and_changes_nothing() -> None:
    on_host = record_text("0.12.0", "2026-12-01")
    plan = decide(ToolkitRecord("0.12.0", "2026-12-01"), on_host)
    assert plan.change == "same" and plan.said == "0.12.0 (recorded 2026-12-01), unchanged"
    # Another day's run writes the bytes the host holds: a converged re-run changes nothing.
    assert plan.file.text == on_host and plan.file.changes is False


def test_a_host_with_no_record_is_told_so_and_gets_one() -> None:
    plan = decide(None)
    assert plan.change == "none recorded"
    assert plan.said == (
        f"no toolkit version recorded (deployed before 0.12.0, or never): see {ANCHOR}"
    )
    assert plan.file.text == record_text("0.12.0", TODAY) and plan.file.changes is True
    assert plan.file.path == layout.TOOLKIT_RECORD and plan.file.name == tv.NAME


def test_an_unreadable_record_is_rewritten() -> None:
    found = parse_record('{"version": "latest"}')
    plan = decide(found, '{"version": "latest"}')
    assert plan.change == "unreadable" and layout.TOOLKIT_RECORD in plan.said
    assert plan.file.text == record_text("0.12.0", TODAY) and plan.file.changes is True


def test_the_plans_json_says_it() -> None:
    doc = decide(ToolkitRecord("0.11.0", "2026-12-04")).to_json()
    assert doc == {
        "version": "0.12.0",
        "recorded_version": "0.11.0",
        "recorded_date": "2026-12-04",
        "change": "upgrade",
        "changelog": ANCHOR,
        "said": doc["said"],
        "changes": True,
    }


# -- status ------------------------------------------------------------------------------------


def host(toolkit: ToolkitRecord | None) -> st.HostResult:
    return st.host_result("ct200", make_settings(dp_size=1), Serving(toolkit=toolkit))


@pytest.mark.parametrize(
    ("toolkit", "line", "json_value"),
    [
        (
            ToolkitRecord("0.12.0", TODAY),
            "deployed by toolkit 0.12.0 (recorded 2026-12-06)",
            {"version": "0.12.0", "recorded": TODAY, "problem": None},
        ),
        (None, "no toolkit version recorded (deployed before 0.12.0, or never)", None),
    ],
)
def test_status_shows_the_version_that_last_deployed_the_host(
    toolkit: ToolkitRecord | None, line: str, json_value: object
) -> None:
    result = host(toolkit)
    console = Console(record=True, width=120)
    st.print_results([result], console=console)
    assert f"  {line}\n" in console.export_text()
    doc = json.loads(json.dumps(st.to_json([result])))
    assert doc["hosts"]["ct200"]["toolkit"] == json_value


def test_the_upgrade_test_pins_the_commits_this_changelog_names() -> None:
    """tests/e2e/test_upgrade.py upgrades hosts earlier versions deployed: each (version,
    commit) it pins is the one CHANGELOG.md names under that version's heading."""
    from tests.e2e.test_upgrade import LAST_ON_SGLANG_ROUTER, PREVIOUS

    text = (ROOT / "CHANGELOG.md").read_text()
    for version, commit in (PREVIOUS, LAST_ON_SGLANG_ROUTER):
        entry = text.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
        assert f"`{commit[:7]}`" in entry, (version, commit)
