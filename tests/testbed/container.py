"""Debian 12 systemd containers (systemd-nspawn) reachable over real SSH on 127.0.0.N.

Each container is a full systemd host: units start, stop and survive like on a Proxmox LXC guest.
They share the host's network namespace, so every container gets its own loopback address and
servers inside must bind that address, never 0.0.0.0.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import paramiko

from tests.testbed.rootfs import TestbedSetupError

REPO_TESTS = Path(__file__).resolve().parent.parent
DOUBLE_PATH = REPO_TESTS / "doubles" / "nvidia-smi"
FIXTURES_DIR = REPO_TESTS / "fixtures" / "nvidia-smi"
DOUBLE_FIXTURE_DIR_IN_CONTAINER = "etc/nvidia-smi-double"

WORK_BASE = Path(os.environ.get("SGLANG_TESTBED_WORKDIR", "/var/tmp/sglang-deploy-testbed"))
LOCK_BASE = Path("/run/sglang-deploy-testbed")
CGROUP_ROOT = Path("/sys/fs/cgroup")
FIRST_OCTET, LAST_OCTET = 10, 250
SSH_PORT = 22
# A user-namespaced container shares the machine's network namespace, which its root does not
# own: it cannot bind a port below 1024 there (ip_unprivileged_port_start), so sshd listens here.
USERNS_SSH_PORT = 2222

BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2

ExtraFile = str | bytes | tuple[str | bytes, int]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If pytest is killed outright, the kernel sends SIGTERM to nspawn, which then shuts the
    # container down cleanly instead of leaving it running after the test run.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def scenario_dir(scenario: str | Path) -> Path:
    path = Path(scenario) if isinstance(scenario, Path) else FIXTURES_DIR / scenario
    if not path.is_dir():
        known = sorted(p.name for p in FIXTURES_DIR.iterdir() if p.is_dir())
        raise ValueError(f"unknown nvidia-smi scenario {scenario!r}; known: {known}")
    return path


def scenario_devices(scenario: str | Path | None) -> list[str]:
    """Device nodes (names under /dev) a host of this scenario has."""
    if scenario is None:
        return []
    text = (scenario_dir(scenario) / "devices.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class ContainerSpec:
    """What one container looks like.

    scenario: an nvidia-smi fixture scenario (tests/fixtures/nvidia-smi/<name>) or a directory
        in the same format; None installs no nvidia-smi and no device nodes (a CPU-only host).
    devices: names of the /dev nodes to create; None means the scenario's devices.txt.
    missing_devices: names removed from that list (e.g. {"nvidia-uvm"}).
    extra_files: absolute path inside the container -> content, or (content, mode).
    sudo_user: a non-root user, made at boot, who has the testbed's key and passwordless sudo;
        host_data() then connects as that user with `_sudo: True` (ssh_run stays root's).
    gpu_node_mode: None binds /dev/null (0666) as every GPU node (the kind default). A mode
        (0o660) makes each node a real character device of that mode, owned by the container's
        root (uid and gid 0, or the user namespace's base), as pve-container creates a `devN`
        passthrough node without `mode=` (proxmox/pve-container src/PVE/LXC.pm,
        create_passthrough_device_node: `$passthrough_mode = 0660` unless `$device->{mode}`).
        The node is major 1 minor 3, the device of /dev/null: the one char device nspawn's
        device policy lets a container open, so only its mode and owner differ.
    private_users: boot in a user namespace (systemd-nspawn --private-users=BASE:65536
        --private-users-ownership=chown), as an unprivileged Proxmox container runs: the
        container's root is an unprivileged uid on the machine, and systemd inside cannot
        attach device cgroup programs. BASE is fixed per address so nodes can be owned by the
        container's root before boot.
    """

    scenario: str | Path | None = "rtx-pro-6000-x8"
    devices: Sequence[str] | None = None
    missing_devices: Collection[str] = ()
    extra_files: Mapping[str, ExtraFile] = field(default_factory=dict)
    # Read-only binds "SRC:DEST" inside the container (systemd-nspawn --bind-ro); for a DEST under
    # /proc, nspawn resolves SRC inside the container, so ship it with extra_files.
    binds: Sequence[str] = ()
    sudo_user: str | None = None
    gpu_node_mode: int | None = None
    private_users: bool = False

    def device_nodes(self) -> list[str]:
        nodes = list(self.devices) if self.devices is not None else scenario_devices(self.scenario)
        unknown = set(self.missing_devices) - set(nodes)
        if unknown:
            raise ValueError(f"missing_devices not in the device list: {sorted(unknown)}")
        return [n for n in nodes if n not in set(self.missing_devices)]


class _AddressLease:
    """Exclusive use of 127.0.0.N across processes: a flock the kernel drops if we die."""

    def __init__(self, octet: int, handle: IO[str]) -> None:
        self.octet = octet
        self.address = f"127.0.0.{octet}"
        self._handle: IO[str] | None = handle

    @classmethod
    def acquire(cls, start: int) -> _AddressLease:
        LOCK_BASE.mkdir(parents=True, exist_ok=True)
        for octet in range(start, LAST_OCTET + 1):
            handle = (LOCK_BASE / f"addr-{octet}.lock").open("a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            # A container leaked by an earlier, killed run holds the port without the lock.
            if all(_port_free(f"127.0.0.{octet}", p) for p in (SSH_PORT, USERNS_SSH_PORT)):
                return cls(octet, handle)
            handle.close()
        raise TestbedSetupError(f"no free address in 127.0.0.{start}-{LAST_OCTET}")

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mount_point = line.split()[4]
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(mount_point)
    return found


class Container:
    """One booted systemd container. Create through Testbed.boot()."""

    def __init__(
        self, spec: ContainerSpec, lease: _AddressLease, workdir: Path, key_path: Path
    ) -> None:
        self.spec = spec
        self._lease = lease
        self.address = lease.address
        self.name = f"sgl-tb-{lease.octet}"
        self.workdir = workdir
        self.root = workdir / "rootfs"
        self.key_path = key_path
        self.log_path = workdir / "nspawn.log"
        self.node_dir = workdir / "nodes"
        self.boot_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._ssh: paramiko.SSHClient | None = None
        self._boot_started = 0.0

    def __repr__(self) -> str:
        return f"<Container {self.name} {self.address} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        """Process id of the systemd-nspawn we started (None while stopped)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # ---------------------------------------------------------------- lifecycle

    def prepare(self, tarball: Path, public_key: str) -> None:
        """Unpack the image and personalise it (key, address, GPU double, extra files)."""
        self.root.mkdir(parents=True)
        subprocess.run(
            ["tar", "--numeric-owner", "-xpf", str(tarball), "-C", str(self.root)],
            check=True,
            capture_output=True,
        )
        ssh_dir = self.root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        _write(ssh_dir / "authorized_keys", public_key, 0o600)
        # Containers share the host's network namespace: each sshd must stay on its own address.
        _write(
            self.root / "etc/ssh/sshd_config.d/testbed.conf",
            f"ListenAddress {self.address}:{self.ssh_port}\nUseDNS no\n",
            0o644,
        )
        _write(self.root / "etc/hostname", f"{self.name}\n", 0o644)
        if self.spec.scenario is not None:
            source = scenario_dir(self.spec.scenario)
            target = self.root / DOUBLE_FIXTURE_DIR_IN_CONTAINER
            target.mkdir(parents=True, exist_ok=True)
            for item in source.iterdir():
                if item.is_file() and item.name != "SOURCE.md":
                    shutil.copyfile(item, target / item.name)
            shutil.copyfile(DOUBLE_PATH, self.root / "usr/local/bin/nvidia-smi")
            (self.root / "usr/local/bin/nvidia-smi").chmod(0o755)
        for path, content in self.spec.extra_files.items():
            if not path.startswith("/"):
                raise ValueError(f"extra_files paths must be absolute: {path!r}")
            data, mode = content if isinstance(content, tuple) else (content, 0o644)
            dest = self.root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            _write(dest, data, mode)

    def start(self) -> None:
        """Launch systemd-nspawn in the background; wait_ready() waits for the boot."""
        if self.pid is not None:
            raise RuntimeError(f"{self.name} is already running")
        cmd = [
            "systemd-nspawn",
            "-D",
            str(self.root),
            "--boot",
            "--register=no",
            "--keep-unit",
            "-M",
            self.name,
            *self._device_binds(),
            *[f"--bind-ro={bind}" for bind in self.spec.binds],
        ]
        if self.spec.private_users:
            cmd += [
                f"--private-users={self.uid_base}:65536",
                "--private-users-ownership=chown",
            ]
        self._log = self.log_path.open("ab")
        self._boot_started = time.monotonic()
        cgroups = self._own_cgroups() if self.spec.private_users else []

        def before_exec() -> None:
            _die_with_parent()
            # nspawn hands the cgroup it runs in to the namespace's root: never the machine's
            # root cgroup (the container's systemd then fails: "Failed to create /init.scope").
            for group in cgroups:
                (group / "cgroup.procs").write_text("0\n")

        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=before_exec,
        )

    def _own_cgroups(self) -> list[Path]:
        """A cgroup of its own in each hierarchy systemd uses (cgroup v2, or v1's name=systemd
        and the v2 `unified` one of a hybrid machine), for a user-namespaced container."""
        tops = [CGROUP_ROOT / name for name in ("systemd", "unified")]
        tops = [t for t in tops if (t / "cgroup.procs").is_file()] or [CGROUP_ROOT]
        found = []
        for top in tops:
            group = top / self.name
            group.mkdir(exist_ok=True)
            found.append(group)
        self._cgroups = found
        return found

    def _remove_cgroups(self) -> None:
        for group in getattr(self, "_cgroups", []):
            # Depth first: the container's systemd made its own groups below ours.
            for sub in sorted(group.rglob("*"), key=lambda p: -len(p.parts)):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            with contextlib.suppress(OSError):
                group.rmdir()
        self._cgroups = []

    @property
    def ssh_port(self) -> int:
        return USERNS_SSH_PORT if self.spec.private_users else SSH_PORT

    @property
    def uid_base(self) -> int:
        """The machine uid the container's root is (0 without a user namespace)."""
        # nspawn's own `pick` range is 0x00080000-0x6FFF0000; one 64 Ki block per address.
        return (0x100 + self._lease.octet) << 16 if self.spec.private_users else 0

    def _device_binds(self) -> list[str]:
        nodes = self.spec.device_nodes()
        if self.spec.gpu_node_mode is None:
            return [f"--bind=/dev/null:/dev/{node}" for node in nodes]
        self.node_dir.mkdir(exist_ok=True)
        binds = []
        for node in nodes:
            path = self.node_dir / node.replace("/", "_")
            if not path.exists():
                os.mknod(path, stat.S_IFCHR | self.spec.gpu_node_mode, os.makedev(1, 3))
            os.chown(path, self.uid_base, self.uid_base)
            os.chmod(path, self.spec.gpu_node_mode)
            binds.append(f"--bind={path}:/dev/{node}")
        return binds

    def wait_ready(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Poll until sshd answers and systemd has finished booting."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            self._check_alive()
            try:
                self._connect(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                break
            except (OSError, paramiko.SSHException) as exc:
                last_error = exc
            if time.monotonic() > deadline:
                raise TestbedSetupError(
                    f"{self.name}: no SSH on {self.address} after {timeout:.0f}s "
                    f"({last_error!r})\n{self.log_tail()}"
                )
            self._pause()
        remaining = max(1.0, deadline - time.monotonic())
        rc, out, _ = self.ssh_run(
            f"timeout {remaining:.0f} systemctl is-system-running --wait", timeout=remaining + 5
        )
        state = out.strip()
        if state != "running":
            _, failed, _ = self.ssh_run("systemctl --failed --no-legend --plain")
            raise TestbedSetupError(
                f"{self.name}: systemd state {state!r} (rc {rc}); failed units:\n{failed}"
            )
        self.boot_seconds = time.monotonic() - self._boot_started

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Clean shutdown: SIGTERM to our nspawn (it powers the container off), then wait."""
        self._close_ssh()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            children = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # Killing the container's init ends its whole PID namespace.
                for child in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)
                proc.kill()
                proc.wait(timeout=timeout)
        self._proc = None
        self._remove_cgroups()
        if self._log is not None:
            self._log.close()
            self._log = None

    def reboot(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Power off and boot the same folder again (a fresh /dev/shm, like a real reboot)."""
        self.stop()
        self.start()
        self.wait_ready(timeout)

    def destroy(self) -> None:
        """Stop, delete the folder, give the address back."""
        self.stop()
        leftovers = _mounts_under(self.workdir)
        if leftovers:
            # Never rm -rf through a mount point (a bind of /dev/null would be the host's).
            raise TestbedSetupError(f"{self.name}: mounts still under {self.workdir}: {leftovers}")
        shutil.rmtree(self.workdir, ignore_errors=True)
        self._lease.release()

    # ---------------------------------------------------------------- access

    def ssh_run(self, cmd: str, timeout: float = 120.0) -> tuple[int, str, str]:
        """Run a shell command as root over SSH; returns (exit code, stdout, stderr)."""
        client = self._ssh if self._ssh is not None else self._connect(timeout=10.0)
        _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def snapshot(
        self, paths: Iterable[str] = ("/etc/systemd/system", "/opt", "/dev/shm")
    ) -> dict[str, str]:
        """Every entry under paths -> sha256 for files, "dir", "symlink:TARGET" or "absent".

        Compare two snapshots to prove that a run changed nothing on the host.
        """
        rc, out, err = self.ssh_run(
            "python3 -c " + shlex.quote(_SNAPSHOT_SCRIPT) + " " + shlex.join(list(paths))
        )
        if rc != 0:
            raise RuntimeError(f"snapshot failed on {self.name}: {err}")
        result: dict[str, str] = json.loads(out)
        return result

    def host_data(self) -> dict[str, Any]:
        """pyinfra host data that reaches this container over SSH (as spec.sudo_user with
        `_sudo: True` when there is one, else as root)."""
        user = self.spec.sudo_user
        return {
            "ssh_hostname": self.address,
            "ssh_port": self.ssh_port,
            "ssh_user": user or "root",
            "ssh_key": str(self.key_path),
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "no",
            **({"_sudo": True} if user else {}),
        }

    def add_sudo_user(self, user: str) -> None:
        """A login user with the testbed's key and passwordless sudo (the image has sudo)."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", user) or user == "root":
            raise ValueError(f"sudo_user must be a plain non-root user name, got {user!r}")
        rc, out, err = self.ssh_run(
            f"id -u {user} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {user}; "
            f"install -d -m 700 -o {user} -g {user} /home/{user}/.ssh && "
            f"install -m 600 -o {user} -g {user} /root/.ssh/authorized_keys /home/{user}/.ssh/ && "
            f"printf '%s\\n' '{user} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{user} && "
            f"chmod 440 /etc/sudoers.d/{user} && visudo -cq && "
            f"runuser -u {user} -- sudo -n true"
        )
        if rc != 0:
            raise TestbedSetupError(f"{self.name}: sudo user {user}: rc {rc}\n{out}\n{err}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ---------------------------------------------------------------- internals

    def _connect(self, timeout: float) -> paramiko.SSHClient:
        self._close_ssh()
        client = paramiko.SSHClient()
        # Throwaway hosts on loopback with fresh host keys per image: nothing to verify against.
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect(
            self.address,
            port=self.ssh_port,
            username="root",
            key_filename=str(self.key_path),
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=False,
            look_for_keys=False,
        )
        self._ssh = client
        return client

    def _close_ssh(self) -> None:
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None

    def _check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            code = None if self._proc is None else self._proc.returncode
            raise TestbedSetupError(
                f"{self.name}: systemd-nspawn exited ({code})\n{self.log_tail()}"
            )

    def _pause(self) -> None:
        # The poll interval doubles as a liveness check: it returns at once if nspawn dies.
        assert self._proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=POLL_INTERVAL_S)


class Testbed:
    __test__ = False  # a fixture helper, not a test class
    """Boots and tracks containers; close() stops everything it started."""

    def __init__(self, tarball: Path, workdir: Path | None = None) -> None:
        self.tarball = tarball
        WORK_BASE.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="run-", dir=WORK_BASE))
        self.key_path = self.workdir / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key_path)],
            check=True,
            capture_output=True,
        )
        self.public_key = self.key_path.with_suffix(".pub").read_text()
        self.containers: list[Container] = []
        self._next_octet = FIRST_OCTET

    def boot(self, *specs: ContainerSpec, timeout: float = BOOT_TIMEOUT_S) -> list[Container]:
        """Boot one container per spec (all at once) and wait until each is ready."""
        started: list[Container] = []
        try:
            for spec in specs:
                lease = _AddressLease.acquire(self._next_octet)
                self._next_octet = lease.octet + 1
                container = Container(spec, lease, self.workdir / f"c{lease.octet}", self.key_path)
                started.append(container)
                self.containers.append(container)
                container.prepare(self.tarball, self.public_key)
                container.start()
            for container in started:
                container.wait_ready(timeout)
                if container.spec.sudo_user:
                    container.add_sudo_user(container.spec.sudo_user)
        except BaseException:
            for container in started:
                self.destroy(container)
            raise
        return started

    def boot_one(self, spec: ContainerSpec | None = None, **kwargs: Any) -> Container:
        """boot_one(scenario="h200-x8", missing_devices={"nvidia-uvm"}) and the like."""
        return self.boot(spec or ContainerSpec(**kwargs))[0]

    def destroy(self, container: Container) -> None:
        container.destroy()
        if container in self.containers:
            self.containers.remove(container)

    def close(self) -> None:
        errors = []
        for container in list(self.containers):
            try:
                self.destroy(container)
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise TestbedSetupError(f"errors while stopping containers: {errors}")


def _write(path: Path, data: str | bytes, mode: int) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


# Runs inside the container (python3 is part of the image).
_SNAPSHOT_SCRIPT = r"""
import hashlib, json, os, stat, sys
out = {}
def entry(p):
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        return "symlink:" + os.readlink(p)
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    return "special:%o" % stat.S_IFMT(st.st_mode)
for top in sys.argv[1:]:
    if not os.path.lexists(top):
        out[top] = "absent"
        continue
    out[top] = entry(top)
    if os.path.isdir(top) and not os.path.islink(top):
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                out[p] = entry(p)
print(json.dumps(out, sort_keys=True))
"""
