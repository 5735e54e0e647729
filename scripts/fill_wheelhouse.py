"""Fill a wheelhouse with exactly the wheels an engine's lock names, for offline installs.

    .venv/bin/python scripts/fill_wheelhouse.py locks/0.5.11-cu128-cp311-d04a952f.lock \
        WHEELHOUSE [--python 3.11] [--glibc 2.36] [--uv 0.13.9] [--router [1.13.0]] [--hub] \
        [--lane cu128] [--cuda-url URL] [--cuda-manifest redistrib_12.8.1.json] [--no-cuda]

The lock comes from a first host, or from the controller alone (`python -m operations.lock`).
Run it on a machine that can reach the indexes the lock was resolved from (the URLs are in the
lock; credentials, which uv never writes into a lock, come from ~/.netrc). For every package of
the lock it downloads the one wheel the target can install (CPython `--python`, manylinux up to
`--glibc`, x86_64), checks its sha256 against the lock and keeps it only then. `--uv` adds the
uv wheel the deploy bootstraps from, `--router` the router and its dependencies (the package the
knowledge base's `routers` entry names for the release: smg for 1.13.0, sglang-router for 0.3.2;
`--router` alone: the settings' default router.version), `--hub` the Hugging Face CLI's wheels:
each exactly the pinned set of operations/kb/pins/ for `--python`,
downloaded by pip with `--require-hashes --only-binary :all:` (the deploy installs them the same
way). The CUDA archives of the lane's compiler (the lane is the lock's name's second part, or
`--lane`) go to `cuda-redist/` beside WHEELHOUSE, where the offline deploy takes them, each
checked against the knowledge base's sha256 (or `--cuda-manifest`'s, as the setting
cuda_redist_manifest does) from `--cuda-url` (the settings' default, cuda_redist_url or
cuda_wheels_url); `--no-cuda` skips them. Then set `wheelhouse: WHEELHOUSE` and the deploy
installs that same set with no index at all. See docs/how-to/air-gap.md.

Every file is streamed to a temporary name while its hash is computed, and kept only when the
hash matches; a rich progress bar shows the bytes and the count at a terminal, one line per
file otherwise. A missing lock, a URL that cannot be fetched (naming the package) or a failed
pip download is one line each, exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from operations.kb.pins import hub_file, router_file, uv_requirement

if TYPE_CHECKING:
    from operations.plan.engine_spec import Toolkit

CHUNK = 1 << 20
TIMEOUT_S = 600


class FillError(Exception):
    """A problem that stops the fill: one line for the user."""


@dataclass(frozen=True)
class Download:
    """One file to fetch and check."""

    what: str  # how problems name it: the package (and version) or the CUDA component
    url: str
    target: Path
    algorithm: str
    digest: str
    size: int = 0  # 0: unknown until the server says


class Progress:
    """Bytes and count: one rich progress bar at a terminal ("[3/212] torch-...whl", the bytes
    of every file together, the speed), else one line per file (stderr)."""

    def __init__(self, total: int, size: int = 0, terminal: bool | None = None) -> None:
        self.total = total
        self.size = size  # the bytes of every file, where the lock or manifest says; 0: unknown
        self.done = 0
        self.bytes = 0
        self.problems = 0
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self._advance: Callable[[int], None] | None = None
        self._describe: Callable[[str], None] | None = None

    @contextmanager
    def running(self) -> Iterator[Progress]:
        if not self.terminal:
            yield self
            return
        from rich.console import Console
        from rich.markup import escape
        from rich.progress import BarColumn, DownloadColumn, TextColumn, TransferSpeedColumn
        from rich.progress import Progress as Bar

        with Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=Console(stderr=True),
        ) as bar:
            task = bar.add_task("starting", total=self.size or None)
            self._advance = lambda n: bar.update(task, advance=n)
            self._describe = lambda text: bar.update(task, description=escape(text))
            yield self
            bar.update(task, description=f"{self.done - self.problems}/{self.total} file(s)")
            self._advance = self._describe = None

    def file(self, name: str, size: int) -> Callable[[int], None]:
        """Start one file; returns the callback that adds each chunk's bytes."""
        if self._describe is not None:
            self._describe(f"[{self.done + 1}/{self.total}] {name}")
        return self._advance or (lambda n: None)

    def failed(self, name: str) -> None:
        self.done += 1
        self.problems += 1
        if self._advance is None:
            print(f"fill_wheelhouse: [{self.done}/{self.total}] {name}: failed", file=sys.stderr)

    def finished(self, name: str, size: int, fetched: bool) -> None:
        self.done += 1
        self.bytes += size if fetched else 0
        if self._advance is None:
            said = _size(size) if fetched else "already here, hash matches"
            print(
                f"fill_wheelhouse: [{self.done}/{self.total}] {name} ({said})",
                file=sys.stderr,
                flush=True,
            )
        elif not fetched:
            self._advance(size)


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB"):
        value /= 1000
        if value < 1000:
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.2f} GB"


