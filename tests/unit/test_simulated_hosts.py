"""The simulated hosts of the quick start (operations/simulated/): product, not tests. Their
answers are what the facts' own commands print, and the demos run from any directory with the
repository's settings (pyinfra puts only the working directory on sys.path and reads group_data/
from there and beside the inventory: pyinfra_cli/main.py, cli.py `_setup_state`,
inventory.py `make_inventory_from_files`, pyinfra 3.10)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from operations.runtime.inventory import open_session
from operations.simulated import ct200, group_data
from tests.doubles.ct200 import nvidia_smi_output

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = ROOT / ".venv" / "bin" / "pyinfra"


def test_the_simulated_ct200_shows_what_the_gpu_fact_prints_over_the_captured_nvidia_smi() -> None:
    """captured/ct200/nvidia-gpus.txt is the NvidiaGpus fact's command run against the nvidia-smi
    double replaying rtx-pro-6000-x8: a change to either makes it stale."""
    assert ct200.captured("nvidia-gpus.txt") == nvidia_smi_output("rtx-pro-6000-x8"), (
        "make it again: .venv/bin/python -m tests.doubles.ct200 rtx-pro-6000-x8 > "
        "operations/simulated/captured/ct200/nvidia-gpus.txt"
    )


def test_group_data_is_read_as_pyinfras_cli_reads_it(tmp_path: Path) -> None:
    """The same values as pyinfra's own reader (pyinfra_cli/inventory.py `_get_group_data`,
    pyinfra 3.10): imported names and dunders left out, `__all__` obeyed."""
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import _get_group_data

    (tmp_path / "all.py").write_text(
        "import os\nfrom pathlib import Path\n__doc__ = 'x'\n"
        "cuda_lane = 'cu130'\n_private = 1\nports = [1, 2]\nroot = Path('/srv')\n"
    )
    (tmp_path / "gpus.py").write_text("__all__ = ['dp_size']\ndp_size = 4\nhidden = 1\n")
    with ctx_state.use(State(check_for_changes=False)):
        pyinfras = _get_group_data(str(tmp_path))
    assert pyinfras["all"]["cuda_lane"] == "cu130", "pyinfra's reader changed: read it again"
    for group in ("all", "gpus"):
        assert group_data.read(group, tmp_path) == pyinfras[group]
    assert group_data.read("gpus", tmp_path) == {"dp_size": 4}
    assert group_data.read("none", tmp_path) == {}


def test_the_demo_reads_the_repositorys_settings_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run elsewhere, the demo has group_data/all.py's settings; a group_data/ of the working
    directory still overrides them, as pyinfra merges it over an inventory's group data."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("model_name = 'Org/Other-7B'\n")
    monkeypatch.chdir(tmp_path)
    session = open_session(str(ROOT / "inventory" / "demo.py"), {})
    assert session.problems == {}, session.problems
    settings = session.settings["@fake/ct200"]
    assert settings.model_name == "Org/Other-7B"
    repo = group_data.read("all")
    assert (settings.sglang_version, settings.cuda_lane) == (
        repo["sglang_version"],
        repo["cuda_lane"],
    )
    assert str(settings.model_source) == repo["model_source"]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("inventory", "deploy", "shown"),
    [
        ("demo.py", "deploy.py", ["--attention-backend flashinfer", "sglang@{0-7}.service"]),
        ("pve_demo.py", "pve.py", ["--dev9 /dev/nvidia-uvm,mode=0666", "pct reboot 200"]),
        ("demo_day2.py", "deploy.py", ["nothing to restart", "staged copy matches the source"]),
    ],
)
def test_the_demos_run_from_another_directory(
    tmp_path: Path, inventory: str, deploy: str, shown: list[str]
) -> None:
    """`pyinfra /path/to/inventory/demo.py /path/to/deploy.py --dry` from any directory: the
    toolkit is found, the simulated host answers, the repository's settings apply."""
    result = subprocess.run(
        [str(PYINFRA), str(ROOT / "inventory" / inventory), str(ROOT / deploy), "--dry"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Traceback" not in out and "Error" not in out, out
    for text in shown:  # our lines wrap at the terminal's width: read as prose
        assert text in " ".join(out.split()), out
