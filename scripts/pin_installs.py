"""Regenerate operations/kb/pins/: what the deploy installs beside the engine, pinned with hashes.

    python scripts/pin_installs.py [--uv 0.13.9 ...]

Every install outside the engine's lock is root's and reads an index: uv itself (bootstrapped
with the system Python's pip), the Hugging Face CLI and the router (sglang-router, or smg).
Each is installed from a requirements file of this directory with `--require-hashes
--only-binary :all:`, so an index (or a mirror, or a wheelhouse) can serve nothing but these
exact wheels:

  uv.txt                     `uv==V --hash=sha256:H`, one line per uv release: H is the sha256
                             of the manylinux x86_64 wheel, as PyPI's JSON simple API lists it
                             (https://pypi.org/simple/uv/, PEP 691)
  router-V-pyX.Y.txt         sglang-router==V and every dependency, one file per router release
                             of the knowledge base and per Python minor it lists for a release
  smg-V-pyX.Y.txt            the same for smg==V (the knowledge base's routers of package smg)
  hub-pyX.Y.txt              the Hugging Face CLI (operations/steps/model.py HUB_REQUIREMENT), the
  same

The last three are `uv pip compile --generate-hashes --only-binary :all: --python-version X.Y
--python-platform x86_64-manylinux_2_28` against PyPI: every hash of every file of each pinned
version. Run it with network access to PyPI, then review and commit the diff
(operations/kb/pins/SOURCE.md says when and with which uv). `--only smg` (or uv, hub,
sglang-router) regenerates one kind and leaves the others and SOURCE.md as they are: add its
line to SOURCE.md by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from operations import kb as kbmod  # noqa: E402
from operations.kb.pins import PINS_DIR, UV_PLATFORM, hub_file, router_file  # noqa: E402
from operations.steps.model import HUB_REQUIREMENT  # noqa: E402

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
KINDS = ("uv", "hub", "sglang-router", "smg")
PLATFORM = "x86_64-manylinux_2_28"


def uv_hash(version: str) -> str:
    """The sha256 of uv's manylinux x86_64 wheel of `version`, from PyPI's JSON simple API."""
    request = urllib.request.Request("https://pypi.org/simple/uv/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    prefix = f"uv-{version}-py3-none-"
    found = [
        f["hashes"]["sha256"]
        for f in files
        if f["filename"].startswith(prefix) and UV_PLATFORM in f["filename"]
    ]
    if len(found) != 1:
        raise SystemExit(f"uv {version}: {len(found)} {UV_PLATFORM} wheels on PyPI, not one")
    return str(found[0])


def compile_pins(requirement: str, python: str, dest: Path, uv: str) -> None:
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "requirements.in"
        source.write_text(requirement + "\n")
        subprocess.run(
            [uv, "pip", "compile", "--quiet", "--no-config", "--generate-hashes",
             "--only-binary", ":all:", "--python-version", python, "--python-platform",
             PLATFORM, "--no-header", "--index-url", "https://pypi.org/simple",
             str(source), "-o", str(dest)],
            check=True,
        )  # fmt: skip
    header = (
        f"# {requirement} for CPython {python}, {PLATFORM}: scripts/pin_installs.py\n"
        f"# (uv pip compile --generate-hashes --only-binary :all: against PyPI)\n"
    )
    dest.write_text(header + dest.read_text())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uv", action="append", default=[], help="uv releases to pin")
    parser.add_argument(
        "--only",
        choices=KINDS,
        help="regenerate only this kind (SOURCE.md is then left to edit by hand)",
    )
    args = parser.parse_args(argv)
    wanted = {args.only} if args.only else set(KINDS)
    uv = str(Path(sys.executable).with_name("uv"))
    knowledge = kbmod.load()
    pythons = sorted({p for r in knowledge.releases.values() for p in r.python.versions})
    uv_versions = sorted(set(args.uv) or {"0.13.9"}, key=lambda v: [int(x) for x in v.split(".")])
    if "uv" in wanted:
        lines = ["# uv's manylinux x86_64 wheel per release: scripts/pin_installs.py"]
        lines += [f"uv=={v} --hash=sha256:{uv_hash(v)}" for v in uv_versions]
        (PINS_DIR / "uv.txt").write_text("\n".join(lines) + "\n")
    for python in pythons:
        for version, router in sorted(knowledge.routers.items()):
            if router.package in wanted:
                dest = router_file(version, python, router.package)
                compile_pins(f"{router.package}=={version}", python, dest, uv)
        if "hub" in wanted:
            compile_pins(HUB_REQUIREMENT, python, hub_file(python), uv)
    if args.only:
        return 0
    used = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True)
    (PINS_DIR / "SOURCE.md").write_text(
        "# Where these pins come from\n\n"
        f"Generated by `scripts/pin_installs.py` on {datetime.date.today().isoformat()} with "
        f"{used.stdout.strip()}, from PyPI:\n\n"
        "- `uv.txt`: the sha256 of each uv release's manylinux x86_64 wheel, as PyPI's JSON "
        "simple API lists it (https://pypi.org/simple/uv/, `Accept: " + SIMPLE_JSON + "`).\n"
        "- `router-V-pyX.Y.txt`, `smg-V-pyX.Y.txt`, `hub-pyX.Y.txt`: `uv pip compile "
        f"--generate-hashes --only-binary :all: --python-version X.Y --python-platform {PLATFORM}`"
        f" of `sglang-router==V`, `smg==V` and `{HUB_REQUIREMENT}`, one file per Python minor the "
        "knowledge base lists for a release (" + ", ".join(pythons) + ").\n\n"
        "The deploy installs each with `--require-hashes --only-binary :all:` "
        "(docs/how-it-works/security.md, 'Installs: hashes, wheels only'). Regenerate, review the "
        "diff, "
        "commit.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
