"""Every path of this repository that a comment, a docstring or a doc cites exists (issue 44):
a reader who follows one spelled before files/ became operations/programs/ finds nothing.

What is read: the comments and docstrings (every string statement) of the Python files of
operations/, deploy.py, pve.py, bench/, scripts/ and tests/ (read with tokenize and ast, nothing
imported), and every Markdown file but the fixtures' and the changelog's (README.md, the pages
under docs/,
bench/README.md, the READMEs under operations/).

What counts as a path of this repository: a word whose first component is one of its top-level
folders (`operations/...`, `tests/...`, `docs/...`) or a folder of operations/ (`plan/drain.py`
is operations/plan/drain.py; `files/` is what operations/programs/ was called, so a path under it
is always stale). A word that starts after a `/`, a `.`, a `~` or a letter is not one: host paths
(/etc/sglang/..., /opt/...), URLs and other repositories' paths (pyinfra/api/..., sglang's
srt/server_args.py, smg's model_gateway/src/...) never start at one of those folders. It is
checked when it names a file (an extension: `.py`, `.md`, `.j2`, ...), a folder (a trailing
`/`), a module's attribute (`plan/serve_plan.roll_plan`: plan/serve_plan.py), or, spelled from the
repository's root, any existing file or folder. Placeholders (`sglang-X.json`, `test_x.py`,
`<name>`, `*`, `{id}`) stand for a family of files: one of the family must exist.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The repository's top-level folders, and operations/'s (their paths are operations/<path>).
TOP = ("operations", "tests", "docs", "bench", "scripts", "templates", "inventory", "group_data")
UNDER_OPERATIONS = (
    "plan",
    "steps",
    "facts",
    "programs",
    "kb",
    "render",
    "runtime",
    "settings",
    "cli",
    "simulated",
    "files",
)
EXTENSIONS = frozenset(
    {"py", "pyi", "j2", "md", "json", "jsonl", "yaml", "yml", "txt", "toml", "sh", "lock"}
    | {"service", "target", "timer", "conf", "cfg", "ini", "csv", "html", "tar", "gz", "whl"}
)

_FIRST = "|".join(TOP + UNDER_OPERATIONS)
# A path starts at a word boundary that is no part of a longer path, URL or name.
PATH = re.compile(rf"(?<![\w./~\-$@%:+=])(?:{_FIRST})/[\w./<>{{}}*@+\-]*")


# A placeholder in a path's component: `<name>`, `{id}`, `*`, an upper-case word between
# separators (NAME, KEY, DIGEST; not README, CHANGELOG, SOURCE), one capital letter closing a
# word (X, pyX.Y, smg-V), or `_x` (test_x.py).
_PLACEHOLDERS = (
    r"<[^>]*>|\{[^}]*\}|\*",
    r"(?:(?<=^)|(?<=[-_.@]))(?!README|CHANGELOG|SOURCE)[A-Z][A-Z0-9_]+(?=$|[-_.@])",
    r"(?<![A-Z])[A-Z](?=$|[-_.@])",
    r"(?<=_)x(?=\.|$)",
)


def _as_glob(component: str) -> str:
    for pattern in _PLACEHOLDERS:
        component = re.sub(pattern, "*", component)
    return component


def candidates(word: str) -> list[str] | None:
    """What `word` may name, relative to the repository's root (any one existing will do), or
    None when it is no path this test checks."""
    word = word.rstrip(".,:;")
    folder = word.endswith("/")
    parts = [p for p in word.split("/") if p]
    if len(parts) < 2 or any(p in (".", "..", "__pycache__") for p in parts):
        return None  # a cache is made where it is used, and is in no checkout
    if parts[0] not in TOP:
        parts = ["operations", *parts]
    last = parts[-1]
    stem, dot, suffix = last.partition(".")
    if folder or not dot:
        if word.split("/")[0] not in TOP and not folder:
            return None  # `settings/kb`: prose, or a module spelled without its folder
        return ["/".join(parts)]
    if suffix.split(".")[-1] in EXTENSIONS or suffix in EXTENSIONS:
        return ["/".join(parts)]
    if not re.fullmatch(r"\w+(\.\w+)*", suffix):
        return None
    # As it is written (tests/facts/serve.ServingState/), or a module's attribute: module.py,
    # or a package.
    base = "/".join([*parts[:-1], stem])
    return ["/".join(parts), f"{base}.py", base]


def exists(relative: str) -> bool:
    if (ROOT / relative).exists():
        return True
    pattern = "/".join(_as_glob(p) for p in relative.split("/"))
    return "*" in pattern and any(ROOT.glob(pattern))


def missing_in(text: str) -> Iterator[str]:
    """Each path `text` cites that does not exist, as written."""
    for match in PATH.finditer(text):
        found = candidates(match.group(0))
        if found is not None and not any(exists(c) for c in found):
            yield match.group(0).rstrip(".,:;")


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and each line of each string statement (docstrings)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            end = node.end_lineno or node.lineno
            for number in range(node.lineno, end + 1):
                yield number, lines[number - 1]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def markdown_files() -> list[Path]:
    """Every Markdown file of the checkout: hidden folders (.git, .venv), caches, the test
    fixtures (captured from elsewhere) and CHANGELOG.md (each version's entry names the paths of
    that version) aside."""
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = sorted(
            d for d in subfolders if not d.startswith(".") and d not in ("__pycache__", "fixtures")
        )
        found += [
            Path(folder) / n
            for n in sorted(names)
            if n.endswith(".md") and Path(folder, n) != ROOT / "CHANGELOG.md"
        ]
    return found


def read_files() -> list[Path]:
    python = [ROOT / "deploy.py", ROOT / "pve.py"]
    for folder in ("operations", "bench", "scripts", "tests"):
        python += sorted((ROOT / folder).rglob("*.py"))
    python = [p for p in python if "fixtures" not in p.relative_to(ROOT).parts]
    return python + markdown_files()


def stale_citations() -> list[str]:
    found = []
    for path in read_files():
        text = path.read_text()
        if path.suffix == ".py":
            lines: list[tuple[int, str]] = sorted(set(python_prose(text)))
        else:
            lines = list(enumerate(text.splitlines(), start=1))
        for number, line in lines:
            for cited in missing_in(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {cited} does not exist")
    return found


def test_the_matcher_takes_repo_paths_and_leaves_the_rest() -> None:
    text = (
        "see files/stage_model.py and plan/drain.py (operations/plan/drain.py), "
        "/etc/sglang/files/x.py, https://github.com/o/r/blob/main/docs/gone.md, "
        "pyinfra/api/connectors.py, srt/server_args.py, model_gateway/src/worker/service.rs, "
        "~/plan/x.py, settings/kb, plan/serve_plan.roll_plan, plan/serve_plan.gone_attr, "
        "plan/gone_module.thing, docs/gone.md, tests/e2e/test_x.py, "
        "operations/kb/knowledge/cli/sglang-X.json, programs/<name>.py, steps/gone/, "
        "tests/unit/test_cited_paths.py., operations/serve_plan.py, tests/facts/serve.ServingState/"
    )
    assert list(missing_in(text)) == [
        "files/stage_model.py",
        "plan/gone_module.thing",
        "docs/gone.md",
        "steps/gone/",
        "operations/serve_plan.py",
    ]


def test_every_cited_path_exists() -> None:
    found = stale_citations()
    assert found == [], (
        "paths cited that are not in the repository (a path under a folder of operations/ is "
        "read as operations/PATH; files/ is operations/programs/ now):\n" + "\n".join(found)
    )
