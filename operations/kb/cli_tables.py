"""The command-line tables (knowledge/cli/*.json): each release's real options, loaded once."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import cast

from operations.kb.raw import CLI_DIR, KnowledgeError, RawCliTable

# -- the command-line tables (knowledge/cli/*.json) ------------------------------------------


@dataclass(frozen=True)
class CliOption:
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    deprecated: bool


@dataclass(frozen=True)
class CliTable:
    """One release's real command line: every option string it accepts."""

    package: str
    version: str
    options: Mapping[str, CliOption]

    def get(self, option: str) -> CliOption | None:
        return self.options.get(option)


def cli_table_path(package: str, release: str, directory: Path = CLI_DIR) -> Path:
    return directory / f"{package}-{release}.json"


@cache
def load_cli_table(package: str, release: str, directory: Path = CLI_DIR) -> CliTable | None:
    """The release's option table from `directory` (knowledge/cli/ unless a test passes
    another); None when it has none."""
    path = cli_table_path(package, release, directory)
    if not path.exists():
        return None
    raw = cast(RawCliTable, json.loads(path.read_text()))
    if (raw["package"], raw["version"]) != (package, release):
        raise KnowledgeError(
            f"{path}: its header says {raw['package']} {raw['version']}; "
            f"the file name says {package} {release}"
        )
    options = {
        name: CliOption(
            dest=o["dest"],
            takes_value=o["takes_value"],
            nargs=o["nargs"],
            choices=tuple(o["choices"]) if o["choices"] is not None else None,
            deprecated=o["deprecated"],
        )
        for name, o in raw["options"].items()
    }
    return CliTable(package=package, version=release, options=MappingProxyType(options))
