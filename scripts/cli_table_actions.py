"""Runs in a child python: the raw actions of one release's argparse parser, as JSON on stdout.

Kept free of interpretation (the table is built by scripts/gen_cli_table.py, the outer process)
and of anything but the standard library, so both ways of building the parser share it:

- the throwaway-virtualenv method runs it: `python -I cli_table_actions.py MODULE CLASS`;
- the stand-in method (scripts/cli_table_stubs.py, `python -I -S`) imports `actions`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types


def actions(cls: type) -> list[dict[str, object]]:
    """What `cls.add_cli_args` adds to a fresh parser, one record per option."""
    parser = argparse.ArgumentParser()
    cls.add_cli_args(parser)  # type: ignore[attr-defined]
    registry = {v: k for k, v in parser._registries["action"].items() if isinstance(k, str)}
    out: list[dict[str, object]] = []
    for a in parser._actions:
        if not a.option_strings:
            continue
        help_text = a.help if isinstance(a.help, str) and a.help != argparse.SUPPRESS else ""
        out.append(
            {
                "option_strings": list(a.option_strings),
                "dest": a.dest,
                "nargs": a.nargs,
                "choices": None if a.choices is None else [str(c) for c in a.choices],
                "action": registry.get(type(a), type(a).__name__),
                "mro": [k.__name__ for k in type(a).__mro__],
                "help": help_text,
                "deprecated_attr": bool(getattr(a, "deprecated", False)),
            }
        )
    return out


def main() -> None:
    # The only hack of the virtualenv method (see scripts/gen_cli_table.py's docstring): the
    # CUDA build of torchvision cannot load its C ops beside a CPU torch, and its fake-kernel
    # registrations for those ops would raise at import.
    sys.modules["torchvision._meta_registrations"] = types.ModuleType(
        "torchvision._meta_registrations"
    )
    module_name, class_name = sys.argv[1], sys.argv[2]
    cls = getattr(importlib.import_module(module_name), class_name)
    json.dump(actions(cls), sys.stdout)


if __name__ == "__main__":
    main()
