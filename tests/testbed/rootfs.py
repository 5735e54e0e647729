"""Host prerequisites and the cached Debian 12 root file system the containers boot from.

Building the root file system takes a minute or more, so it is built once per package list and
kept as a tarball outside the repository; every container unpacks its own copy (a few seconds).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VARIANT = "minbase"
# Later work installs Python packages from a loopback index and runs systemd units inside,
# hence python3-venv, ca-certificates and curl on top of what systemd + sshd need. libnuma1 and
# g++ are what the engine step installs with apt beside its wheels (facts/engine.py
# HOST_PACKAGES): in the image, so that step finds them installed as on a prepared host
# (tests/operations/steps.cuda_toolkit.host_packages/libnuma-missing.json shows the apt run
# when not).
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "iproute2",
    "sudo",
    "rsync",
    "ca-certificates",
    "procps",
    "curl",
    "libnuma1",
    "g++",
)
HOST_PACKAGES: dict[str, str] = {
    # executable -> Debian package that provides it
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ssh-keygen": "openssh-client",
    # A model directory on the controller is sent with rsync (operations/steps/model.py).
    "rsync": "rsync",
}

# Bump when _prepare_image changes what ends up in the tarball, so caches are rebuilt.
IMAGE_REVISION = 2

CACHE_DIR = Path(os.environ.get("SGLANG_TESTBED_CACHE", "/var/cache/sglang-deploy-testbed"))


class TestbedSetupError(RuntimeError):
    """The host cannot provide the testbed (missing tools, failed build)."""


def rootfs_key() -> str:
    """Cache key: changes whenever anything that shapes the root file system changes."""
    spec = "\n".join([str(IMAGE_REVISION), SUITE, MIRROR, VARIANT, *sorted(PACKAGES)])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def rootfs_tarball_path() -> Path:
    return CACHE_DIR / f"{SUITE}-{rootfs_key()}.tar"


def missing_host_packages() -> list[str]:
    return sorted({pkg for exe, pkg in HOST_PACKAGES.items() if shutil.which(exe) is None})


def ensure_host_packages() -> None:
    """Install the host tools the testbed needs (CI runs on a fresh machine)."""
    missing = missing_host_packages()
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _locked(CACHE_DIR / "apt.lock"):
        missing = missing_host_packages()
        if not missing:
            return
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", *missing]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise TestbedSetupError(
                    f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                )
    still = missing_host_packages()
    if still:
        raise TestbedSetupError(f"packages still missing after apt-get install: {still}")


def ensure_rootfs() -> Path:
    """Return the cached rootfs tarball, building it with debootstrap when absent."""
    tarball = rootfs_tarball_path()
    if tarball.is_file():
        return tarball
    with _locked(CACHE_DIR / f"{tarball.name}.lock"):
        # Another process may have finished the build while we waited for the lock.
        if tarball.is_file():
            return tarball
        _build_rootfs(tarball)
    return tarball


def _build_rootfs(tarball: Path) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="build-", dir=CACHE_DIR) as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            f"--variant={VARIANT}",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            MIRROR,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log = root / "debootstrap" / "debootstrap.log"
            detail = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
            raise TestbedSetupError(
                f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                f"{proc.stderr[-4000:]}\n{detail}"
            )
        _prepare_image(root)
        partial = tarball.with_suffix(".tar.partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        # Rename last so that a reader never sees a half-written tarball.
        partial.rename(tarball)
    (CACHE_DIR / f"{tarball.name}.build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")


def _prepare_image(root: Path) -> None:
    """Tweaks shared by every container booted from this image."""
    # An empty machine-id makes systemd generate a fresh one per boot instead of every
    # container sharing the one debootstrap happened to write.
    (root / "etc/machine-id").write_text("")
    # Nothing inside needs the mirror; keeping apt lists out makes the tarball smaller.
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    # Docs, man pages and translations are a quarter of the image; every container unpacks
    # the tarball, so leaving them out makes each boot faster.
    for sub in ("doc", "man", "info", "locale"):
        target = root / "usr/share" / sub
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive flock; the kernel drops it if the holder dies, so no stale-lock cleanup."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
