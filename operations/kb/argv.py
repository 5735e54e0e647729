"""A command line checked against a release's real option table (operations/kb/knowledge/cli).

The tables are generated from each release's own argparse definitions; this emulates just enough
of argparse to refuse what the real parser would refuse, before anything reaches a host.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from operations.kb import CliOption, CliTable


def cli_problems(args: list[str], table: CliTable, origin: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) for `args` under a release's real option table: unknown options,
    missing or unexpected values, values outside the option's choices."""
    errors: list[str] = []
    warnings: list[str] = []
    release = f"{table.package} {table.version}"
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("--"):
            errors.append(f"{origin}: {word!r} is not an option (options start with --)")
            continue
        name, eq, inline = word.partition("=")
        option = table.get(name)
        if option is None:
            close = _close_option(name, table.options)
            hint = f"; did you mean {close}?" if close else ""
            errors.append(f"{origin}: {release} has no option {name}{hint}")
            continue
        if option.deprecated:
            warnings.append(f"{origin}: {name} is deprecated in {release}")
        values: list[str] = []
        if eq and not option.takes_value:
            errors.append(f"{origin}: {name} takes no value")
        elif eq:
            values = [inline]
        elif option.takes_value:
            many = option.nargs in ("*", "+") or isinstance(option.nargs, int)
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
                if not many:
                    break
            if not values and option.nargs not in ("?", "*"):
                errors.append(f"{origin}: {name} needs a value")
        for value in values:
            if option.choices is not None and value not in option.choices:
                errors.append(
                    f"{origin}: {name} {value!r} is not accepted by {release}; "
                    f"accepted: {', '.join(option.choices)}"
                )
    return errors, warnings


def _close_option(name: str, options: Mapping[str, CliOption]) -> str | None:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.7)
    return close[0] if close else None
