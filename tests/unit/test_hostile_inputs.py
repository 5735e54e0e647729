"""The hostile-inputs table (docs/reference/troubleshooting.md) is a test: every row's value is
refused, in one line that names the key and holds the row's text, and no URL credential reaches
the message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from operations.settings import Layer, SettingsError, controller_problems, load

ROOT = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = ROOT / "docs" / "reference" / "troubleshooting.md"
SECTION = TROUBLESHOOTING.read_text().split("## Troubleshooting: hostile inputs", 1)[1]
ROWS = re.findall(r"^\| `(\{.*?\})` \| (.+?) \| .* \|$", SECTION.split("\n## ", 1)[0], re.M)
CONTROLLER_FILES = {
    "<empty file>": "",
    "<whitespace-only file>": " \n\t\n",
    "<two-line file>": "key-one\nkey-two\n",
}
CREDENTIAL = "tok3n"


def problems(data: dict[str, Any], tmp_path: Path) -> list[str]:
    placeholder = data.get("api_key_file")
    if placeholder == "<missing file>":
        data["api_key_file"] = str(tmp_path / "no-such-key")
    elif placeholder in CONTROLLER_FILES:
        key_file = tmp_path / "api-key"
        key_file.write_text(CONTROLLER_FILES[placeholder])
        data["api_key_file"] = str(key_file)
    try:
        settings = load("ct200", [Layer("group_data/all.py", {"model_source": "/m/x", **data})])
    except SettingsError as exc:
        return exc.problems
    return controller_problems("ct200", settings)


def test_the_table_lists_at_least_25_hostile_inputs() -> None:
    assert len(ROWS) >= 25, ROWS
    assert len({row[0] for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize(("value", "refusal"), ROWS, ids=[r[0][:60] for r in ROWS])
def test_each_hostile_input_is_refused_as_the_readme_says(
    value: str, refusal: str, tmp_path: Path
) -> None:
    data = json.loads(value)
    (line,) = problems(data, tmp_path)
    key = next(iter(data))
    assert line.startswith(f"ct200: {key} ") and refusal in line, line
    assert "\n" not in line and CREDENTIAL not in line, line
