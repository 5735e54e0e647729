"""The docs read as pages: none over ~300 lines, no table cell over ~60 words (a sub-table
instead), and each page under docs/ in the folder of its purpose (getting started is README.md's
quick path; how-to, reference, how it works) and listed in docs/README.md."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MAX_LINES = 320  # "about 300"
MAX_CELL_WORDS = 60
PURPOSES = {"how-to", "reference", "how-it-works", "samples"}


def pages() -> list[Path]:
    """What a reader reads (bench/ holds the proof: its tables are records, not a reader's path)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def long_cells(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|"):
            for cell in line.strip().strip("|").split(" | "):
                if len(cell.split()) > MAX_CELL_WORDS:
                    found.append(f"{number}: {len(cell.split())} words: {cell[:40]}")
    return found


def test_a_long_cell_is_found() -> None:
    assert long_cells("| a | " + "word " * 61 + "|\n") == [f"1: 61 words: {'word ' * 8}"]
    assert long_cells("| a | " + "word " * 60 + "|\n") == []


def test_no_page_is_over_300_lines_and_no_cell_over_60_words() -> None:
    found = []
    for page in pages():
        text = page.read_text()
        if len(text.splitlines()) > MAX_LINES:
            found.append(f"{page.relative_to(ROOT)}: {len(text.splitlines())} lines")
        found += [f"{page.relative_to(ROOT)}:{cell}" for cell in long_cells(text)]
    assert not found, "\n".join(found)


def test_every_page_is_in_its_purposes_folder_and_in_the_index() -> None:
    index = (DOCS / "README.md").read_text()
    for page in sorted(DOCS.rglob("*.md")):
        relative = page.relative_to(DOCS)
        if relative == Path("README.md"):
            continue
        assert relative.parts[0] in PURPOSES, f"docs/{relative}: not under {sorted(PURPOSES)}"
        assert f"]({relative.as_posix()})" in index, f"docs/{relative}: not in docs/README.md"
