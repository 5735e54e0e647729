"""Local package indexes for the engine tests: PEP 503 `simple` trees of the double wheels,
served on loopback by `python3 -m http.server` and stopped by PID.

The testbed's containers share this machine's network namespace, so a server bound to
127.0.0.1:PORT here is reachable from inside every container at the same address.

    main = LocalIndex(tmp / "main"); main.add(wheels["sglang"], uv_wheel()); main.start()
    main.url                       # http://127.0.0.1:PORT/simple
    main.stop()
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.testbed.rootfs import CACHE_DIR

START_TIMEOUT_S = 15.0
POLL_S = 0.05
UV_VERSION = "0.13.9"  # the default of the uv_version setting


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll `check` until it is true; raise after `timeout` seconds (or when `proc` dies)."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        # The pause between polls; with a process, it returns at once if the process dies.
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL_S)
        else:
            time.sleep(POLL_S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class LocalIndex:
    """A PEP 503 index (or several, one per sub-path) in `root`, served over HTTP on loopback.

    add(wheel, sub="simple") puts a wheel under ROOT/SUB/<project>/ and rewrites the project's
    page; the server reads from disk, so wheels added while it runs are served at once.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        assert self.port is not None, "start() the index first"
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/simple"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def add(self, *wheels: Path, sub: str = "simple") -> None:
        projects: set[Path] = set()
        for wheel in wheels:
            project = canonicalize_name(parse_wheel_filename(wheel.name)[0])
            folder = self.root / sub / project
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(wheel, folder / wheel.name)
            projects.add(folder)
        for folder in projects:
            self._write_page(folder)
        self._write_root(self.root / sub)

    def remove(self, name_glob: str, sub: str = "simple") -> None:
        for path in (self.root / sub).glob(f"*/{name_glob}"):
            path.unlink()
            self._write_page(path.parent)

    @staticmethod
    def _write_page(folder: Path) -> None:
        links = []
        for wheel in sorted(folder.glob("*.whl")):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            href = html.escape(f"{wheel.name}#sha256={digest}")
            links.append(f'<a href="{href}">{html.escape(wheel.name)}</a><br/>')
        body = "\n".join(links)
        (folder / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{body}\n</body></html>\n"
        )

    @staticmethod
    def _write_root(simple: Path) -> None:
        names = sorted(p.name for p in simple.iterdir() if p.is_dir())
        body = "\n".join(f'<a href="{n}/">{n}</a><br/>' for n in names)
        (simple / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{body}\n</body></html>\n"
        )

    def start(self) -> None:
        if self.pid is not None:
            return
        self.port = self.port or free_port()
        log = (self.root.parent / f"{self.root.name}.http.log").open("ab")
        self._proc = serve_directory(self.root, self.port, log, "index")

    def stop(self) -> None:
        proc = self._proc
        self._proc = None
        if proc is not None:
            stop_process(proc)


def serve_directory(
    root: Path, port: int, stderr: IO[bytes] | int, what: str
) -> subprocess.Popen[bytes]:
    """`python3 -m http.server` on 127.0.0.1:PORT over `root`, listening when this returns."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
         "--directory", str(root)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )  # fmt: skip
    wait_for(lambda: _listening(port), START_TIMEOUT_S, f"{what} on port {port}", proc)
    return proc


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop a process we started, by its PID: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def uv_wheel(version: str = UV_VERSION) -> Path:
    """The real uv wheel from PyPI, cached outside the repository (downloaded once with pip)."""
    return pypi_wheel("uv", version)


def _pip_download(
    requirement: str, dest: Path, *, deps: bool, python_version: str = "3.11"
) -> None:
    """x86_64 wheels for the containers' Python 3.11 (or `python_version`), with the
    machine's pip."""
    dest.mkdir(parents=True, exist_ok=True)
    python = shutil.which("python3") or sys.executable
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    proc = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "download",
            "--only-binary",
            ":all:",
            *([] if deps else ["--no-deps"]),
            *(["--require-hashes"] if requirement.startswith("--requirement=") else []),
            *(arg for platform in platforms for arg in ("--platform", platform)),
            "--python-version",
            python_version,
            requirement,
            "-d",
            str(dest),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not fetch {requirement} into {dest} (pip download failed: "
            f"{proc.stderr.strip()[-500:]}); put the wheels there by hand to run offline"
        )