def sha_of(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(item: Download, progress: Progress) -> str | None:
    """Stream `item` to a temporary name beside its target, hashing as it goes; rename it
    only when the hash matches. None when done, else the problem (one line)."""
    name = item.target.name
    if item.target.exists() and sha_of(item.target, item.algorithm) == item.digest:
        progress.finished(name, item.target.stat().st_size, fetched=False)
        return None
    partial = item.target.with_name(item.target.name + ".partial")
    digest = hashlib.new(item.algorithm)
    size = 0
    try:
        with urllib.request.urlopen(item.url, timeout=TIMEOUT_S) as response:
            length = int(response.headers.get("Content-Length") or item.size or 0)
            advance = progress.file(name, length)
            with partial.open("wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    advance(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        partial.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        from operations.redact import redact, redact_text

        return f"{item.what}: cannot download {redact(item.url)}: {redact_text(str(reason))}"
    if digest.hexdigest() != item.digest:
        partial.unlink(missing_ok=True)
        return f"{name}: {item.algorithm} differs from the lock's; not kept"
    partial.replace(item.target)
    progress.finished(name, size, fetched=True)
    return None


def read_lock(lock: Path) -> dict[str, object]:
    try:
        return tomllib.loads(lock.read_text())
    except FileNotFoundError:
        raise FillError(
            f"lock {lock}: no such file (make one with `.venv/bin/python -m operations.lock "
            "INVENTORY --python 3.11`, or take a first host's from engine_lock_dir)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FillError(f"lock {lock}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FillError(f"lock {lock}: not a uv lock (TOML): {exc}") from None


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


def wheel_downloads(
    lock: Path, dest: Path, python: str, glibc: str
) -> tuple[list[Download], list[str]]:
    """The wheels of `lock` the target installs, and the packages that have none."""
    data = read_lock(lock)
    tags = target_tags(python, glibc)
    downloads: list[Download] = []
    problems: list[str] = []
    packages = data.get("package", [])
    for package in packages if isinstance(packages, list) else []:
        if "wheels" not in package:
            continue  # the virtual project itself
        wheel = choose(package["wheels"], tags)
        if wheel is None:
            problems.append(f"{package['name']} {package['version']}: no wheel for this target")
            continue
        name = urllib.parse.unquote(wheel["url"].rsplit("/", 1)[-1].split("#")[0])
        algorithm, _, digest = wheel["hash"].partition(":")
        downloads.append(
            Download(
                f"{package['name']} {package['version']}",
                wheel["url"],
                dest / name,
                algorithm,
                digest,
                int(wheel.get("size") or 0),
            )
        )
    return downloads, problems


def fill(
    lock: Path, dest: Path, python: str, glibc: str, extra: list[Download] | None = None
) -> list[str]:
    """Download the lock's wheels into dest (and `extra`, the CUDA archives); returns the
    problems (empty when complete)."""
    downloads, problems = wheel_downloads(lock, dest, python, glibc)
    downloads += extra or []
    dest.mkdir(parents=True, exist_ok=True)
    for item in extra or []:
        item.target.parent.mkdir(parents=True, exist_ok=True)
    known = all(item.size for item in downloads)
    progress = Progress(len(downloads), sum(item.size for item in downloads) if known else 0)
    with progress.running():
        for item in downloads:
            problem = fetch(item, progress)
            if problem is not None:
                progress.failed(item.target.name)
                problems.append(problem)
    print(
        f"fill_wheelhouse: {progress.done - progress.problems} of {len(downloads)} file(s) in "
        f"place, {_size(progress.bytes)} downloaded",
        file=sys.stderr,
    )
    return problems


def lane_of(lock: Path) -> str | None:
    """The CUDA lane in an engine lock's name: RELEASE-LANE-cpXY-HASH.lock."""
    parts = lock.name.removesuffix(".lock").split("-")
    return parts[1] if len(parts) == 4 else None


def cuda_downloads(
    lane: str, wheelhouse: Path, url: str | None, manifest_path: str | None
) -> list[Download]:
    """The lane's compiler archives, to cuda-redist/ beside the wheelhouse (where the offline
    deploy takes them: operations/plan/engine_plan.redist_dir)."""
    from operations import kb as kbmod
    from operations import settings as settings_mod
    from operations.plan.engine_plan import redist_dir
    from operations.plan.engine_spec import EngineError, read_redist_manifest, toolkit
    from operations.settings import Settings

    entry = kbmod.load().lanes.get(lane)
    if entry is None:
        raise FillError(f"--lane {lane!r}: not a lane of the knowledge base")
    if entry.compiler is None:
        return []
    defaults = settings_mod.defaults()
    # Only the two URL settings are read by toolkit(): the download base of each origin.
    where = SimpleNamespace(
        cuda_redist_url=url or defaults["cuda_redist_url"],
        cuda_wheels_url=url or defaults["cuda_wheels_url"],
    )
    try:
        manifest = read_redist_manifest(manifest_path) if manifest_path else None
        tools: Toolkit = toolkit(entry.compiler, cast(Settings, where), manifest, manifest_path)
    except EngineError as exc:
        raise FillError(str(exc)) from None
    dest = Path(redist_dir(str(wheelhouse)))
    return [
        Download(
            f"{a.name} {a.version}", f"{tools.url}/{a.path}", dest / a.file_name, "sha256",
            a.sha256, a.size,
        )
        for a in tools.archives
    ]  # fmt: skip


def download_pinned(
    requirements: Path, dest: Path, python: str, glibc: str, what: str | None = None
) -> list[str]:
    """pip download of a pinned requirements file (hashes checked, wheels only) for the
    target: CPython `python` on manylinux x86_64 up to `glibc`; the problem, if pip fails
    (pip's own lines above it say which package)."""
    top = int(glibc.split(".")[1])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(top, 16, -1)] + ["manylinux2014_x86_64"]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
         "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
         *(a for p in platforms for a in ("--platform", p)),
         "-r", str(requirements), "-d", str(dest)],
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return [f"{what or requirements}: pip download failed (exit status {proc.returncode})"]
    return []


def router_pins(version: str, python: str) -> tuple[Path, str]:
    """The pinned requirements of router release `version` for CPython `python`, and how
    problems name it ("smg 1.13.0"): the package is the knowledge base's `routers` entry's."""
    from operations import kb as kbmod

    known = kbmod.load().routers
    if version not in known:
        raise FillError(
            f"--router {version}: not a router release of the knowledge base (known: "
            f"{', '.join(sorted(known))}; router.version in the settings names one)"
        )
    package = known[version].package
    path = router_file(version, python, package)
    if not path.is_file():
        raise FillError(
            f"--router {version}: no pinned requirements for {package} {version} on Python "
            f"{python} ({path.name} is missing in operations/kb/pins/): run "
            "scripts/pin_installs.py"
        )
    return path, f"{package} {version}"


def default_router_version() -> str:
    """The router release a deploy installs when `router` names no version."""
    from operations.settings import Router

    return Router(host="").version


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument("wheelhouse", type=Path)
    parser.add_argument("--python", default="3.11", help="the target's Python (default 3.11)")
    parser.add_argument("--glibc", default="2.36", help="the target's glibc (default 2.36)")
    parser.add_argument("--uv", help="also the uv wheel of this version (the deploy's uv_version)")
    parser.add_argument(
        "--router",
        nargs="?",
        const="",
        metavar="VERSION",
        help="also the router of this release and its wheels (smg for 1.13.0, sglang-router for "
        "0.3.2; alone: the settings' default router.version)",
    )
    parser.add_argument("--hub", action="store_true", help="also the Hugging Face CLI's wheels")
    parser.add_argument("--lane", help="the CUDA lane (default: from the lock's name)")
    parser.add_argument("--cuda-url", help="where the compiler archives are downloaded from")
    parser.add_argument("--cuda-manifest", help="a redistrib JSON whose sha256s replace the KB's")
    parser.add_argument("--no-cuda", action="store_true", help="skip the compiler archives")
    args = parser.parse_args(argv)
    try:
        extra: list[Download] = []
        if not args.no_cuda:
            lane = args.lane or lane_of(args.lock)
            if lane is None:
                raise FillError(
                    f"lock {args.lock}: its name says no CUDA lane (RELEASE-LANE-cpXY-HASH.lock):"
                    " pass --lane, or --no-cuda"
                )
            extra = cuda_downloads(lane, args.wheelhouse, args.cuda_url, args.cuda_manifest)
        problems = fill(args.lock, args.wheelhouse, args.python, args.glibc, extra)
        pinned: list[tuple[Path, str | None]] = []
        if args.router is not None:
            pinned.append(router_pins(args.router or default_router_version(), args.python))
        if args.hub:
            pinned.append((hub_file(args.python), None))
        for requirements, what in pinned:
            problems += download_pinned(
                requirements, args.wheelhouse, args.python, args.glibc, what
            )
        if args.uv:
            line = uv_requirement(args.uv)
            if line is None:
                problems.append(f"uv {args.uv}: no pinned hash in operations/kb/pins/uv.txt")
            else:
                with tempfile.TemporaryDirectory() as work:
                    requirements = Path(work) / "uv.txt"
                    requirements.write_text(line + "\n")
                    problems += download_pinned(
                        requirements, args.wheelhouse, args.python, args.glibc, f"uv {args.uv}"
                    )
    except FillError as exc:
        problems = [str(exc)]
    except KeyboardInterrupt:
        print("fill_wheelhouse: interrupted (partial files are replaced next run)", file=sys.stderr)
        return 130
    for problem in problems:
        print(f"fill_wheelhouse: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    from operations.cli.closed_pipe import quiet

    sys.exit(quiet(lambda: main(sys.argv[1:])))
