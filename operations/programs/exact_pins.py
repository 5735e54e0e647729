"""Make every pin of a requirements file exact: `name==V` becomes `name===V` (PEP 440's
arbitrary equality, the version string itself).

Why: PEP 440's version matching ignores a candidate's local label when the specifier has none,
so `sglang-kernel==0.4.6.post1` also matches `0.4.6.post1+cu129`, and uv picks the local build
when a find-links directory holds both. A wheelhouse filled for a mixed fleet (cu128 and cu130
hosts, from both locks of one release: scripts/fill_wheelhouse.py) holds exactly that pair, and
an offline cu130 engine got the cu129 build. `===0.4.6.post1` matches that build alone, and
`===0.4.6.post1+cu129` the other: every engine gets the build its lock names.

The engine step (steps/engine.build_env) runs it with the new environment's interpreter on the
requirements `uv export` wrote from the lock, before the offline `uv pip install`; the engine's
offline pyproject.toml takes its pins through `exact` (plan/engine_spec.project_toml), so a
lock resolved from the wheelhouse alone names the same builds. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys

# A requirement line's name (extras included) and its `==` pin, at the start of a line: the
# continuation lines of `uv export` (`    --hash=...`) and markers after `;` are left as they are.
_PIN = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[^\]]*\])?)\s*==(?!=)\s*")


def exact(requirement: str) -> str:
    """`name==V...` as `name===V...`; any other line as it is."""
    return _PIN.sub(r"\1===", requirement, count=1)


def rewrite(path: str) -> int:
    """Rewrite the file in place (a temporary file renamed over it); the pins made exact."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    made = [exact(line) for line in lines]
    temporary = f"{path}.exact"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("\n".join(made))
    os.replace(temporary, path)
    return sum(1 for old, new in zip(lines, made, strict=True) if old != new)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: exact_pins.py REQUIREMENTS", file=sys.stderr)
        return 2
    count = rewrite(argv[0])
    print(f"{count} pin(s) made exact in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
