"""What an engine needs beside its wheels: the lane's CUDA compiler (ENGINE_ROOT/cuda/<name>,
shared by every engine of that compiler) and the Debian packages the JIT builds and the kernel
load (facts/engine.py HOST_PACKAGES). The plan decides which compiler (engine_spec.Toolkit);
these operations carry it out, reading only the EngineState fact the engine step already read,
so a converged host costs no round trip here.

Online, the host downloads each archive from the toolkit's URL (NVIDIA's redist, or PyPI's file
host for the CUDA 13 wheels); offline (setting wheelhouse), the controller's `cuda-redist/`
directory beside the wheelhouse is uploaded first. Either way programs/cuda_toolkit.py checks each
archive's size and sha256 before unpacking it, and renames the toolkit into place only when
its nvcc runs.
"""

from __future__ import annotations

import os
from shlex import quote as _q

from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from operations.facts.engine import HOST_PACKAGES
from operations.layout import EngineTree
from operations.plan.engine_spec import Toolkit, ToolkitJson
from operations.render.host_scripts import script_text
from operations.runtime.host_call import Commands
from operations.runtime.on_controller import fail
from operations.runtime.pyinfra_internals import temp_filename
from operations.steps.host_files import put_file

INSTALL_SCRIPT = script_text("cuda_toolkit.py")


@operation()
def host_packages(installed: list[str]) -> Commands:
    """
    Install the Debian packages an engine needs beside its wheels (libnuma1, g++) with apt.

    + installed: those of them dpkg already reports installed (the EngineState fact)
    """
    missing = [p for p in HOST_PACKAGES if p not in installed]
    if not missing:
        host.noop(f"{', '.join(HOST_PACKAGES)} installed")
        return
    names = " ".join(_q(p) for p in missing)
    # Lists first only when the install alone fails: a fresh container has none.
    yield (
        "export DEBIAN_FRONTEND=noninteractive; "
        f"apt-get install -y -q --no-install-recommends {names} || "
        f"(apt-get update -q && apt-get install -y -q --no-install-recommends {names})"
    )


@operation(is_idempotent=False)
def sync_archives(src: str, dest: str, tools: ToolkitJson) -> Commands:
    """
    Upload the compiler's archives from the controller's cuda-redist/ directory (offline
    installs), each under a temporary name renamed when complete; refuse, changing nothing,
    when one is missing there.

    + src: the controller's cuda-redist/ directory
    + dest: its copy on the host (ENGINE_ROOT/cuda-redist)
    + tools: the plan's toolkit (engine_spec.Toolkit), as its to_json()
    """
    toolkit = Toolkit.from_json(tools)
    # os.path rather than pathlib: pyinfra-testing fakes local files through os.
    missing = [a.file_name for a in toolkit.archives if not os.path.isfile(f"{src}/{a.file_name}")]
    if missing:
        yield FunctionCommand(
            fail,
            (
                f"cuda-redist: no {', '.join(missing)} in {src} (nvcc {toolkit.version}'s "
                f"archives; download them from {toolkit.url}); nothing changed",
            ),
            {},
        )
        return
    yield StringCommand("mkdir", "-p", _q(f"{dest}/.partial"))
    for archive in toolkit.archives:
        partial = f"{dest}/.partial/{archive.file_name}"
        # A random temp name for pyinfra's `_sudo` upload (its default, /tmp/pyinfra-<sha1 of
        # dest>, is a name a local user could create first).
        yield FileUploadCommand(
            f"{src}/{archive.file_name}", partial, remote_temp_filename=temp_filename(host)
        )
        yield StringCommand("mv", "-f", _q(partial), _q(f"{dest}/{archive.file_name}"))


@operation()
def install_toolkit(
    engine_root: str,
    tools: ToolkitJson,
    installed: list[str],
    arguments: str,
) -> Commands:
    """
    Unpack the lane's compiler into ENGINE_ROOT/cuda/<name>, each archive checked against its
    manifest's sha256 and size first; complete (its marker written, nvcc run) or absent.

    + engine_root: the engine root on the host
    + tools: the plan's toolkit (engine_spec.Toolkit), as its to_json()
    + installed: the complete toolkits under ENGINE_ROOT/cuda (the EngineState fact)
    + arguments: the text of ENGINE_ROOT/cuda/.NAME.json, what cuda_toolkit.py is given (the
      plan's file: engine_plan.toolkit_arguments; its archives' source, offline
      ENGINE_ROOT/cuda-redist, else the toolkit's URL); unused when installed
    """
    toolkit = Toolkit.from_json(tools)
    home = toolkit.home(engine_root)
    if toolkit.name in installed:
        host.noop(f"nvcc {toolkit.version} is installed in {home}")
        return
    # Root-only, never on a command line: a mirror's URL may carry a token.
    args_file = EngineTree(engine_root).toolkit_args(toolkit.name)
    yield from put_file._inner(
        src=arguments,
        dest=args_file,
        mode="600",
        dir_mode="755",
        secret=True,
    )
    yield StringCommand("python3", "-c", _q(INSTALL_SCRIPT), _q(args_file))
