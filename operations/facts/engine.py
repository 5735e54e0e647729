"""What the host has of the engine: its versioned environments, the `current` link, the uv
bootstrapped under the engine root, and the wheels already synced there. Each fact is one round
trip; operations/steps/engine.py changes what these facts read.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import NotRequired, TypedDict

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations.layout import ENGINE_MARKER, ENGINE_PROVEN, EngineTree

# An environment's marker (layout.ENGINE_MARKER): complete once its check passed.
MARKER = ENGINE_MARKER
# Written into ENGINE_ROOT/cuda/<name> (operations/programs/cuda_toolkit.py) as its last step.
TOOLKIT_MARKER = ".sglang-deploy-toolkit.json"
# Debian packages an engine needs beside its wheels: libnuma1 (sgl_kernel links libnuma.so.1)
# and g++ (nvcc preprocesses every .cu with the host compiler; tvm-ffi and FlashInfer build
# their host code with it).
HOST_PACKAGES = ("libnuma1", "g++")


class EnvInfo(TypedDict):
    complete: bool
    # Last activation (or installation) time of a complete environment, epoch seconds.
    activated_at: int | None


class Proven(TypedDict):
    """What the engine step records beside an environment once the engine check passed on the
    host's GPUs (layout.ENGINE_PROVEN, written by steps/engine_check.verify_env)."""

    date: str  # the host's UTC day when it passed: YYYY-MM-DD
    gpus: list[str]  # the GPUs' names by index, as nvidia-smi gave them to the plan
    driver: str  # the driver's version, as nvidia-smi gave it
    user: str  # who ran the check (the service user; root on a host without systemd)


