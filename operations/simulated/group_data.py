"""The repository's group data (group_data/<group>.py), read as pyinfra reads it.

pyinfra looks for group_data/ in the working directory and beside the inventory file
(pyinfra_cli/inventory.py `make_inventory_from_files`, pyinfra 3.10), so the demo inventories,
run from another directory, would lose the repository's settings. They name this data as their
groups' own: a group_data/ of the working directory still overrides it, as pyinfra merges files
over an inventory's group data.
"""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

GROUP_DATA = Path(__file__).resolve().parents[2] / "group_data"


def read(group: str, folder: Path = GROUP_DATA) -> dict[str, object]:
    """The values of `folder/<group>.py` ({} when there is none), with pyinfra's rules
    (pyinfra_cli/inventory.py `_get_group_data`): `__all__` when set names them, else every
    name but the imported ones and dunders."""
    path = folder / f"{group}.py"
    if not path.is_file():
        return {}
    values = runpy.run_path(str(path))
    if "__all__" in values:
        keys = set(values["__all__"])
    else:
        keys = set(values) - _imported_names(path.read_text())
    return {k: v for k, v in values.items() if k in keys and not k.startswith("__")}


def _imported_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names if a.name != "*")
    return names
