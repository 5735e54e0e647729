"""The README is what users read first: it must not drift from the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from operations.settings import schema

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "reference" / "settings.md").read_text()
TROUBLESHOOTING = (ROOT / "docs" / "reference" / "troubleshooting.md").read_text()


def quick_path() -> list[tuple[list[str], str]]:
    """The README's numbered quick path: each step's commands and what it says it prints."""
    quick = README.split("## Quick path", 1)[1].split("\n## ", 1)[0]
    steps = re.split(r"^\d+\. ", quick, flags=re.M)[1:]
    found = []
    for step in steps:
        block = re.search(r"```sh\n(.*?)```", step, re.S)
        assert block is not None, step
        lines = [ln.strip() for ln in block.group(1).replace("\\\n", " ").splitlines()]
        found.append(([ln for ln in lines if ln], step.split("```", 2)[2]))
    return found


def test_the_quick_path_is_numbered_commands_each_with_what_it_prints() -> None:
    steps = quick_path()
    assert 6 <= len(steps) <= 9, len(steps)
    commands = [c for cs, _ in steps for c in cs if not c.startswith("export ")]
    assert commands[0] == "make venv" and "make api-key" in commands
    assert ".venv/bin/pyinfra inventory/ct200.py deploy.py --dry" in commands
    assert ".venv/bin/pyinfra inventory/ct200.py deploy.py -y" in commands
    assert ".venv/bin/python -m operations.status inventory/ct200.py" in commands
    for cs, after in steps:
        assert re.search(r"\b(Prints|prints|reads|lists|Ends with|A box)\b", after), cs
    makefile = (ROOT / "Makefile").read_text()
    for target in ("venv", "api-key", "demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_make_venv_builds_the_venv_alone() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = makefile.split("\nvenv:", 1)[1].split("\n\n", 1)[0]
    prerequisites, *recipe = rule.split("\n")
    assert prerequisites.split() == ["$(BIN)/.synced"], rule
    assert [line.split()[0] for line in recipe] == ["@echo"], recipe  # builds, says so, no more


def test_what_the_quick_path_says_it_prints_is_what_the_programs_print(tmp_path: Path) -> None:
    from operations.cli.api_key import make_key

    steps = {cs[-1]: after for cs, after in quick_path()}
    said = " ".join(steps["make api-key"].split())
    printed = make_key(tmp_path / "locks" / "api.key").replace(str(tmp_path) + "/", "")
    assert f"Prints `{printed}`" in said, (said, printed)
    venv = re.search(r'@echo "(venv: .*)"', (ROOT / "Makefile").read_text())
    assert venv is not None
    expected = venv.group(1).replace("$(VENV)", ".venv").replace("$(BIN)", ".venv/bin")
    assert f"Prints `{expected}`" in steps["make venv"]


def test_every_setting_is_documented_with_its_default() -> None:
    """docs/reference/settings.md has a row for every key of
    operations/settings/settings.schema.json
    (read here, so a key another change adds needs only its row: `| `key` | `default` | meaning |`)
    and none for a key the schema no longer has."""
    main_table = CONFIGURATION.split("\n## ", 1)[0]
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([a-z_]+)` \| (.*?) \|", main_table, re.M)
    }
    props = schema()["properties"]
    missing = sorted(set(props) - set(rows))
    assert not missing, f"keys of settings.schema.json not in docs/reference/settings.md: {missing}"
    assert set(rows) == set(props), f"rows for no key: {sorted(set(rows) - set(props))}"
    for key, prop in props.items():
        expected = f"`{json.dumps(prop['default'])}`" if "default" in prop else "(required)"
        assert rows[key] == expected, key


def test_the_router_and_rollout_sub_tables_hold_every_key_with_its_default() -> None:
    """The `router` and `rollout` keys each have a row of their own (a sub-table, not a cell of
    300 words), whose default is the dataclass's (operations/settings: one place)."""
    import dataclasses

    from operations.settings import Rollout, Router

    for heading, cls in (("## The router's keys", Router), ("## `rollout`", Rollout)):
        table = CONFIGURATION.split(heading, 1)[1].split("\n## ", 1)[0]
        documented: dict[str, str] = {}
        for m in re.finditer(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*) \| (.*?) \|", table, re.M):
            keys = re.findall(r"`([a-z_]+)`", m.group(1))
            defaults = re.findall(r"`([^`]*)`", m.group(2))
            documented.update(zip(keys, defaults, strict=True))
        fields = {f.name: f.default for f in dataclasses.fields(cls) if f.name != "host"}
        assert set(documented) == set(fields), (heading, set(fields) ^ set(documented))
        for key, default in fields.items():
            assert documented[key] == json.dumps(default), (key, documented[key], default)


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_preflight_check_is_in_the_troubleshooting_table() -> None:
    import ast

    plan = ROOT / "operations" / "plan"
    checks = set()
    # Each check's Failure(...), as before the split: the GPU access checks were never listed.
    tree = ast.parse((plan / "preflight.py").read_text())
    skipped = [n for n in tree.body if getattr(n, "name", None) == "access_failures"]
    assert skipped, "preflight.access_failures moved: update this test"
    kept = [n for n in tree.body if n not in skipped]
    kept += ast.parse((plan / "preflight_source.py").read_text()).body
    for node in (inner for top in kept for inner in ast.walk(top)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Failure" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                checks.add(first.value)
            elif isinstance(first, ast.JoinedStr):
                # f"{s.model_stage_dir} size": the README names it with the default dir.
                parts = [v.value for v in first.values if isinstance(v, ast.Constant)]
                tail = "".join(str(part) for part in parts).strip()
                checks.add(f"/dev/shm {tail}")
    assert len(checks) >= 12, checks
    table = TROUBLESHOOTING.split("## Preflight failures", 1)[1]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| ")]
    for check in checks:
        assert any(check in row for row in rows), f"{check!r} is not in the troubleshooting table"


# -- the README is a quick start ----------------------------------------------------------------

QUICK_START_ORDER = [
    "## Quick path",
    "### What has been proven, and on what",
    "## Prerequisites",
    "## First request",
    "## Day-2",
    "## Where to go next",
]


def test_the_readme_is_a_short_quick_start_in_the_newcomers_order() -> None:
    assert len(README.encode()) <= 16 * 1024, len(README.encode())
    headings = [ln for ln in README.splitlines() if ln.startswith("#")]
    at = [
        next(i for i, h in enumerate(headings) if h.startswith(want)) for want in QUICK_START_ORDER
    ]
    assert at == sorted(at), headings
    for need in ("/dev/shm", "52 GiB", "82 GiB", "root", "model_source"):
        assert need in README.split("## Prerequisites", 1)[1].split("\n## ", 1)[0], need
    request = README.split("## First request", 1)[1].split("\n## ", 1)[0]
    assert "curl" in request and "from openai import OpenAI" in request
    assert ":30000/v1" in request and ":8000/v1" in request  # one rank, and the router
    assert "Not yet proven on real GPUs" in README


def test_commands_are_spelt_one_way() -> None:
    """Every shell line in the README and the docs runs the venv's tools by their .venv/bin
    path (the README says so once): no bare `python -m`, `pyinfra` or `python scripts/`."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench/README.md"]
    for doc in docs:
        text = doc.read_text()
        for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S):
            for line in block.splitlines():
                words = line.split("#")[0].split()
                if not words or words[0] in ("export", "make", "curl", "-H", "-d", "ssh"):
                    continue
                if words[0] in ("python", "python3", "pyinfra", "uv"):
                    raise AssertionError(f"{doc.name}: {line!r} should start with .venv/bin/")
        for bare in re.findall(r"`(python -m [a-z.]+|python scripts/[a-z_]+\.py)", text):
            raise AssertionError(f"{doc.name}: `{bare}` should be `.venv/bin/{bare}`")


def test_the_moved_sections_live_where_the_readme_points() -> None:
    assert "## Configuration reference" not in README
    assert "## Troubleshooting: hostile inputs" in TROUBLESHOOTING
    assert "| `bench/serve_bench.py` |" in (ROOT / "bench" / "README.md").read_text()
    assert "](bench/README.md)" in README


def test_make_help_lists_every_target_and_is_the_default() -> None:
    """`make` alone prints the targets (the first rule is make's default goal), one line each."""
    makefile = (ROOT / "Makefile").read_text()
    phony = {
        name
        for line in makefile.splitlines()
        if line.startswith(".PHONY:")
        for name in line.split(":", 1)[1].split()
    }
    rules = [m.group(1) for m in re.finditer(r"^([\w$(][\w$().\/-]*):(?!=)", makefile, re.M)]
    assert rules[0] == "help", rules[:3]
    helped = set(re.findall(r'^\t@echo "make (\S+)', makefile, re.M))
    assert phony - {"help"} == helped, (phony - helped, helped - phony)


def test_the_docs_name_the_releases_and_pythons_the_knowledge_base_holds() -> None:
    """The supported releases and the Pythons are read off the knowledge base, not kept by hand:
    a new release or Python fails here until the docs say it."""
    from operations import kb

    knowledge = kb.load()
    releases = knowledge.supported_releases()
    (row,) = [ln for ln in CONFIGURATION.splitlines() if ln.startswith("| `sglang_version` |")]
    assert f"{releases[0]} to {releases[-1]}" in row, row
    pythons = sorted({v for r in releases for v in knowledge.releases[r].python.versions})
    (python_row,) = [ln for ln in TROUBLESHOOTING.splitlines() if ln.startswith("| Python |")]
    assert f"{' and '.join(pythons)} for every release today" in python_row, python_row
    for r in releases:
        assert list(knowledge.releases[r].python.versions) == pythons, r


def test_no_doc_names_an_internal_issue_number() -> None:
    """A reader cannot look up the team's issue numbers: the docs say what, not which issue."""
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for m in re.finditer(
            r"\(issue \d+|issue \d+'s|of issue \d+|\bissue \d+, point", path.read_text()
        )
    ]
    assert not found, found
