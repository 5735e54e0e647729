"""Offline, every engine gets exactly the builds its lock names for its lane, whatever else the
wheelhouse holds: one wheelhouse for a mixed fleet (cu128 and cu130 hosts of 0.5.19) holds
`sglang_kernel-0.4.6.post1+cu129` (the cu128 lane's build) beside `sglang_kernel-0.4.6.post1`
(the cu130 lane's), and `==0.4.6.post1` matches both (PEP 440 ignores the local label).

Real uv (the project's own, the version the deploy pins) locks the engine's offline project
from that wheelhouse and installs it with the engine step's own commands
(steps/engine.build_env, offline), into a real environment; the kernel wheels are the doubles
of tests/doubles/wheels.py at the knowledge base's pins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from operations import kb
from operations.layout import EngineTree
from operations.plan.engine_spec import EngineSpec, engine_spec, project_toml
from operations.programs.exact_pins import exact
from operations.steps.engine import build_env
from tests.doubles import wheels as doubles
from tests.unit.builders import make_settings

RELEASE = "0.5.19"
KERNEL = "sglang-kernel"
UV = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "uv"
LANES = ("cu128", "cu130")


def spec_of(lane: str) -> EngineSpec:
    return engine_spec(make_settings(sglang_version=RELEASE, cuda_lane=lane), kb.load(), "3.11")


def kernel_version(lane: str) -> str:
    pin = spec_of(lane).pin(KERNEL)
    assert pin is not None
    return pin.version


def mixed_wheelhouse(house: Path) -> list[str]:
    """Both lanes' kernel builds, as fill_wheelhouse leaves them from both locks."""
    for lane in LANES:
        version = kernel_version(lane)
        local = version.partition("+")[2]
        doubles.kernel_wheel(house, KERNEL, version, doubles.lane_cuda(local or lane))
    return sorted(p.name for p in house.glob("sglang_kernel-*.whl"))


def offline_project(lane: str, wheelhouse: str) -> str:
    """The engine's offline pyproject.toml (plan/engine_spec.project_toml), its dependencies
    cut to the kernel's: the rest of the release's closure is not what this test is about."""
    spec = spec_of(lane)
    real = tomllib.loads(project_toml(make_settings(cuda_lane=lane), spec, wheelhouse))
    kernel = [d for d in real["project"]["dependencies"] if d.startswith(KERNEL)]
    assert len(kernel) == 1, real["project"]["dependencies"]
    uv = real["tool"]["uv"]
    return "\n".join(
        [
            "[project]",
            'name = "sglang-engine"',
            'version = "0"',
            f'requires-python = "{real["project"]["requires-python"]}"',
            f'dependencies = ["{kernel[0]}"]',
            "[tool.uv]",
            "package = false",
            f"no-index = {str(uv['no-index']).lower()}",
            f'find-links = ["{uv["find-links"][0]}"]',
            "",
        ]
    )


def sh(command: str) -> str:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (command[:200], done.stdout, done.stderr)
    return done.stdout


def install_offline(root: Path, lane: str) -> str:
    """Lock the offline project as the engine step does (`uv lock` from the wheelhouse alone),
    then run build_env's offline commands; the kernel version the environment holds."""
    tree = EngineTree(str(root))
    name = spec_of(lane).name
    project = Path(tree.project(name))
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(offline_project(lane, tree.wheelhouse))
    sh(f"cd {project} && {tree.uv} lock --cache-dir {tree.cache} --offline --no-progress")
    for command in build_env._inner(str(root), name, "3.11", True):
        sh(str(command))
    env = tree.env(name)
    listed = sh(f"{tree.uv} pip list --python {env}/bin/python --format freeze --offline")
    found = dict(line.split("==", 1) for line in listed.split())
    return found[KERNEL]


@pytest.mark.integration
def test_a_mixed_fleets_wheelhouse_gives_each_lane_its_own_kernel_build(tmp_path: Path) -> None:
    if not UV.exists() or shutil.which("python3.11") is None:
        pytest.fail("needs the project's uv (.venv/bin/uv) and a system python3.11")
    house = tmp_path / "wheelhouse"
    assert mixed_wheelhouse(house) == [
        "sglang_kernel-0.4.6.post1+cu129-py3-none-any.whl",
        "sglang_kernel-0.4.6.post1-py3-none-any.whl",
    ]
    for lane in LANES:
        root = tmp_path / lane
        tree = EngineTree(str(root))
        Path(tree.uv).parent.mkdir(parents=True)
        os.symlink(UV, tree.uv)
        os.symlink(house, tree.wheelhouse)  # the synced wheelhouse, as the host has it
        assert install_offline(root, lane) == kernel_version(lane), lane


def test_every_pin_is_made_exact_and_nothing_else() -> None:
    assert exact("sglang-kernel==0.4.6.post1") == "sglang-kernel===0.4.6.post1"
    assert exact("torch==2.11.0+cu130 ; sys_platform == 'linux' \\") == (
        "torch===2.11.0+cu130 ; sys_platform == 'linux' \\"
    )
    assert exact("sglang[all]==0.5.19") == "sglang[all]===0.5.19"
    for kept in ("    --hash=sha256:ab", "a===1", "cuda-python>=13.0", "# x==1", ""):
        assert exact(kept) == kept
    # The offline project pins exactly; the online one as the knowledge base says.
    spec = spec_of("cu130")
    offline = tomllib.loads(project_toml(make_settings(), spec, "/opt/sglang/wheelhouse"))
    online = tomllib.loads(project_toml(make_settings(), spec, None))
    assert f"{KERNEL}===0.4.6.post1" in offline["project"]["dependencies"]
    assert f"{KERNEL}==0.4.6.post1" in online["project"]["dependencies"]
