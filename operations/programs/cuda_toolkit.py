"""Installs an engine's CUDA compiler on the host: `python3 cuda_toolkit.py ARGS.json`.

ARGS.json (written root-only by steps/cuda_toolkit.py, since a mirror's URL may hold a token):
{"home": "/opt/sglang/cuda/12.8.93-1a2b3c4d", "source": URL or directory, "root": "*" or
"nvidia/cu13", "archives": [{"path", "sha256", "size"}], "marker": {...}}.

Each archive is fetched (from `source`/`path` online, `source`/<file name> offline), its size and
sha256 checked against what its publisher's manifest lists, and only then unpacked: `root`
inside it ("*": NVIDIA's one top folder, `<component>-linux-x86_64-<version>-archive/`; a PyPI
wheel's `nvidia/cu13/`) becomes HOME. Everything is built in HOME.partial-<pid> and renamed to
HOME once `bin/nvcc --version` runs and the marker is written, so HOME is complete or absent.
Only the standard library: it runs with the host's python3, before any engine exists.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import urllib.request
import zipfile

MARKER = ".sglang-deploy-toolkit.json"
CHUNK = 1 << 20


class Refused(Exception):
    pass


def fetch(source: str, archive: dict, dest: str) -> None:  # type: ignore[type-arg]
    name = archive["path"].rsplit("/", 1)[-1]
    digest = hashlib.sha256()
    size = 0
    if source.startswith(("http://", "https://")):
        where = source.rstrip("/") + "/" + archive["path"]
        try:
            stream = urllib.request.urlopen(where, timeout=60)
        except OSError as exc:
            raise Refused(f"{name}: cannot download {where}: {exc}") from exc
    else:
        where = os.path.join(source, name)
        try:
            stream = open(where, "rb")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:
            raise Refused(f"{name}: not in {source}: {exc}") from exc
    with stream, open(dest, "wb") as out:
        while True:
            block = stream.read(CHUNK)
            if not block:
                break
            digest.update(block)
            size += len(block)
            out.write(block)
    found = digest.hexdigest()
    if found != archive["sha256"] or (archive["size"] and size != archive["size"]):
        raise Refused(
            f"{name} from {where}: sha256 {found} and {size} bytes, expected sha256 "
            f"{archive['sha256']} and {archive['size']} bytes (its manifest): a cut download "
            "or another file; nothing was unpacked"
        )


def _inside(home: str, relative: str) -> str:
    target = os.path.normpath(os.path.join(home, relative))
    if relative.startswith("/") or not (target + "/").startswith(home.rstrip("/") + "/"):
        raise Refused(f"archive member {relative!r} leaves the toolkit directory")
    return target


def unpack_tar(path: str, root: str, home: str) -> None:
    with tarfile.open(path, "r:*") as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        prefix = (tops.pop() if len(tops) == 1 else "") if root == "*" else root
        for member in members:
            if not member.name.startswith(prefix + "/"):
                continue
            relative = member.name[len(prefix) + 1 :].strip("/")
            if not relative:
                continue
            target = _inside(home, relative)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.issym():
                # Only links that stay inside the toolkit (libcudart.so -> libcudart.so.12).
                _inside(home, os.path.join(os.path.dirname(relative), member.linkname))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.lexists(target):
                    os.unlink(target)
                os.symlink(member.linkname, target)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                os.chmod(target, member.mode & 0o755)


def unpack_wheel(path: str, root: str, home: str) -> None:
    with zipfile.ZipFile(path) as wheel:
        for info in wheel.infolist():
            if info.is_dir() or not info.filename.startswith(root + "/"):
                continue
            target = _inside(home, info.filename[len(root) + 1 :])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with wheel.open(info) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            # A wheel keeps the executable bit in the zip entry's Unix mode.
            os.chmod(target, 0o755 if (info.external_attr >> 16) & stat.S_IXUSR else 0o644)


def link_like_a_toolkit(home: str) -> None:
    """What builds expect of a CUDA_HOME beyond the archives: lib64 (tvm-ffi and FlashInfer
    link with -L$CUDA_HOME/lib64) and an unversioned libcudart.so (-lcudart); PyPI's runtime
    wheel ships only libcudart.so.13."""
    lib = os.path.join(home, "lib")
    if os.path.isdir(lib) and not os.path.lexists(os.path.join(home, "lib64")):
        os.symlink("lib", os.path.join(home, "lib64"))
    if os.path.isdir(lib) and not os.path.lexists(os.path.join(lib, "libcudart.so")):
        versioned = sorted(n for n in os.listdir(lib) if n.startswith("libcudart.so."))
        if versioned:
            os.symlink(versioned[0], os.path.join(lib, "libcudart.so"))


def remove_partials(parent: str) -> list[str]:
    """Remove what installs cut short left in `parent` (a killed deploy never reaches the
    cleanup below), whichever toolkit they were building: NAME.partial-PID directories of
    ours, i.e. made by this user (root), not links. A complete toolkit never has such a name."""
    removed = []
    for name in sorted(os.listdir(parent)):
        _, sep, pid = name.rpartition(".partial-")
        path = os.path.join(parent, name)
        if not sep or not pid.isdigit():
            continue
        found = os.lstat(path)
        if stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


def install(args: dict) -> str:  # type: ignore[type-arg]
    home = args["home"]
    if os.path.isfile(os.path.join(home, MARKER)):
        return f"{home} is installed"
    parent = os.path.dirname(home)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    remove_partials(parent)
    work = f"{home}.partial-{os.getpid()}"
    os.makedirs(work, mode=0o755)
    try:
        download = os.path.join(work, ".download")
        for archive in args["archives"]:
            fetch(args["source"], archive, download)
            if archive["path"].endswith(".whl"):
                unpack_wheel(download, args["root"], work)
            else:
                unpack_tar(download, args["root"], work)
            os.unlink(download)
        link_like_a_toolkit(work)
        nvcc = os.path.join(work, "bin", "nvcc")
        run = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
        if run.returncode != 0:
            said = (run.stderr or run.stdout).strip()[-300:]
            raise Refused(f"the unpacked nvcc does not run ({nvcc} --version): {said}")
        with open(os.path.join(work, MARKER), "w") as out:
            json.dump(args["marker"], out, sort_keys=True)
        if os.path.lexists(home):
            shutil.rmtree(home)  # a toolkit without its marker: never complete
        os.rename(work, home)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    release = [line for line in run.stdout.splitlines() if "release" in line] or ["nvcc runs"]
    return f"{home}: {release[0].strip()}"


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        arguments = json.load(handle)
    try:
        print(install(arguments))
    except Refused as refused:
        print(f"cuda toolkit: {refused}", file=sys.stderr)
        sys.exit(1)
