"""Fill a wheelhouse with exactly the wheels an engine's lock names, for offline installs.

    python scripts/fill_wheelhouse.py locks/0.5.11-cu128-cp311-7267b59f.lock WHEELHOUSE \
        [--python 3.11] [--glibc 2.36] [--uv 0.13.9] [--router 0.3.2] [--hub]

The lock comes from a first host, or from the controller alone (`python -m operations.lock`).
Run it on a machine that can reach the indexes the lock was resolved from (the URLs are in the
lock; credentials, which uv never writes into a lock, come from ~/.netrc). For every package of
the lock it downloads the one wheel the target can install (CPython `--python`, manylinux up to
`--glibc`, x86_64), checks its sha256 against the lock and keeps it only then. `--uv` adds the
uv wheel the deploy bootstraps from, `--router` sglang-router and its dependencies, `--hub` the
Hugging Face CLI's wheels: each exactly the pinned set of operations/pins/ for `--python`,
downloaded by pip with `--require-hashes --only-binary :all:` (the deploy installs them the same
way). Then set `wheelhouse: WHEELHOUSE` and the deploy installs that same set with no index at
all. See docs/engine.md.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from operations.pins import hub_file, router_file, uv_requirement


def target_tags(python: str, glibc: str) -> list[Tag]:
    major, minor = (int(x) for x in python.split("."))
    top = int(glibc.split(".")[1])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(top, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms.append("linux_x86_64")
    version = (major, minor)
    return [
        *cpython_tags(version, platforms=platforms),
        *compatible_tags(version, platforms=platforms),
    ]


def choose(wheels: list[dict[str, str]], tags: list[Tag]) -> dict[str, str] | None:
    """The wheel of the best-ranked tag the target supports."""
    rank = {tag: i for i, tag in enumerate(tags)}
    best: tuple[int, dict[str, str]] | None = None
    for wheel in wheels:
        name = wheel["url"].rsplit("/", 1)[-1].split("#")[0]
        found = [rank[t] for t in parse_wheel_filename(urllib.parse.unquote(name))[3] if t in rank]
        if found and (best is None or min(found) < best[0]):
            best = (min(found), wheel)
    return best[1] if best else None


def fill(lock: Path, dest: Path, python: str, glibc: str) -> list[str]:
    """Download the lock's wheels into dest; returns the problems (empty when complete)."""
    data = tomllib.loads(lock.read_text())
    tags = target_tags(python, glibc)
    dest.mkdir(parents=True, exist_ok=True)
    problems = []
    for package in data.get("package", []):
        if "wheels" not in package:
            continue  # the virtual project itself
        wheel = choose(package["wheels"], tags)
        if wheel is None:
            problems.append(f"{package['name']} {package['version']}: no wheel for this target")
            continue
        name = urllib.parse.unquote(wheel["url"].rsplit("/", 1)[-1].split("#")[0])
        algorithm, _, digest = wheel["hash"].partition(":")
        target = dest / name
        if target.exists() and hashlib.new(algorithm, target.read_bytes()).hexdigest() == digest:
            continue
        with urllib.request.urlopen(wheel["url"], timeout=600) as response:
            body = response.read()
        if hashlib.new(algorithm, body).hexdigest() != digest:
            problems.append(f"{name}: {algorithm} differs from the lock's; not kept")
            continue
        partial = target.with_suffix(".partial")
        partial.write_bytes(body)
        partial.replace(target)
    return problems


def download_pinned(requirements: Path, dest: Path, python: str, glibc: str) -> None:
    """pip download of a pinned requirements file (hashes checked, wheels only) for the
    target: CPython `python` on manylinux x86_64 up to `glibc`."""
    top = int(glibc.split(".")[1])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(top, 16, -1)] + ["manylinux2014_x86_64"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
         "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
         *(a for p in platforms for a in ("--platform", p)),
         "-r", str(requirements), "-d", str(dest)],
        check=True,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument("wheelhouse", type=Path)
    parser.add_argument("--python", default="3.11", help="the target's Python (default 3.11)")
    parser.add_argument("--glibc", default="2.36", help="the target's glibc (default 2.36)")
    parser.add_argument("--uv", help="also the uv wheel of this version (the deploy's uv_version)")
    parser.add_argument("--router", help="also sglang-router of this version and its wheels")
    parser.add_argument("--hub", action="store_true", help="also the Hugging Face CLI's wheels")
    args = parser.parse_args(argv)
    problems = fill(args.lock, args.wheelhouse, args.python, args.glibc)
    pinned = [router_file(args.router, args.python)] if args.router else []
    pinned += [hub_file(args.python)] if args.hub else []
    for requirements in pinned:
        download_pinned(requirements, args.wheelhouse, args.python, args.glibc)
    if args.uv:
        line = uv_requirement(args.uv)
        if line is None:
            problems.append(f"uv {args.uv}: no pinned hash in operations/pins/uv.txt")
        else:
            with tempfile.TemporaryDirectory() as work:
                requirements = Path(work) / "uv.txt"
                requirements.write_text(line + "\n")
                download_pinned(requirements, args.wheelhouse, args.python, args.glibc)
    for problem in problems:
        print(f"fill_wheelhouse: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
