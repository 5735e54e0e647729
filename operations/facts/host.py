"""What the container offers around the GPUs: memory, /dev/shm, disk, device nodes, glibc,
Python, systemd, and the model source. Each fact is one round trip."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout
from operations.programs.stage_manifest import CONFIG_MARKER as CONFIG_MARKER  # the fact's marker
from operations.programs.stage_manifest import SCAN_ERROR_MARKER
from operations.programs.stage_manifest import TOKENIZER_MARKER as TOKENIZER_MARKER
from operations.render import host_scripts


@dataclass(frozen=True)
class PathStat:
    """One path component as lstat sees it (GNU stat: %u %g %a %F): never the link's target."""

    uid: int
    gid: int
    mode: int  # permission bits with setuid/setgid/sticky, as %a prints them (1777 for /tmp)
    kind: str  # "directory", "symbolic link", "regular file", ...

    @property
    def is_link(self) -> bool:
        return self.kind == "symbolic link"


def parse_path_stat(text: str) -> PathStat | None:
    """'UID|GID|MODE|KIND' -> PathStat; None when stat printed nothing usable."""
    parts = text.split("|", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:2]):
        return None
    try:
        mode = int(parts[2], 8)
    except ValueError:
        return None
    return PathStat(int(parts[0]), int(parts[1]), mode, parts[3].strip())


@dataclass(frozen=True)
class Resources:
    stage_total_bytes: int | None = None
    stage_free_bytes: int | None = None
    mem_total_bytes: int | None = None
    # The container's cgroup memory limit; None when unlimited (then mem_total applies).
    cgroup_limit_bytes: int | None = None
    engine_free_bytes: int | None = None
    glibc: str | None = None
    python: str | None = None
    systemd: int | None = None
    device_nodes: list[str] = field(default_factory=list)
    # /opt/rocm exists: tvm-ffi then compiles SGLang's kernels with hipcc (sglang#30120).
    rocm: bool = False
    # rsync on the target's PATH (the receiving end of a controller source's sync); None:
    # not asked (an older capture).
    rsync: bool | None = None
    # lstat of every existing component of the root paths asked for (and of the paths they
    # resolve to): path -> its owner, group, mode and kind. Read by preflight.unsafe_roots.
    components: dict[str, PathStat] = field(default_factory=dict)
    # Each root path asked for -> the path its deepest existing part resolves to (readlink -f).
    resolved: dict[str, str] = field(default_factory=dict)

    @property
    def memory_limit_bytes(self) -> int | None:
        limits = [v for v in (self.mem_total_bytes, self.cgroup_limit_bytes) if v]
        return min(limits) if limits else None


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _limit(text: str) -> int | None:
    # cgroup v2 says "max"; v1 says "unlimited" with a number near 2**63.
    value = _int(text)
    return value if value is not None and value < 2**62 else None


def parse_resources(lines: list[str]) -> Resources:
    values: dict[str, str] = {}
    nodes: list[str] = []
    components: dict[str, PathStat] = {}
    resolved: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition("=")
        if key == "dev":
            nodes.append(value.strip())
        elif key == "own":
            # own=PATH|UID|GID|MODE|KIND; root paths hold no '|' (the settings' pattern).
            path, _, rest = value.partition("|")
            found = parse_path_stat(rest)
            if found is not None:
                components[path] = found
        elif key == "real":
            path, _, real = value.partition("|")
            if real.startswith("/"):
                resolved[path] = real.strip()
        else:
            values[key] = value.strip()
    stage = values.get("stage", "").split()
    systemd = values.get("systemd", "").split()
    glibc = values.get("glibc", "").split()
    mem_kib = _int(values.get("mem_kib", ""))
    return Resources(
        stage_total_bytes=_int(stage[0]) if len(stage) == 2 else None,
        stage_free_bytes=_int(stage[1]) if len(stage) == 2 else None,
        mem_total_bytes=mem_kib * 1024 if mem_kib else None,
        cgroup_limit_bytes=_limit(values.get("cgroup_max", "")),
        engine_free_bytes=_int(values.get("engine_free", "")),
        rocm=values.get("rocm") == "1",
        rsync={"1": True, "0": False}.get(values.get("rsync", "")),
        glibc=glibc[-1] if glibc else None,
        python=values.get("python", "").removeprefix("Python ").strip() or None,
        systemd=_int(systemd[1]) if len(systemd) > 1 else None,
        device_nodes=sorted(nodes),
        components=components,
        resolved=resolved,
    )


class HostResources(FactBase[Resources]):
    """
    Returns memory, the stage tmpfs, free disk for engines, glibc, Python, systemd, the
    NVIDIA device nodes and the owner and mode of every component of the root paths, in one
    round trip.

    + stage_dir: the tmpfs the model is staged into (e.g. /dev/shm)
    + engine_root: where engine environments go (its nearest existing parent is measured)
    + roots: paths root writes or runs under; each existing component is lstat'ed, and so is
      each component of the path its deepest existing part resolves to
    """

    def command(self, stage_dir: str, engine_root: str, roots: Sequence[str] = ()) -> StringCommand:
        # _separator="": pyinfra flattens nested commands, so spaces are written out here.
        owners: list[str | QuoteString] = []
        if roots:
            owners = ["; " + _OWNERS_FUNCTION + "; for p in"]
            for root in roots:
                owners += [" ", QuoteString(root)]
            owners.append('; do owners "$p"; done')
        return StringCommand(
            "stage=",
            QuoteString(stage_dir),
            "; root=",
            QuoteString(engine_root),
            "; " + _RESOURCES_SCRIPT,
            *owners,
            _separator="",
        )

    @staticmethod
    def default() -> Resources:
        return Resources()

    def process(self, output: list[str]) -> Resources:
        return parse_resources(output)


