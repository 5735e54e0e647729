"""The serve and smoke steps carry out their plan (issue 29): nothing in operations/steps/serve.py
or operations/steps/smoke.py asks a fact (`host.get_fact`), reads the ServingState fact the plan
kept (`report.serving`, a `Serving`), or hands an operation a fact value (`sha256_now=` from a
fact); and no operation of theirs has a parameter that names a fact's reading. What a step
needs of the host's state is in the ServePlan (operations/plan/serve_plan.py), decided in
host_plan.decide.

The check sees through helpers (issue 36): every function a step module calls that is defined
in operations/ (host_files.line_writer, put_planned, ...) is read too, and what it calls in
turn. An operation it reaches is where the check stops: an operation may ask its own fact, as
pyinfra's files.put does (put_file reads FileAt for a secret's mode and owners), and it is
called with the plan's values (the parameters above are refused).

Read from the source with `ast` (nothing is imported): a step that picked a slice of a fact
itself (how the drain script came to be rewritten on every converged run) fails here."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["operations.steps.serve", "operations.steps.smoke", "operations.steps.users"]
# Names a fact's value goes by (the ServingState fact, its parts, a FileAt reading).
FACT_NAMES = {"serving", "Serving", "get_fact", "facts", "files_now"}
# Parameters an operation took fact values with before issue 29.
FACT_PARAMETERS = {"sha256_now", "installed", "exists", "now", "state"}
# Helpers the check does not enter, each with why: what they read is shown, never decided on.
SHOWN_ONLY = {
    # Under --diff, inside the operation that writes the plan's file (a roll batch), the old
    # lines are read to show the change, as put_file shows its own.
    "operations.steps.host_files.show_change",
}

Loader = Callable[[str], "str | None"]


def _is_operation(node: ast.FunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id == "operation":
            return True
    return False


def offences(source: str, name: str) -> list[str]:
    """What a module's own text does: every way of reading a fact, anywhere in it."""
    return _offences(ast.parse(source), name)


def _offences(tree: ast.AST, name: str) -> list[str]:
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


def _module(module: str, load: Loader) -> ast.Module | None:
    source = load(module)
    return ast.parse(source) if source is not None else None


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _imported(tree: ast.Module) -> dict[str, str]:
    """Local name -> the operations.* module it is imported from (`from M import name`)."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("operations."):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _called(node: ast.AST) -> set[str]:
    return {
        c.func.id
        for c in ast.walk(node)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    }


def reached(module: str, load: Loader) -> list[str]:
    """The offences of the helpers `module` calls, followed through every operations/ module
    they are defined in; operations and SHOWN_ONLY stop the walk."""
    found: list[str] = []
    seen: set[str] = set()
    todo = [(module, name) for name in _called(_module(module, load) or ast.Module([], []))]
    while todo:
        where, name = todo.pop()
        tree = _module(where, load)
        if tree is None:
            continue
        if name not in _functions(tree):
            target = _imported(tree).get(name)
            if target is None:
                continue
            where, name = target.rsplit(".", 1)
            tree = _module(where, load)
            if tree is None or name not in _functions(tree):
                continue
        qualified = f"{where}.{name}"
        if qualified in seen or qualified in SHOWN_ONLY:
            continue
        seen.add(qualified)
        function = _functions(tree)[name]
        if _is_operation(function):
            continue
        if where != module:
            found += _offences(function, f"{qualified}")
        todo += [(where, called) for called in _called(function)]
    return sorted(found)


def _from_tree(module: str) -> str | None:
    path = ROOT / (module.replace(".", "/") + ".py")
    return path.read_text() if path.is_file() else None


def test_the_serve_and_smoke_steps_read_no_fact() -> None:
    found = [o for m in STEPS for o in offences(_from_tree(m) or "", m)]
    assert found == []


def test_the_helpers_they_call_read_no_fact() -> None:
    found = [o for m in STEPS for o in reached(m, _from_tree)]
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


def test_the_check_sees_through_helpers() -> None:
    """A helper that asks a fact, two calls away in another module (line_writer's `diff=True`
    as it was before issue 36), is found; an operation's own fact is not."""
    modules = {
        "operations.steps.step": """
from operations.steps.files import writer, put

def roll(plan):
    writer(plan.unit)
    put(name="unit", src=plan.unit)
""",
        "operations.steps.files": """
from pyinfra.facts.files import FileContents

@operation()
def put(src):
    host.get_fact(FileAt, path="/x")
    yield "true"

def writer(src, diff=True):
    return _show(src) if diff else src

def _show(src):
    return host.get_fact(FileContents, path="/x")
""",
    }
    found = reached("operations.steps.step", modules.get)
    assert found == ["operations.steps.files._show:13: reads .get_fact"], found
