"""No import circles in operations/: every import counts, function-local and TYPE_CHECKING ones too.

A circle hidden behind a local import or `if TYPE_CHECKING:` is still one: the two modules cannot
be read, tested or changed apart. The graph is built from the source with `ast` (nothing is
imported): a relative import is resolved against its package; `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg`. Importing `a.b.c` runs `a/__init__.py` too; that
implicit edge is not counted (a package whose `__init__` re-exports its submodules would be one
circle with all of them), but a submodule that imports a name from its own package's `__init__`
is an edge to it, and a circle when that `__init__` imports the submodule back. The host
scripts in operations/programs/ run on the host with the stdlib only and are not modules of the
package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "operations"
HOST_SCRIPTS = ROOT / PACKAGE / "programs"


def _module_name(path: Path) -> str:
    return _module_name_in(ROOT, path)


def _module_name_in(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if HOST_SCRIPTS in path.parents:
            continue
        found[_module_name(path)] = path
    return found


def _module(name: str, known: dict[str, Path]) -> set[str]:
    return {name} if name in known else set()


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.update(_module(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                edges.update(_module(sub if sub in known else target, known))
    edges.discard(name)
    return edges


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The parser itself, on a made-up package: each kind of import is an edge."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    files = {
        "pkg/__init__.py": "",
        "pkg/words.py": "",
        "pkg/other.py": "",
        "pkg/sub/__init__.py": "from pkg.sub.deep import thing\n",
        "pkg/sub/deep.py": "thing = 1\n",
        "pkg/sub/user.py": (
            "from typing import TYPE_CHECKING\n"
            "import json\n"
            "from . import deep\n"  # relative, a module
            "from .. import words\n"  # two levels up, a module
            "from ..sub import thing\n"  # a name: an edge to the package
            "if TYPE_CHECKING:\n"
            "    from pkg.other import Name\n"
            "def f():\n"
            "    import pkg.words as w\n"  # function-local
            "    from pkg import nothing_such\n"  # a name of pkg's __init__
        ),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    known = {_module_name_in(tmp_path, tmp_path / name): tmp_path / name for name in files}
    user = imports_of("pkg.sub.user", tmp_path / "pkg/sub/user.py", known)
    assert user == {"pkg", "pkg.words", "pkg.other", "pkg.sub", "pkg.sub.deep"}
    assert imports_of("pkg.sub", tmp_path / "pkg/sub/__init__.py", known) == {"pkg.sub.deep"}
    # and on the real tree: `from operations import layout` is the module layout
    assert "operations.layout" in graph()["operations.plan.serve_plan"]


def test_circles_are_found() -> None:
    """The finder on a made-up graph: two circles and a tail."""
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert circles(edges) == [["a", "b"], ["c", "d"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    found = circles(graph())
    assert not found, "import circles in operations/ (every import counts):\n" + "\n".join(
        " <-> ".join(members) for members in found
    )


def test_the_vocabulary_imports_nothing_of_the_package() -> None:
    """The plan's words (operations/plan/vocabulary.py) are what every plan module may import: were
    it to import one of them, the circle would be back one step removed."""
    assert graph()["operations.plan.vocabulary"] == set()
