"""Issue 36: the folders read as the architecture (docs/how-it-works/architecture.md's opening
picture, which names every one of them), and each piece fits in a head. Read from the source
(nothing imported):

- product code (operations/, deploy.py, pve.py, inventory/, group_data/) never imports tests:
  the quick start runs from a checkout without tests/ on the path (the simulated hosts are
  product: operations/simulated/);
- at most 12 modules directly in operations/: the rest sits in a folder named for its role;
- no module in operations/ over 600 lines, no function of 120 lines or more (product code);
- each folder of operations/ says what it holds: a docstring'd __init__.py, or a README.md
  where it is no package of the controller's (operations/programs/: every *.py there is a host
  program or a part the bundler inlines into one, render/host_scripts.py globs them; an
  __init__.py would run on the controller's import and never on the host);
- data flows down the picture: no folder imports one below it (the plan no step and nothing
  of runtime/, settings nothing of runtime/, nothing in operations/ a step), every import
  counted (function-local and TYPE_CHECKING ones too: test_import_graph.graph).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_graph import graph

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "operations"
MAX_TOP_MODULES = 12
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120


def product_modules() -> list[Path]:
    """Every Python file of the product: what a user runs, and what it imports."""
    found = [ROOT / "deploy.py", ROOT / "pve.py"]
    found += sorted(OPERATIONS.rglob("*.py"))
    for folder in ("inventory", "group_data"):
        found += sorted((ROOT / folder).rglob("*.py"))
    return found


def imports_of_tests(source: str) -> list[str]:
    """The imports of the `tests` package in a module's source, anywhere in it (function-local,
    TYPE_CHECKING and importlib's spelled by name included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] == "tests"]
    return found


def test_the_import_finder_sees_each_spelling() -> None:
    source = (
        "import tests\nimport tests.doubles.ct200 as c\nfrom tests.doubles import wheels\n"
        "def f():\n    from tests import needs\n    importlib.import_module('tests.x')\n"
        "import testsuite\nfrom .tests import y\nfrom operations import tests\n"
    )
    assert [f.split(": ")[1] for f in imports_of_tests(source)] == [
        "tests",
        "tests.doubles.ct200",
        "tests.doubles",
        "tests",
        "tests.x",
    ]


def test_no_product_module_imports_tests() -> None:
    offences = [
        f"{path.relative_to(ROOT)} {found}"
        for path in product_modules()
        for found in imports_of_tests(path.read_text())
    ]
    assert offences == [], "product code imports tests:\n" + "\n".join(offences)


def test_at_most_12_modules_directly_in_operations() -> None:
    top = sorted(p.name for p in OPERATIONS.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_no_module_in_operations_over_600_lines() -> None:
    over = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(OPERATIONS.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines (split them by job): {over}"


def long_functions(source: str) -> dict[str, int]:
    """Each function (nested ones apart) of `MAX_FUNCTION_LINES` lines or more, from its def to
    its last line, by name and line."""
    return {
        f"{node.name} (line {node.lineno})": length
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) >= MAX_FUNCTION_LINES
    }


def test_the_function_measure_counts_from_def_to_the_last_line() -> None:
    def lines(n: int, indent: str = "    ") -> str:
        return "".join(f"{indent}x = {i}\n" for i in range(n))

    limit = MAX_FUNCTION_LINES
    assert long_functions(f"def short():\n{lines(limit - 2)}") == {}
    method = f"class C:\n    def long(self):\n{lines(limit - 1, ' ' * 8)}"
    assert long_functions(method) == {"long (line 2)": limit}


def test_no_function_of_120_lines_or_more() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {name}": length
        for path in product_modules()
        for name, length in long_functions(path.read_text()).items()
    }
    assert found == {}, f"functions of {MAX_FUNCTION_LINES} lines or more: {found}"


def _has_docstring(init: Path) -> bool:
    return bool(ast.get_docstring(ast.parse(init.read_text())))


def test_each_folder_of_operations_says_what_it_holds() -> None:
    """Each folder of operations/ and each package folder below it: a docstring'd __init__.py,
    or a README.md (data folders below a role folder are described by their README or owner)."""
    folders = [p for p in OPERATIONS.iterdir() if p.is_dir() and p.name != "__pycache__"]
    folders += [
        p.parent
        for p in OPERATIONS.rglob("*.py")
        if p.parent != OPERATIONS and p.parent.parent != OPERATIONS
    ]
    silent = sorted(
        str(folder.relative_to(ROOT))
        for folder in set(folders)
        if not (folder / "README.md").is_file()
        and not ((folder / "__init__.py").is_file() and _has_docstring(folder / "__init__.py"))
    )
    assert silent == [], f"folders that do not say what they hold: {silent}"