_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_proven(text: str) -> Proven | None:
    """An environment's record (ENGINE_PROVEN's content); None when it is not one (a cut or
    hand-edited file proves nothing)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    date, gpus, driver, user = (data.get(k) for k in ("date", "gpus", "driver", "user"))
    if not (isinstance(date, str) and _DAY.match(date) and isinstance(gpus, list) and gpus):
        return None
    if not (all(isinstance(g, str) for g in gpus) and isinstance(driver, str) and driver):
        return None
    if not isinstance(user, str):
        return None
    return {"date": date, "gpus": list(gpus), "driver": driver, "user": user}


class EngineHost(TypedDict):
    current: str | None
    envs: dict[str, EnvInfo]
    uv: str | None
    # Complete compilers under ENGINE_ROOT/cuda (NotRequired: op fixtures written before).
    toolkits: NotRequired[list[str]]
    # HOST_PACKAGES that dpkg reports installed.
    packages: NotRequired[list[str]]
    # The compile-cache directories under ENGINE_ROOT/caches: environment name -> owner.
    caches: NotRequired[dict[str, str]]
    # Environments the engine check passed on this host's GPUs: name -> its record.
    proven: NotRequired[dict[str, Proven]]


def parse_engine_state(lines: list[str]) -> EngineHost:
    state: EngineHost = {"current": None, "envs": {}, "uv": None, "toolkits": [], "packages": []}
    for line in lines:
        key, _, value = line.strip().partition("=")
        if key == "env":
            name, _, stamp = value.partition(" ")
            state["envs"][name] = {
                "complete": True,
                "activated_at": int(stamp) if stamp.isdigit() else None,
            }
        elif key == "proven" and value:
            name, _, text = value.partition(" ")
            if (record := parse_proven(text)) is not None:
                state.setdefault("proven", {})[name] = record
        elif key == "partial" and value:
            state["envs"].setdefault(value, {"complete": False, "activated_at": None})
        elif key == "current" and value:
            # Only the environment's name counts: the link may be relative or absolute.
            state["current"] = value.rstrip("/").rsplit("/", 1)[-1]
        elif key == "cache" and value:
            name, _, owner = value.partition(" ")
            state.setdefault("caches", {})[name] = owner
        elif key == "toolkit" and value:
            state.setdefault("toolkits", []).append(value)
        elif key == "package" and value:
            name, _, status = value.partition(" ")
            if status == "installed":
                state.setdefault("packages", []).append(name)
        elif key == "uv" and value:
            # "uv 0.13.9" or "uv 0.13.9 (x86_64-unknown-linux-gnu)"
            words = value.split()
            state["uv"] = words[1] if len(words) > 1 and words[0] == "uv" else None
    return state


class EngineState(FactBase[EngineHost]):
    """
    Returns the engine environments under the engine root, the `current` link and uv's version.

    .. code:: python

        {
            "current": "0.5.11-cu128-1a2b3c4d",
            "envs": {
                "0.5.11-cu128-1a2b3c4d": {"complete": True, "activated_at": 1767225600},
                "0.5.19-cu128-9f8e7d6c": {"complete": False, "activated_at": None},
            },
            "uv": "0.13.9",
            "toolkits": ["12.8.93-4c08ae3e"],
            "packages": ["libnuma1", "g++"],
            "caches": {"0.5.11-cu128-1a2b3c4d": "sglang"},
            "proven": {
                "0.5.11-cu128-1a2b3c4d": {
                    "date": "2026-12-01",
                    "gpus": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8,
                    "driver": "570.172.08",
                    "user": "sglang",
                },
            },
        }

    + engine_root: where environments live (ENGINE_ROOT/envs/<name>, ENGINE_ROOT/current)
    """

    def command(self, engine_root: str) -> StringCommand:
        return StringCommand(state_script(engine_root))

    def process(self, output: list[str]) -> EngineHost:
        return parse_engine_state(output)


def state_script(engine_root: str) -> str:
    """The shell that reads it (EngineState, and the ServingState fact's `engine` lines): every
    path from layout.EngineTree, quoted."""
    tree = EngineTree(engine_root)
    envs, cuda = shlex.quote(tree.envs), shlex.quote(tree.cuda)
    caches = shlex.quote(tree.caches)
    return " ".join(
        (
            f'for d in {envs}/*/; do [ -d "$d" ] || continue; n=${{d%/}}; n=${{n##*/}};',
            f'if [ -f "${{d}}{MARKER}" ]; then echo "env=$n $(stat -c %Y "${{d}}{MARKER}")";',
            'else echo "partial=$n"; fi;',
            f'[ ! -f "${{d}}{ENGINE_PROVEN}" ] || echo "proven=$n $(head -c 4096',
            f'"${{d}}{ENGINE_PROVEN}" | tr -d \'\\n\')"; done;',
            f'echo "current=$(readlink {shlex.quote(tree.current)} 2>/dev/null)";',
            f'echo "uv=$({shlex.quote(tree.uv)} --version 2>/dev/null)";',
            f'for d in {caches}/*/; do [ -d "$d" ] || continue; n=${{d%/}};',
            'echo "cache=${n##*/} $(stat -c %U "$d")"; done;',
            f'for d in {cuda}/*/; do [ -f "${{d}}{TOOLKIT_MARKER}" ] &&',
            'n=${d%/} && echo "toolkit=${n##*/}"; done;',
            "dpkg-query -W -f='package=${Package} ${db:Status-Status}\\n'",
            f"{' '.join(HOST_PACKAGES)} 2>/dev/null; true",
        )
    )


class WheelhouseFiles(FactBase[dict[str, int]]):
    """
    Returns the wheels in a directory on the host, by file name, with their sizes in bytes.

    .. code:: python

        {"torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl": 905000000}

    + path: the host's copy of the wheelhouse
    """

    @staticmethod
    def default() -> dict[str, int]:
        # No output: the directory does not exist yet.
        return {}

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "find",
            QuoteString(path),
            "-maxdepth 1 -type f -name '*.whl' -printf '%s %f\\n' 2>/dev/null; true",
        )

    def process(self, output: list[str]) -> dict[str, int]:
        files: dict[str, int] = {}
        for line in output:
            size, _, name = line.strip().partition(" ")
            if size.isdigit() and name:
                files[name] = int(size)
        return files
