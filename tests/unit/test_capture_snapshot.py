"""scripts/capture_index_snapshot.py's merge (`--release`): what a capture of one release adds
to the committed snapshot, and what it keeps. Pure: files in a tmp folder, nothing fetched."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import script_module

capture = script_module("capture_index_snapshot")


def _recording(files: list[str], metadata: dict[str, bytes]) -> object:
    recording = capture.Recording()
    recording.pages[("main", "demo")] = [
        capture.File(name, None, "ab" * 32, ">=3.10") for name in files
    ]
    recording.metadata[("main", "demo")] = metadata
    return recording


def _write_first(out: Path) -> None:
    first = _recording(["demo-1.0-py3-none-any.whl"], {"demo-1.0-py3-none-any.whl": b"one"})
    assert capture.write_snapshot(first, out) == 1


def test_a_merge_keeps_what_the_page_had_and_adds_only_what_uv_read(tmp_path: Path) -> None:
    _write_first(tmp_path)
    later = _recording(
        ["demo-1.0-py3-none-any.whl", "demo-2.0-py3-none-any.whl", "demo-3.0-py3-none-any.whl"],
        {"demo-2.0-py3-none-any.whl": b"two"},
    )
    assert capture.write_snapshot(later, tmp_path, merge=True) == 1
    folder = tmp_path / "main" / "demo"
    links = capture._page_links((folder / "index.html").read_text())
    assert sorted(links) == ["demo-1.0-py3-none-any.whl", "demo-2.0-py3-none-any.whl"]
    assert (folder / "demo-1.0-py3-none-any.whl.metadata").read_bytes() == b"one"
    assert (folder / "demo-2.0-py3-none-any.whl.metadata").read_bytes() == b"two"
    assert 'data-core-metadata="sha256=' in links["demo-2.0-py3-none-any.whl"]


def test_without_merge_the_snapshot_is_only_what_this_capture_read(tmp_path: Path) -> None:
    _write_first(tmp_path)
    later = _recording(["demo-2.0-py3-none-any.whl"], {"demo-2.0-py3-none-any.whl": b"two"})
    capture.write_snapshot(later, tmp_path)
    folder = tmp_path / "main" / "demo"
    assert sorted(capture._page_links((folder / "index.html").read_text())) == [
        "demo-2.0-py3-none-any.whl"
    ]
    assert not (folder / "demo-1.0-py3-none-any.whl.metadata").exists()
