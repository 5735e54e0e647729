"""The plan's words (operations/plan/vocabulary.py: `Decision`, the `*Json` shapes) have one home,
and every module imports them from it: none re-exports them (issue 29, point 5). A re-export is a
second name for one thing, and what made the resolver package the place the plan's shapes were
imported from, with the import circle that came with it. Read from the source with `ast` (nothing
imported); tests, bench and scripts count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCABULARY = ROOT / "operations" / "plan" / "vocabulary.py"
HOME = "operations.plan.vocabulary"


def words() -> set[str]:
    """The names vocabulary.py defines at its top level."""
    tree = ast.parse(VOCABULARY.read_text())
    found = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def elsewhere(text: str, names: set[str]) -> list[str]:
    """Each import of one of `names` from a module that is not their home: `from M import N`,
    and `M.N` where M is a module of this project imported (`from operations import resolver`)."""
    tree = ast.parse(text)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "operations":
                continue
            for alias in node.names:
                if alias.name in names and node.module != HOME:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                elif alias.name not in names:
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.value, ast.Name)
            and node.value.id in modules - {"vocabulary"}
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_vocabulary_defines_the_plan_words() -> None:
    assert {"Decision", "PlanJson", "ServeJson"} <= words()


def test_the_finder_sees_both_spellings() -> None:
    text = (
        "from operations import resolver\n"
        "from operations.plan.resolver import Decision, Rank\n"
        "from operations.plan.vocabulary import PlanJson\n"
        "x: resolver.PlanJson\n"
        "y: resolver.Rank\n"
    )
    assert elsewhere(text, {"Decision", "PlanJson"}) == [
        "2: from operations.plan.resolver import Decision",
        "4: resolver.PlanJson",
    ]


def test_every_module_imports_the_plan_words_from_their_home() -> None:
    names = words()
    paths = [ROOT / "deploy.py", ROOT / "pve.py"]
    for folder in ("operations", "tests", "bench", "scripts", "inventory"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in paths
        if path != VOCABULARY
        for where in elsewhere(path.read_text(), names)
    ]
    assert not found, (
        "the plan's words are imported from operations.plan.vocabulary, not re-exported:\n"
        + "\n".join(found)
    )