# Every probe tolerates absence: an unknown value is reported as unknown, not as a failure.
_RESOURCES_SCRIPT = " ".join(
    (
        'echo "stage=$(df -B1 --output=size,avail "$stage" 2>/dev/null | tail -n1)";',
        "echo \"mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)\";",
        'echo "cgroup_max=$(cat /sys/fs/cgroup/memory.max 2>/dev/null',
        '|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null)";',
        'while [ ! -e "$root" ]; do root=$(dirname "$root"); done;',
        'echo "engine_free=$(df -B1 --output=avail "$root" 2>/dev/null | tail -n1)";',
        'echo "glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null)";',
        # `python3 -V` prints what platform.python_version() returns, without importing it.
        'echo "python=$(python3 -V 2>/dev/null)";',
        'echo "systemd=$(systemctl --version 2>/dev/null | head -n1)";',
        '[ -e /opt/rocm ] && echo "rocm=1";',
        "if command -v rsync >/dev/null 2>&1; then echo rsync=1; else echo rsync=0; fi;",
        f'for n in {layout.GPU_NODE_GLOB}; do [ -e "$n" ] && echo "dev=$n"; done; true',
    )
)


# owners PATH: "real=PATH|RESOLVED", then "own=C|UID|GID|MODE|KIND" for every existing
# component C of PATH and of RESOLVED (lstat: stat without -L never follows the last link),
# one `stat` for all of a path's components.
_OWNERS_FUNCTION = " ".join(
    (
        'walk() { c=; rest=${1#/}; set -- /; while [ -n "$rest" ]; do part=${rest%%/*};',
        'case $rest in */*) rest=${rest#*/};; *) rest=;; esac; c="$c/$part";',
        '{ [ -e "$c" ] || [ -L "$c" ]; } || break; set -- "$@" "$c"; done;',
        "stat -c 'own=%n|%u|%g|%a|%F' -- \"$@\" 2>/dev/null; };",
        'owners() { q=$1; while [ "$q" != / ] && [ ! -e "$q" ] && [ ! -L "$q" ]; do',
        'q=$(dirname "$q"); done; r=$(readlink -f "$q" 2>/dev/null);',
        'echo "real=$1|$r"; walk "$1"; [ -n "$r" ] && [ "$r" != "$q" ] && walk "$r"; true; }',
    )
)


@dataclass(frozen=True)
class Model:
    exists: bool
    size_bytes: int | None = None
    # config.json's "architectures"[0]; None when there is no readable config.json.
    architecture: str | None = None
    config_error: str | None = None
    # config.json's quantization_config.quant_method ("fp8", ...); None: unquantized weights
    # (or no readable config.json).
    quantization: str | None = None
    # Why the staging copy's scan refuses the source (a link that leaves it, dangles or loops,
    # an unreadable file); its size is then unknown. None: the scan read it.
    scan_error: str | None = None
    # The tokenizer files at the top of the directory (programs/tokenizer_files.py), as the
    # scan found them; None: not known (no scan, or it refused the source).
    tokenizer: tuple[str, ...] | None = None


# Printed instead of the model's lines when the target has no python3 (the staging copy, and
# so the reading of its source, need it).
NO_PYTHON_MARKER = "@@no-python3"


def parse_model(lines: list[str]) -> Model:
    if not lines or lines[0].strip() != "exists":
        return Model(exists=False)
    size = _int(lines[1]) if len(lines) > 1 else None
    if NO_PYTHON_MARKER in lines:
        return Model(
            exists=True,
            config_error="python3 is missing on the target (the source is read with it)",
        )
    refused = None
    if len(lines) > 3 and lines[2] == SCAN_ERROR_MARKER:
        refused = lines[3].strip() or "the scan refused the source"
    start = lines.index(CONFIG_MARKER) + 1 if CONFIG_MARKER in lines else len(lines) + 1
    tokenizer = None
    for line in lines[: start - 1]:
        words = line.split()
        if words[:1] == [TOKENIZER_MARKER]:
            tokenizer = tuple(words[1:])
    if start > len(lines):
        why = "no readable config.json"
        return Model(True, size, config_error=why, scan_error=refused, tokenizer=tokenizer)
    try:
        config = json.loads("\n".join(lines[start:]))
        arch = config["architectures"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        why = "config.json has no architectures"
        return Model(True, size, config_error=why, scan_error=refused, tokenizer=tokenizer)
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return Model(
        exists=True,
        size_bytes=size,
        architecture=str(arch),
        quantization=str(method) if method is not None else None,
        scan_error=refused,
        tokenizer=tokenizer,
    )


class ModelSource(FactBase[Model]):
    """
    Returns whether a model directory exists, the bytes the staging copy takes from it, and
    its architecture (config.json).

    Read by the staging copy's own code (operations/programs/stage_source.py, sent inline: its
    scan and its link rule), so a Hugging Face cache snapshot, whose files are links into
    ../../blobs/, is measured and read as it will be staged, and a config.json linked out of
    the source (to a root-only file) is never read.

    + path: the model directory on the target
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "if command -v python3 >/dev/null 2>&1; then python3 -c",
            QuoteString(host_scripts.script_text("stage_source.py")),
            QuoteString(path),
            # Never silent: pyinfra hands an empty output to default(), not to process().
            "; elif [ -d",
            QuoteString(path),
            f"]; then echo exists; echo; echo {NO_PYTHON_MARKER}; else echo missing; fi; true",
        )

    @staticmethod
    def default() -> Model:
        return Model(exists=False)

    def process(self, output: list[str]) -> Model:
        return parse_model(output)
