"""Docstrings and comments read as prose (issue 44): no paragraph holds a fragment a re-wrap
left on a line of its own ("... facts gathered,\n  preflight and\n     the resolved plan
printed" in deploy.py's docstring, the first file a newcomer opens).

A fragment: a line of at most four words (letters, commas, parentheses), not ending a sentence
or a clause (. : ; ! ?), after a line of 70 characters or more that does not end one either,
and before a line that goes on with the sentence (a lower-case word or an opening parenthesis).
Tables, examples and lists do not look like that: their short lines hold code or close an item.
Read from the source with tokenize and ast (nothing imported): operations/, deploy.py, pve.py,
bench/, scripts/ and tests/.
"""

from __future__ import annotations

import re

from tests.unit.test_cited_paths import ROOT, python_prose

FRAGMENT = re.compile(r"[A-Za-z(),']+(?: [A-Za-z(),']+){0,3}")
ENDS = (".", ":", ";", "!", "?")


def _prose(line: str) -> str:
    """The text of a comment or docstring line, without its marker, quotes or indent."""
    return re.sub(r'^\s*(#\s?)?(r?""")?', "", line).replace('"""', "").strip()


def fragments(lines: list[tuple[int, str]]) -> list[int]:
    """The line numbers of fragments among consecutive (number, line) pairs."""
    found = []
    for (n0, before), (n1, line), (n2, after) in zip(lines, lines[1:], lines[2:], strict=False):
        if not (n0 + 1 == n1 and n1 + 1 == n2):
            continue
        before, line, after = _prose(before), _prose(line), _prose(after)
        if (
            len(before) >= 70
            and not before.endswith(ENDS)
            and FRAGMENT.fullmatch(line)
            and not line.endswith(ENDS)
            and re.match(r"[a-z(]", after)
        ):
            found.append(n1)
    return found


def test_a_fragment_is_found_and_a_table_is_not() -> None:
    source = (
        '"""Steps, in order:\n'
        "  1. gate (operations/runtime/plan_step.py): settings checked for every host, facts "
        "gathered,\n"
        "  preflight and\n"
        "     the resolved plan printed; a host that fails gets no change at all.\n"
        "\n"
        "  stage    -> unchanged (a no-op that never reads the weights), beside the current "
        "copy, in\n"
        "              place with the servers stopped\n"
        '"""\n'
        "# The key of the staged copy the rank units name (None: not known; they name the link)\n"
        "# and\n"
        "# the ServingState fact.\n"
    )
    assert fragments(sorted(set(python_prose(source)))) == [3, 10]


def test_no_paragraph_holds_a_fragment() -> None:
    files = [ROOT / "deploy.py", ROOT / "pve.py"]
    for folder in ("operations", "bench", "scripts", "tests"):
        files += sorted((ROOT / folder).rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        if "fixtures" not in path.relative_to(ROOT).parts
        for number in fragments(sorted(set(python_prose(path.read_text()))))
    ]
    assert found == [], "a line a re-wrap broke off its paragraph (join it): " + ", ".join(found)
