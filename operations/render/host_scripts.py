"""The scripts the deploy runs on a host, each one self-contained text.

A host script (operations/programs/*.py) runs with the host's python3 and the standard library
only, as one file the deploy writes (`host_files.put_file`) or as one `python3 -c` argument
(the ModelStaging fact, before anything is installed). What scripts share lives in modules
beside them (programs/hostsafe.py: the masking and the listener check; programs/stage_*.py: the
staging script's parts), which a script imports at its top level as
`from operations.programs.NAME import ...`.

`script_text` replaces each such import by that module's code, once and depth first (where
Python would run it), so what the host gets is the script with its modules inlined: it imports
nothing of this project. It refuses what would make the one text differ from the modules (a
project import that is not at the top level or is renamed, a name two modules define
differently, a name imported that its module does not define). `load` imports that text as a
module: the controller's scan and the tests run what the host runs.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import json
import linecache
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

FILES = Path(__file__).resolve().parent.parent / "programs"
PACKAGE = "operations.programs"
# Linux's MAX_ARG_STRLEN (32 pages of 4 KiB): the longest single argument execve takes. The
# ModelStaging fact passes the whole staging script as one (tests/unit/test_host_scripts.py).
ARG_STRLEN_MAX = 32 * 4096


class BundleError(Exception):
    pass


def _local(node: ast.stmt) -> str | None:
    """The module name of a project import (`from operations.programs.NAME import ...`)."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module.startswith(PACKAGE + "."):
            return node.module[len(PACKAGE) + 1 :]
        if node.module.split(".")[0] == "operations":
            raise BundleError(f"imports {node.module}: a host script imports {PACKAGE} only")
    if isinstance(node, ast.Import) and any(
        a.name.split(".")[0] == "operations" for a in node.names
    ):
        raise BundleError("`import operations...`: use `from operations.programs.NAME import ...`")
    return None


