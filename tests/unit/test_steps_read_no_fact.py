"""The serve and smoke steps carry out their plan (issue 29): nothing in operations/steps/serve.py
or
operations/steps/smoke.py asks a fact (`host.get_fact`), reads the ServingState fact the plan kept
(`report.serving`, a `Serving`), or hands an operation a fact value (`sha256_now=` from a
fact); and no operation of theirs has a parameter that names a fact's reading. What a step
needs of the host's state is in the ServePlan (operations/plan/serve_plan.py), decided in
host_plan.decide.

Read from the source with `ast` (nothing is imported): a step that picked a slice of a fact
itself (how the drain script came to be rewritten on every converged run) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = [
    ROOT / "operations/steps/serve.py",
    ROOT / "operations/steps/smoke.py",
    ROOT / "operations/steps/users.py",
]
# Names a fact's value goes by (the ServingState fact, its parts, a FileAt reading).
FACT_NAMES = {"serving", "Serving", "get_fact", "facts", "files_now"}
# Parameters an operation took fact values with before issue 29.
FACT_PARAMETERS = {"sha256_now", "installed", "exists", "now", "state"}


def _is_operation(node: ast.FunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id == "operation":
            return True
    return False


def offences(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and node.attr in FACT_NAMES:
            found.append(f"{name}:{line}: reads .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FACT_NAMES:
            found.append(f"{name}:{line}: names {node.id}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("operations.facts", "pyinfra.facts")
        ):
            found.append(f"{name}:{line}: imports {node.module}")
        elif isinstance(node, ast.keyword) and node.arg == "sha256_now":
            if not (isinstance(node.value, ast.Constant) and node.value.value in (None, False)):
                found.append(f"{name}:{line}: hands an operation sha256_now=<a value>")
        elif isinstance(node, ast.FunctionDef) and _is_operation(node):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg in FACT_PARAMETERS:
                    found.append(f"{name}:{line}: operation {node.name} takes {arg.arg}")
    return found


def test_the_serve_and_smoke_steps_read_no_fact() -> None:
    found = [o for path in STEPS for o in offences(path.read_text(), path.name)]
    assert found == []


def test_the_check_finds_each_way_of_reading_a_fact() -> None:
    """Each pattern the check is for, in a module that does all of them (the serve step as it
    was before issue 29)."""
    source = """
from operations.facts.serve import Serving
from pyinfra.api.operation import operation

@operation()
def router_env(env_dir: str, installed: bool) -> None:
    yield "true"

def route(report, plan):
    files = report.serving.files
    put_file(name="unit", src=plan.unit, dest="/x", sha256_now=files.get("/x"))
    put_file(name="fresh", src="", dest="/y", sha256_now=None)
    host.get_fact(FileAt, path="/x")
"""
    found = offences(source, "old.py")
    assert found == [
        "old.py:2: imports operations.facts.serve",
        "old.py:6: operation router_env takes installed",
        "old.py:10: reads .serving",
        "old.py:11: hands an operation sha256_now=<a value>",
        "old.py:13: reads .get_fact",
    ], found
