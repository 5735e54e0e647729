"""Every cross-reference a reader can follow resolves, and every command a doc shows parses:
a link to a file or a heading (`[text](docs/how-to/<page>.md#heading)`, from any Markdown file, and
`docs/how-to/<page>.md#heading` cited in the code's prose), a `make TARGET` (a rule of the
Makefile), a
`python -m MODULE` (a module that exists) and every `--flag` written after one (or after
`pyinfra INVENTORY deploy.py` or `scripts/NAME.py`) is an option the program defines.
tests/unit/test_cited_paths.py checks that every path named anywhere exists; this checks what
is inside the paths a doc points at."""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.unit.test_cited_paths import markdown_files, python_prose, read_files

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED_ANCHOR = re.compile(r"(?<![\w/])((?:docs|bench)/[\w./-]+\.md|README\.md)#([\w-]+)")
MAKE = re.compile(r"(?:`|^|\$ )make ([a-z][\w-]*)", re.M)
# A command as a doc writes it: the module or script, then its words up to the line's end.
MODULE = re.compile(r"python -m ([\w.]+)((?: [^`\n#|]*)?)")
SCRIPT = re.compile(r"python (scripts/\w+\.py)((?: [^`\n#|]*)?)")
DEPLOY = re.compile(r"pyinfra \S+ (?:deploy|pve)\.py((?: [^`\n#|]*)?)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but `-` and `_` dropped,
    each space a `-`."""
    text = re.sub(r"`|\*\*", "", heading.strip().lstrip("#").strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return frozenset(slug(line) for line in text.splitlines() if line.startswith("#"))


def broken_link(source: Path, target: str) -> str | None:
    if re.match(r"[a-z]+:", target):  # https:, mailto:
        return None
    path_part, _, anchor = target.partition("#")
    path = (source.parent / path_part).resolve() if path_part else source
    if not path.exists():
        return f"{target}: no such file"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{target}: {path.relative_to(ROOT)} has no heading #{anchor}"
    return None


def doc_files() -> list[Path]:
    return [p for p in markdown_files() if "fixtures" not in p.parts]


def test_slugs_are_githubs() -> None:
    assert slug("## A canary first (rollout.strategy: canary)") == (
        "a-canary-first-rolloutstrategy-canary"
    )
    assert slug("## 0.13.0 - 2026-12-06") == "0130---2026-12-06"
    assert slug("### `--probe`: does each rank answer?") == "--probe-does-each-rank-answer"


def test_every_link_in_the_docs_resolves_to_a_file_and_a_heading() -> None:
    found = [
        f"{doc.relative_to(ROOT)}: {problem}"
        for doc in [*doc_files(), ROOT / "CHANGELOG.md"]
        for target in LINK.findall(doc.read_text())
        if (problem := broken_link(doc, target)) is not None
    ]
    assert not found, "\n".join(found)


def test_every_heading_cited_in_the_code_exists() -> None:
    found = []
    for path in read_files():
        text = (
            "\n".join(s for _, s in python_prose(path.read_text()))
            if path.suffix == ".py"
            else path.read_text()
        )
        for doc, anchor in CITED_ANCHOR.findall(text):
            target = ROOT / doc
            if not target.exists():
                found.append(f"{path.relative_to(ROOT)}: {doc}: no such file")
            elif anchor not in anchors(target):
                found.append(f"{path.relative_to(ROOT)}: {doc} has no heading #{anchor}")
    assert not found, "\n".join(found)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def test_every_make_target_a_doc_names_is_a_rule() -> None:
    targets = make_targets()
    found = [
        f"{doc.relative_to(ROOT)}: make {target}"
        for doc in [*doc_files(), ROOT / "CHANGELOG.md"]
        for target in MAKE.findall(doc.read_text())
        if target not in targets
    ]
    assert not found, found


def module_source(name: str) -> str | None:
    """The text of a module (a package: every file in it) and of the command lines' home
    (operations/cli/, where most modules' parsers live, and the inventory commands' shared
    parser, operations/runtime/inventory.py); None when there is no such module."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    files = [origin, ROOT / "operations" / "runtime" / "inventory.py"]
    files += sorted((ROOT / "operations" / "cli").rglob("*.py"))
    if origin.name in ("__init__.py", "__main__.py"):
        files += sorted(origin.parent.rglob("*.py"))
    return "\n".join(p.read_text() for p in files)


def flags(words: str) -> Iterator[str]:
    try:
        split = shlex.split(words.replace("\\", " "), comments=True)
    except ValueError:
        split = words.split()
    for word in split:
        if re.fullmatch(r"--[a-z][\w-]*(=.*)?", word):
            yield word.split("=", 1)[0]


@cache
def deploy_options() -> str:
    """pyinfra's own options, and the --data the toolkit reads."""
    import pyinfra_cli

    return "\n".join(p.read_text() for p in Path(pyinfra_cli.__file__).parent.glob("*.py"))


def command_problems(text: str) -> Iterator[str]:
    for module, rest in MODULE.findall(text):
        source = module_source(module) if module.startswith(("operations", "scripts")) else ""
        if source is None:
            yield f"python -m {module}: no such module"
            continue
        for flag in flags(rest) if source else ():
            if f'"{flag}"' not in source:
                yield f"python -m {module} {flag}: not an option of {module}"
    for script, rest in SCRIPT.findall(text):
        if not (ROOT / script).exists():
            yield f"{script}: no such script"
            continue
        source = (ROOT / script).read_text()
        for flag in flags(rest):
            if f'"{flag}"' not in source:
                yield f"{script} {flag}: not an option of the script"
    for rest in DEPLOY.findall(text):
        for flag in flags(rest):
            if f'"{flag}"' not in deploy_options():
                yield f"pyinfra ... {flag}: not an option of pyinfra"


def test_every_command_a_doc_shows_parses() -> None:
    found = [
        f"{doc.relative_to(ROOT)}: {problem}"
        for doc in doc_files()
        for problem in command_problems(doc.read_text())
    ]
    assert not found, "\n".join(found)


def test_a_wrong_command_is_found() -> None:
    text = (
        "`.venv/bin/python -m operations.status INVENTORY --probe`\n"
        "`.venv/bin/python -m operations.nope x`\n"
        "`.venv/bin/python -m operations.plan inventory/ct200.py --whyy`\n"
        ".venv/bin/python scripts/fill_wheelhouse.py L W --router 1.13.0 --hubb\n"
    )
    assert list(command_problems(text)) == [
        "python -m operations.nope: no such module",
        "python -m operations.plan --whyy: not an option of operations.plan",
        "scripts/fill_wheelhouse.py --hubb: not an option of the script",
    ]
    assert broken_link(ROOT / "README.md", "docs/README.md#no-such-heading") is not None
