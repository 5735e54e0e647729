"""The knowledge files are read with libyaml's safe loader where PyYAML has it
(operations/kb/raw.py SAFE_LOADER): it must read every one of them as PyYAML's pure-Python safe
loader does, so which one a machine has never changes what the deploy decides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from operations.kb.raw import KNOWLEDGE_DIR, SAFE_LOADER, parse_yaml

FILES = sorted(KNOWLEDGE_DIR.rglob("*.yaml"))


def test_every_knowledge_yaml_file_is_checked() -> None:
    names = {p.name for p in FILES}
    assert {"sglang.yaml", "caches.yaml", "throughput.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(KNOWLEDGE_DIR)))
def test_the_fast_loader_reads_what_the_pure_python_one_reads(path: Path) -> None:
    text = path.read_text()
    assert parse_yaml(text) == yaml.load(text, Loader=yaml.SafeLoader)


def test_the_loader_is_libyamls_where_pyyaml_has_it_and_never_an_unsafe_one() -> None:
    assert SAFE_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with pytest.raises(yaml.YAMLError):
        parse_yaml("!!python/object/apply:os.system ['true']")
