"""The ServingState fact checksums every managed file with one `sha256sum` (GNU coreutils,
run here for real): each file read back under its own path, a name with a backslash or a
space included (sha256sum escapes the first), a missing file absent."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from operations.facts.serve import ServingState, parse_serving

pytestmark = pytest.mark.integration  # runs the ServingState fact's command


def test_every_managed_file_is_read_back_under_its_path(tmp_path: Path) -> None:
    names = ["wait_healthy.py", "odd\\name.json", "with space.yaml"]
    paths = []
    for name in names:
        path = tmp_path / name
        path.write_text(f"content of {name}\n")
        paths.append(str(path))
    missing = str(tmp_path / "secrets.yaml")
    command = ServingState().command(
        engine_root=str(tmp_path / "engine"),
        model_link=str(tmp_path / "models" / "m"),
        paths=[*paths, missing],
        ranks=[],
        router=False,
    )
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )

    files = parse_serving(out.stdout.splitlines()).files

    assert files == {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}
    assert any(line.startswith("file \\") for line in out.stdout.splitlines())
