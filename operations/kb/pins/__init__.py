"""What the deploy installs beside the engine, pinned with hashes: uv, the Hugging Face CLI and
the router (sglang-router or smg), each from a requirements file of this directory, installed with
`--require-hashes --only-binary :all:` (no other file, no source build). The files are made by
scripts/pin_installs.py (SOURCE.md says when); the deploy only reads them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

PINS_DIR = Path(__file__).resolve().parent
# The one uv wheel a host installs: the tag uv publishes for glibc Linux on x86_64.
UV_PLATFORM = "manylinux_2_17_x86_64"


class PinError(Exception):
    """No pinned requirements for what the settings ask: the message says what to run."""


# The requirements file's prefix per router package: sglang-router's kept its first name.
ROUTER_PREFIX = {"sglang-router": "router", "smg": "smg"}


def router_file(version: str, python: str, package: str = "sglang-router") -> Path:
    """router-V-pyX.Y.txt (sglang-router) or smg-V-pyX.Y.txt (smg)."""
    return PINS_DIR / f"{ROUTER_PREFIX[package]}-{version}-py{python}.txt"


def hub_file(python: str) -> Path:
    return PINS_DIR / f"hub-py{python}.txt"


def uv_requirement(version: str) -> str | None:
    """`uv==V --hash=sha256:H` (a requirements line) for a pinned uv release; None if none."""
    for line in _lines(PINS_DIR / "uv.txt"):
        if line.split(" ", 1)[0] == f"uv=={version}":
            return line.strip()
    return None


@cache
def _lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text().splitlines())


@cache
def _read(path: Path, what: str) -> str:
    """A pin file's text, read once per process (a plan reads none: host_plan.decide is pure)."""
    if not path.is_file():
        raise PinError(
            f"no pinned requirements for {what} ({path.relative_to(PINS_DIR.parents[2])} "
            "is missing): run scripts/pin_installs.py"
        )
    return path.read_text()


def router_requirements(version: str, python: str, package: str = "sglang-router") -> str:
    """`package`==V (sglang-router or smg) and its dependencies for CPython `python`, with
    hashes."""
    return _read(router_file(version, python, package), f"{package} {version} on Python {python}")


def hub_requirements(python: str) -> str:
    """The Hugging Face CLI and its dependencies for CPython `python`, with hashes."""
    return _read(hub_file(python), f"the Hugging Face CLI on Python {python}")
