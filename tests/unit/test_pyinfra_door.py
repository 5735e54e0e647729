"""pyinfra behind one door (issue 36, point 5): outside operations/runtime/pyinfra_internals.py
and the inventory session (operations/runtime/inventory.py), the toolkit uses pyinfra only as its
documentation shows it, so an upgrade can only break those two modules, whose every use
tests/unit/test_pyinfra_contract.py checks.

Documented (pyinfra 3.x docs: "Writing Operations", docs.pyinfra.com/en/3.x/api/operations.html,
shows StringCommand, FileUploadCommand, FileDownloadCommand, FunctionCommand and `yield from
op._inner(...)`; "Writing Facts" shows FactBase; "Using the API" and the apidoc pages show
Host, State, Config, Inventory, connect_all, OperationMeta and the exceptions): the names in
DOCUMENTED, every operation and fact module, and the connectors by class name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOOR = {
    ROOT / "operations" / "runtime" / "pyinfra_internals.py",
    ROOT / "operations" / "runtime" / "inventory.py",
}
DOCUMENTED: dict[str, set[str]] = {
    "pyinfra": {"logger", "host", "state"},
    "pyinfra.context": {"host", "state"},
    "pyinfra.api": {"operation", "deploy", "FactBase", "StringCommand", "QuoteString"},
    "pyinfra.api.command": {
        "StringCommand",
        "QuoteString",
        "MaskString",
        "FunctionCommand",
        "FileUploadCommand",
        "FileDownloadCommand",
        "PyinfraCommand",
    },
    "pyinfra.api.facts": {"FactBase"},
    "pyinfra.api.operation": {"operation", "OperationMeta"},
    "pyinfra.api.deploy": {"deploy"},
    "pyinfra.api.exceptions": {"OperationError", "PyinfraError", "ConnectError"},
    "pyinfra.api.host": {"Host"},
    "pyinfra.api.state": {"State", "BaseStateCallback"},
    "pyinfra.api.config": {"Config"},
    "pyinfra.api.inventory": {"Inventory"},
    "pyinfra.api.connect": {"connect_all"},
    # The global arguments' and run_shell_command's types (docs: "Global Arguments").
    "pyinfra.api.arguments": {"ConnectorArguments"},
    "pyinfra.connectors.util": {"CommandOutput"},
    "pyinfra.connectors.ssh": {"SSHConnector"},
    "pyinfra.connectors.local": {"LocalConnector"},
    # The @fake connector (docs: "Connectors", @fake), subclassed as "Writing Connectors" shows
    # for the simulated node's host name (operations/simulated/node_connector.py).
    "pyinfra.connectors.fake": {"FakeConnector"},
}
# Attributes that are pyinfra's internals wherever they are read.
INTERNAL_ATTRIBUTES = {
    "failed_hosts",
    "active_hosts",
    "activated_hosts",
    "limit_hosts",
    "callback_handlers",
    "get_temp_filename",
    "get_transport",
    "is_cli",
    "ctx_host",
    "ctx_config",
    "ctx_state",
    "ctx_inventory",
}


def _sources() -> list[Path]:
    found = [ROOT / "deploy.py", ROOT / "pve.py", *sorted((ROOT / "inventory").glob("*.py"))]
    for path in sorted((ROOT / "operations").rglob("*.py")):
        if "programs" not in path.relative_to(ROOT / "operations").parts[:1]:
            found.append(path)
    return [p for p in found if p not in DOOR]


def _an_operation_or_fact_module(module: str) -> bool:
    """pyinfra.operations.files, pyinfra.facts.systemd, ...: not their util packages."""
    parts = module.split(".")
    return len(parts) == 3 and parts[1] in ("operations", "facts") and parts[2] != "util"


def uses_beyond_the_docs(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    inner_reuse = {
        id(node.value.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.YieldFrom) and isinstance(node.value, ast.Call)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in ("pyinfra_cli", "gevent", "paramiko"):
                found.append(f"{where}: from {node.module} import ...")
            elif top == "pyinfra" and not _an_operation_or_fact_module(node.module):
                for alias in node.names:
                    if _an_operation_or_fact_module(f"{node.module}.{alias.name}"):
                        continue
                    if alias.name not in DOCUMENTED.get(node.module, set()):
                        found.append(f"{where}: {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("pyinfra_cli", "gevent", "paramiko"):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if node.attr in INTERNAL_ATTRIBUTES:
                found.append(f"{where}: .{node.attr}")
            elif node.attr == "_inner" and id(node) not in inner_reuse:
                found.append(f"{where}: ._inner outside `yield from op._inner(...)`")
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "logging.getLogger"
            and any(isinstance(a, ast.Constant) and a.value == "pyinfra" for a in node.args)
        ):
            found.append(f"{where}: pyinfra's logger handled (its text matched?)")
    return found


def test_pyinfra_beyond_its_docs_is_used_in_two_modules_only() -> None:
    found = [use for path in _sources() for use in uses_beyond_the_docs(path)]
    assert not found, (
        "pyinfra used beyond its documented API outside operations/runtime/pyinfra_internals.py "
        "and operations/runtime/inventory.py: move it there, with a contract test\n  "
        + "\n  ".join(found)
    )


def test_the_door_test_sees_what_it_refuses(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from pyinfra.context import ctx_host\n"
        "from pyinfra.operations.util.files import generate_color_diff\n"
        "from pyinfra.api.arguments import pop_global_arguments\n"
        "import gevent\n"
        "state.failed_hosts.add(host)\n"
        "first = next(op._inner(x=1))\n"
        "def good():\n"
        "    yield from op._inner(x=1)\n"
    )
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = uses_beyond_the_docs(planted)
    finally:
        ROOT = root
    assert [use.split(": ", 1)[1] for use in found] == [
        "pyinfra.context.ctx_host",
        "pyinfra.operations.util.files.generate_color_diff",
        "pyinfra.api.arguments.pop_global_arguments",
        "import gevent",
        ".failed_hosts",
        "._inner outside `yield from op._inner(...)`",
    ], found