def test_programs_have_no_package_init() -> None:
    """operations/programs/ is the bundler's: each file there ships to the host."""
    assert not (OPERATIONS / "programs" / "__init__.py").exists()


def test_the_architecture_picture_names_every_folder_and_top_module() -> None:
    """docs/how-it-works/architecture.md opens with one picture of operations/: a folder or a
    module at its top that the picture does not name is one a reader cannot place."""
    doc = (ROOT / "docs" / "how-it-works" / "architecture.md").read_text()
    picture = doc.split("```", 2)[1]
    names = [f"{p.name}/" for p in OPERATIONS.iterdir() if p.is_dir() and p.name != "__pycache__"]
    names += [p.name for p in OPERATIONS.glob("*.py") if p.name != "__init__.py"]
    missing = sorted(n for n in names if n not in picture)
    assert missing == [], f"not in docs/how-it-works/architecture.md's picture: {missing}"


# docs/how-it-works/architecture.md's picture, top to bottom: settings (with kb beside it), facts,
# plan, render, runtime, steps. Values go down: a folder never imports one below it. kb and settings
# read a little of each other (settings the uv pins, kb the schema's verdicts); render is
# called by the plan, and the facts decode ExecStart= with it, so it imports neither; cli/ and
# simulated/ (the controller's commands, the quick start's hosts) may read any folder but the
# steps, which only deploy.py and pve.py run.
BELOW: dict[str, tuple[str, ...]] = {
    "settings": ("facts", "plan", "render", "runtime", "steps"),
    "kb": ("facts", "plan", "render", "runtime", "steps"),
    "facts": ("plan", "runtime", "steps"),
    "render": ("facts", "plan", "runtime", "steps"),
    "plan": ("runtime", "steps"),
    "runtime": ("steps",),
    "cli": ("steps",),
    "simulated": ("steps",),
}
# The one import down the picture: a fact is a pyinfra class and reaches pyinfra beyond its
# documented API (at_once, current_host) through the one module that may.
DOORS = {"facts": frozenset({"operations.runtime.pyinfra_internals"})}


def _folder(module: str) -> str:
    """A module's folder of operations/ (a module directly in operations/: its own name)."""
    return module.split(".")[1] if "." in module else module


def imports_upstream(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a folder below the importing one, named: module, what it imports, and
    the rule it breaks."""
    found = []
    for module, targets in sorted(edges.items()):
        below = BELOW.get(_folder(module), ())
        for target in sorted(targets):
            if _folder(target) in below and target not in DOORS.get(_folder(module), ()):
                found.append(
                    f"{module} imports {target}: {_folder(module)}/ imports nothing of "
                    f"{_folder(target)}/ (docs/how-it-works/architecture.md: values go down the "
                    "picture, "
                    "pass what it needs in as a value)"
                )
    return found


def test_the_direction_check_names_each_import_up_the_picture() -> None:
    """The two seams issue 44 closed, as they were, and the facts' one door."""
    edges = {
        "operations.plan.engine_plan": {
            "operations.steps.cuda_toolkit",
            "operations.plan.engine_spec",
        },
        "operations.settings.schema_json": {"operations.runtime.pyinfra_internals"},
        "operations.facts.once": {"operations.runtime.pyinfra_internals"},
        "operations.facts.serve": {"operations.runtime.gather"},
        "operations.steps.engine": {"operations.plan.engine_plan"},
        "operations.cli.plan": {"operations.runtime.inventory"},
    }
    assert [line.split(":")[0] for line in imports_upstream(edges)] == [
        "operations.facts.serve imports operations.runtime.gather",
        "operations.plan.engine_plan imports operations.steps.cuda_toolkit",
        "operations.settings.schema_json imports operations.runtime.pyinfra_internals",
    ]


def test_values_go_down_the_picture() -> None:
    """The plan imports no step and nothing of runtime/, settings nothing of runtime/, no
    folder a step: what a module needs from below comes in as a value (issue 44)."""
    found = imports_upstream(graph())
    assert found == [], "imports up the picture:\n" + "\n".join(found)