def _bindings(body: list[ast.stmt], where: str) -> dict[str, tuple[str, ...]]:
    """The names a module's top level binds, each with what it binds: a definition here, or
    an import (the same import in two modules binds the same object). Project imports aside."""
    found: dict[str, tuple[str, ...]] = {}
    for node in body:
        if _local(node) is not None:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import a.b` binds the package a, whichever of its modules it imports.
                module = alias.name if alias.asname else alias.name.split(".")[0]
                found[alias.asname or module] = ("import", module)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name] = ("from", str(node.module), alias.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = ("defined in", where)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found[name.id] = ("defined in", where)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            inner = [*node.body, *node.orelse] if not isinstance(node, ast.With) else node.body
            if isinstance(node, ast.Try):
                inner += [s for h in node.handlers for s in h.body] + node.finalbody
            found.update(_bindings(inner, where))
    return found


def _parsed(path: Path) -> tuple[str, ast.Module, list[ast.Import | ast.ImportFrom]]:
    """A file's text, its tree and its imports below the top level, read once per content:
    a deploy bundles six scripts that share modules, and parsing is what bundling costs."""
    source = path.read_text()
    return _parse(source, str(path))


@cache
def _parse(source: str, filename: str) -> tuple[str, ast.Module, list[ast.Import | ast.ImportFrom]]:
    tree = ast.parse(source, filename)
    top_level = set(map(id, tree.body))
    nested = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top_level
    ]
    return source, tree, nested


class _Bundle:
    def __init__(self, files: Path) -> None:
        self.files = files
        self.inlined: dict[str, set[str]] = {}  # module -> the names it binds
        self.bound: dict[str, tuple[str, ...]] = {}  # name -> what binds it, all modules
        self.future = False
        self.pending: set[str] = set()  # modules being inlined (a cycle comes back to one)
        self.names: dict[Path, dict[str, tuple[str, ...]]] = {}  # what each file binds

    def _bind(self, names: dict[str, tuple[str, ...]], where: str) -> None:
        for name, what in names.items():
            before = self.bound.setdefault(name, what)
            if before != what:
                raise BundleError(
                    f"{where}: {name!r} is bound as {what}, another part binds it as {before}: "
                    "in one script text they would be one name"
                )

    def text(self, path: Path, top: bool) -> str:
        rel = f"operations/programs/{path.name}"
        source, tree, nested = _parsed(path)
        for found in nested:
            if _local(found) is not None:
                raise BundleError(f"{rel}:{found.lineno}: a project import in a block")
        names = _bindings(tree.body, rel)
        self.names[path] = names
        self._bind(names, rel)
        lines = source.splitlines(keepends=True)
        pieces: list[str] = []
        at = 0
        for index, node in enumerate(tree.body):
            module = _local(node)
            if module is not None:
                assert isinstance(node, ast.ImportFrom)
                replacement = self.module(module, node, rel)
            elif top:
                continue
            elif index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                replacement = ""  # the module's docstring: the script's own is its top's
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                self.future = True
                replacement = ""  # the script's top holds it (checked below)
            elif isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                raise BundleError(f"{rel}: a module with a main block is a script, not a part")
            else:
                continue
            end = node.end_lineno or node.lineno
            pieces += [*lines[at : node.lineno - 1], replacement]
            at = end
        pieces += lines[at:]
        text = "".join(pieces)
        if not top:
            if text.startswith("#!"):
                text = text.split("\n", 1)[1]
            return text.lstrip("\n")
        has_future = any(
            isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body
        )
        if self.future and not has_future:
            raise BundleError(f"{rel}: its parts use `from __future__ import annotations`")
        return text

    def module(self, name: str, node: ast.ImportFrom, where: str) -> str:
        if any(alias.asname for alias in node.names):
            raise BundleError(f"{where}: `from {PACKAGE}.{name} import ... as ...`: not renamed")
        inlined = ""
        if name in self.pending:
            raise BundleError(f"{where}: imports {name}, which imports it: a cycle")
        if name not in self.inlined:
            path = self.files / f"{name}.py"
            if not path.is_file():
                raise BundleError(f"{where}: no module {path}")
            self.pending.add(name)
            body = self.text(path, top=False)
            self.pending.discard(name)
            self.inlined[name] = set(self.names[path])
            rel = f"operations/programs/{name}.py"
            inlined = (
                f"# ---- {rel}, inlined by operations/render/host_scripts.py ----\n"
                f"{body.rstrip()}\n# ---- end of {rel} ----\n"
            )
        missing = [a.name for a in node.names if a.name not in self.inlined[name]]
        if missing:
            raise BundleError(f"{where}: {PACKAGE}.{name} does not define {', '.join(missing)}")
        return inlined


def bundle(path: Path, files: Path = FILES) -> str:
    """The script at `path` with the modules it imports from `files` inlined."""
    return _Bundle(files).text(path, top=True)


@cache
def script_text(main: str) -> str:
    """The text the host gets for operations/programs/`main` ("smoke.py")."""
    bundles = _cached_bundles()
    if main not in bundles:
        bundles[main] = bundle(FILES / main, FILES)
        _save(bundles)
    return bundles[main]


# Bundling parses every script and part (~50 ms a deploy, which ships six): the texts are kept
# beside Python's own bytecode cache, under a name that is the digest of everything that makes
# them (this bundler and every file in FILES), so a change to any of them is a new name and
# bundles afresh, refusals included. Written when Python writes bytecode, where .pyc files are,
# and trusted as they are: whoever can write there can change the code the controller runs.
def _cache_path() -> Path:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(FILES.glob("*.py")):
        digest.update(f"\0{path.name}\0".encode() + path.read_bytes())
    pycache = Path(importlib.util.cache_from_source(str(FILES / "_.py"))).parent
    return pycache / f"host-scripts-{digest.hexdigest()[:32]}.json"


@cache
def _cached_bundles() -> dict[str, str]:
    try:
        found = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        return {}
    return found


def _save(bundles: dict[str, str]) -> None:
    if sys.dont_write_bytecode:
        return
    path = _cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        temp.write_text(json.dumps(bundles))
        temp.replace(path)
        for old in path.parent.glob("host-scripts-*.json"):
            if old != path:
                old.unlink(missing_ok=True)


def load(main: str, name: str | None = None) -> ModuleType:
    """script_text(main) imported as a module `name` (registered in sys.modules: dataclasses
    look their module up), its tracebacks showing the bundled lines."""
    name = name or f"host_script_{Path(main).stem}"
    text = script_text(main)
    filename = f"<operations/programs/{main}, bundled>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    return module
