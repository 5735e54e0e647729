"""The README is what users read first: it must not drift from the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from operations.settings import schema

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_quick_start_is_exactly_the_two_make_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert block is not None
    commands = [ln.split("#")[0].strip() for ln in block.group(1).splitlines() if ln.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_setting_is_documented_with_its_default() -> None:
    reference = README.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \| (.*?) \|", reference, re.M)
    }
    props = schema()["properties"]
    assert set(rows) == set(props)
    for key, prop in props.items():
        expected = f"`{json.dumps(prop['default'])}`" if "default" in prop else "(required)"
        assert rows[key] == expected, key


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_preflight_check_is_in_the_troubleshooting_table() -> None:
    import ast

    source = (ROOT / "operations" / "preflight.py").read_text()
    checks = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fail" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                checks.add(first.value)
            elif isinstance(first, ast.JoinedStr):
                # f"{s.model_stage_dir} size": the README names it with the default dir.
                parts = [v.value for v in first.values if isinstance(v, ast.Constant)]
                tail = "".join(str(part) for part in parts).strip()
                checks.add(f"/dev/shm {tail}")
    assert len(checks) >= 12, checks
    table = README.split("## Troubleshooting", 1)[1]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| ")]
    for check in checks:
        assert any(check in row for row in rows), f"{check!r} is not in the troubleshooting table"
