"""scripts/fill_wheelhouse.py's `--router`: the package the knowledge base names for the
release (smg for the default gateway), its pinned requirements for the target's Python, and one
line for a release it does not know."""

from __future__ import annotations

import pytest

from operations.kb.pins import PINS_DIR
from operations.settings import Router
from scripts import fill_wheelhouse


def test_the_default_gateway_is_smg_from_its_own_pins() -> None:
    version = fill_wheelhouse.default_router_version()
    assert version == Router(host="ct200").version
    path, what = fill_wheelhouse.router_pins(version, "3.11")
    assert what == f"smg {version}"
    assert path == PINS_DIR / f"smg-{version}-py3.11.txt"
    assert any(line.startswith(f"smg=={version} ") for line in path.read_text().splitlines())


def test_the_old_router_release_is_sglang_router() -> None:
    path, what = fill_wheelhouse.router_pins("0.3.2", "3.12")
    assert (path.name, what) == ("router-0.3.2-py3.12.txt", "sglang-router 0.3.2")


@pytest.mark.parametrize(
    ("version", "python", "said"),
    [
        ("9.9.9", "3.11", "--router 9.9.9: not a router release of the knowledge base (known: "),
        ("1.13.0", "3.13", "no pinned requirements for smg 1.13.0 on Python 3.13"),
    ],
)
def test_what_cannot_be_filled_is_one_line(version: str, python: str, said: str) -> None:
    with pytest.raises(fill_wheelhouse.FillError) as caught:
        fill_wheelhouse.router_pins(version, python)
    assert said in str(caught.value) and "\n" not in str(caught.value)