def pypi_wheel(name: str, version: str, platform: str = "x86_64") -> Path:
    """A real wheel from PyPI, cached outside the repository: `platform` "x86_64" for a
    compiled one (uv), "any" for a pure-Python one (py3-none-any)."""
    cache = CACHE_DIR / "wheels"
    tag = "py3-none-any" if platform == "any" else f"*{platform}*"
    pattern = f"{name.replace('-', '_')}-{version}-{tag}.whl"
    if not sorted(cache.glob(pattern)):
        _pip_download(f"{name}=={version}", cache, deps=False)
    return sorted(cache.glob(pattern))[0]


# What the containers install: CPython 3.11 on Linux x86_64, glibc 2.36 (Debian 12).
CONTAINER_TAGS = frozenset(
    [
        *tags.cpython_tags(
            (3, 11),
            abis=["cp311", "abi3", "none"],
            platforms=[f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)]
            + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"],
        ),
        *tags.compatible_tags((3, 11), "cp311", ["manylinux_2_17_x86_64", "linux_x86_64"]),
    ]
)


def pypi_release_wheel(name: str, version: str) -> Path:
    """The real wheel of `name==version` for the containers' Python, from PyPI: one already in
    the cache (e.g. fetched with its dependencies by pypi_wheels_with_deps), else downloaded
    once into it."""
    project, wanted = canonicalize_name(name), Version(version)

    def fits(wheel: Path) -> bool:
        found, found_version, _, wheel_tags = parse_wheel_filename(wheel.name)
        return found == project and found_version == wanted and bool(wheel_tags & CONTAINER_TAGS)

    cache = CACHE_DIR / "wheels"
    for wheel in sorted(cache.rglob("*.whl")):
        if fits(wheel):
            return wheel
    target = cache / "pypi" / f"{project}-{version}"
    _pip_download(f"{name}=={version}", target, deps=False)
    return next(w for w in sorted(target.glob("*.whl")) if fits(w))


def pypi_wheels_with_deps(requirement: str, pythons: tuple[str, ...] = ("3.11",)) -> list[Path]:
    """A real package and everything it needs (e.g. the real sglang-router and its web stack),
    cached outside the repository. More `pythons`: the wheels each of those Pythons needs too
    (a uv lock is universal: it wants a compiled dependency's wheel for every Python the
    project's requires-python allows, and the dependencies only older Pythons have)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", requirement)
    if pythons != ("3.11",):
        slug += "-py" + "_".join(pythons)
    cache = CACHE_DIR / "wheels" / f"{slug}-with-deps"
    done = cache / ".complete"
    if not done.exists():
        for python_version in pythons:
            _pip_download(requirement, cache, deps=True, python_version=python_version)
        done.touch()
    return sorted(cache.glob("*.whl"))


def pinned_wheels(requirements: Path, python_version: str = "3.11") -> list[Path]:
    """The wheels of a pinned requirements file (operations/kb/pins/), for the containers'
    Python: downloaded once by pip with `--require-hashes`, so each matches the pinned sha256
    the deploy installs it against (the same check again here: a cached wheel that does not
    match fails the test, not the deploy)."""
    cache = CACHE_DIR / "wheels" / f"pinned-{requirements.stem}"
    done = cache / ".complete"
    if not done.exists():
        _pip_download(
            f"--requirement={requirements}", cache, deps=False, python_version=python_version
        )
        done.touch()
    pinned = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", requirements.read_text()))
    wheels = sorted(cache.glob("*.whl"))
    for wheel in wheels:
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert digest in pinned, f"{wheel.name}: sha256 {digest} is not pinned in {requirements}"
    return wheels


def wheelhouse(target: Path, wheels: Iterable[Path]) -> Path:
    """A flat directory of wheels, as a user's `wheelhouse` setting names."""
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copyfile(wheel, target / wheel.name)
    return target
