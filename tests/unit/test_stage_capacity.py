"""One capacity rule: capacity.stage_room decides in the plan, and the staging script, given the
rule's headroom on its command line (--headroom, from stage_command), refuses exactly where the
plan refuses, on the same numbers (a first copy into a tmpfs with `free` bytes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from operations.facts.host import Resources
from operations.facts.model import script_module
from operations.plan.capacity import STAGE_HEADROOM, stage_room
from operations.plan.model_plan import stage_command
from tests.unit.builders import make_settings

sm = script_module()


def model(root: Path) -> int:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    (root / "model.safetensors").write_bytes(os.urandom(100_000))
    return int(sm.scan(str(root))["bytes"])


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_the_script_refuses_where_the_plan_refuses(tmp_path: Path, extra: int) -> None:
    size = model(tmp_path / "src")
    free = int(size * STAGE_HEADROOM) + extra
    room = stage_room(make_settings(), Resources(stage_free_bytes=free), size, size, 0)
    shm = tmp_path / "shm"
    shm.mkdir()
    argv = stage_command(str(tmp_path / "src"), str(shm), "m", "beside", "manifest", None)
    headroom = float(argv[argv.index("--headroom") + 1])
    assert headroom == STAGE_HEADROOM

    def run() -> dict[str, object]:
        result: dict[str, object] = sm.stage(
            str(tmp_path / "src"),
            str(shm),
            "m",
            progress_interval=0,
            measure_free=lambda directory: free,
            headroom=headroom,
        )
        return result

    if room.mode is None:
        assert extra < 0
        with pytest.raises(sm.StageError, match=f"model needs {int(size * STAGE_HEADROOM)} bytes"):
            run()
        assert not (shm / "models" / "m").exists()
    else:
        assert room.mode == "beside" and extra >= 0
        assert run()["changed"] is True
        assert (shm / "models" / "m" / "model.safetensors").is_file()
