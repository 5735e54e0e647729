"""deploy.py asks for the deploy lock before it imports the rest of the toolkit, and what it
imports to ask is light: the host takes the lock while the controller imports (~65 ms of a
converged deploy, bench/serve_bench.py). Either broken, the lock's round trip is paid again."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the plan and the steps import, and the lock must not wait for.
HEAVY = (
    "operations.plan.host_plan",
    "operations.kb",
    "operations.plan.resolver",
    "rich",
    "jsonschema",
)


def test_deploy_py_asks_for_the_lock_before_importing_the_steps() -> None:
    tree = ast.parse((ROOT / "deploy.py").read_text())
    asked = next(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "deploy_lock.ask"
    )
    steps = [
        node.lineno
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and node.module
        in ("operations.steps.engine", "operations.runtime.plan_step", "operations.steps.serve")
    ]
    assert steps and all(asked < line for line in steps)


@pytest.mark.integration
def test_asking_for_the_lock_imports_nothing_heavy() -> None:
    code = (
        "import sys, operations.runtime.deploy_lock\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
