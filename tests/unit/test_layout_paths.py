"""docs/how-it-works/architecture.md: "layout.py is the one home of names and paths". This test
reads every module under operations/ (the host scripts in operations/programs/ aside: they run on
the host without this package and get their paths as arguments) and finds no string literal,
f-string part included, that spells a path or name the deploy manages on a host: those come from
operations/layout.py (EngineTree, StageTree, the unit names, the device-node list)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "operations"

# What a literal outside layout.py may not spell: each is one of layout's names or paths.
MANAGED = {
    "an engine environment (EngineTree.env)": r"(^|/)envs/",
    "an interpreter (layout.env_python)": r"/bin/python",
    "uv or pip under ENGINE_ROOT/tools (EngineTree.uv)": r"tools/bin/",
    "uv's cache (EngineTree.cache)": r"^/cache($|/)",
    "the wheelhouse on the host (EngineTree.wheelhouse)": r"/wheelhouse($|/)",
    "the current link (EngineTree.current)": r"/current($|/)|\.current\.",
    "a CUDA compiler (EngineTree.toolkit)": r"/cuda/",
    "an engine project (EngineTree.project)": r"/projects/",
    "the router's environment (EngineTree.router_env_dir)": r"/router/",
    "the package sources (EngineTree.uv_config, pip_config)": r"/uv\.toml|/pip\.conf",
    "the target unit (layout.TARGET)": r"\bsglang\.target\b",
    "a rank unit (layout.unit_name)": r"\bsglang@",
    "the router or stage unit (layout.ROUTER_UNIT, STAGE_UNIT)": (
        r"sglang-(router|stage-model)\.service(?!\.j2)"
    ),
    "a deploy directory (layout.CONFIG_DIR, SCRIPT_DIR, MONITORING_DIR, UNIT_DIR)": (
        r"/etc/sglang|/usr/local/lib/sglang|/etc/systemd/"
    ),
    "a GPU device node (layout.gpu_node, CUDA_NODES)": r"/dev/nvidia",
    "a staged model copy (StageTree)": r"/models/|/models$",
    "the service user's home (layout.service_home)": r"/var/lib/",
    "the hub download marker (layout.HUB_MARKER)": r"sglang-hub-complete",
    "a cache of the deploy's (layout.PVE_DRIVER_CACHE)": r"/var/cache/sglang",
    "an engine's lock on the host (layout.LOCK_FILE, EngineTree.project_lock)": r"/uv\.lock",
    "an environment's marker (layout.ENGINE_MARKER)": r"sglang-deploy\.json",
    "the hub token (layout.HUB_TOKEN_FILE)": r"/hub/token",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def literals(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (f-string parts included), docstrings aside."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def offences(path: Path) -> list[str]:
    found = []
    for line, text in literals(path):
        for what, pattern in MANAGED.items():
            if re.search(pattern, text):
                found.append(f"{path.relative_to(ROOT)}:{line}: {text[:80]!r} spells {what}")
    return found


SOURCES = sorted(
    p for p in OPERATIONS.rglob("*.py") if p.name != "layout.py" and "programs" not in p.parts
)


def test_the_sources_are_found() -> None:
    names = {p.relative_to(OPERATIONS).as_posix() for p in SOURCES}
    assert {
        "steps/serve.py",
        "steps/engine.py",
        "facts/serve.py",
        "facts/engine.py",
        "render/units.py",
    } <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(OPERATIONS).as_posix())
def test_no_managed_path_outside_layout(path: Path) -> None:
    assert offences(path) == []


def test_the_search_finds_what_it_names(tmp_path: Path) -> None:
    """Each pattern catches the literal it is for, in a plain string and an f-string part."""
    module = tmp_path / "spelled.py"
    module.write_text(
        '"""A docstring may say /opt/sglang/envs/x/bin/python."""\n'
        'PY = f"{root}/envs/{name}/bin/python"\n'
        'UNIT = "sglang@0.service"\n'
        'NODE = "/dev/nvidiactl"\n'
        "TARGET = 'sglang.target'\n"
        'OK = "sglang-router.service.j2"\n'
    )
    found = []
    for line, text in literals(module):
        found += [(line, what) for what, p in MANAGED.items() if re.search(p, text)]
    assert sorted(found) == [
        (2, "an engine environment (EngineTree.env)"),
        (2, "an interpreter (layout.env_python)"),
        (3, "a rank unit (layout.unit_name)"),
        (4, "a GPU device node (layout.gpu_node, CUDA_NODES)"),
        (5, "the target unit (layout.TARGET)"),
    ]
