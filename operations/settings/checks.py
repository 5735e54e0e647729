"""The checks beyond the schema's reach: control characters in any value, paths that could mean
another directory than they read as or lie where another user writes, a hub CLI that would take
over a system directory, a root service user. Each answers (key, why)."""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from operations.settings.schema_json import schema

# Unicode categories no setting may contain: controls (newline, NUL, ESC, DEL, C1) and the line
# and paragraph separators. A newline in a value would start a new line in a unit file.
_FORBIDDEN_CATEGORIES = ("Cc", "Zl", "Zp")
# Target paths the deploy writes into or installs under: never a system directory itself.
_SYSTEM_DIRS = frozenset(
    {
        *("/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64"),
        *("/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp"),
        *("/usr", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/local/sbin"),
        *("/var", "/var/cache", "/var/lib", "/var/log", "/var/tmp"),
    }
)
# Trees owned by the distribution or the kernel: no environment of ours goes under them.
# /usr/local/ is the administrator's and allowed (/usr/local/hf/bin/hf).
_SYSTEM_TREES: tuple[str, ...] = ("/bin/", "/boot/", "/dev/", "/etc/", "/lib/", "/proc/")
_SYSTEM_TREES += ("/run/", "/sbin/", "/sys/", "/tmp/", "/var/tmp/")
_PATH_KEYS = ("model_stage_dir", "model_cache_dir", "engine_root", "model_hub_cli")
# Trees every local user may write in: root never writes or runs anything under them. The one
# exception is the stage tree the staging script makes and checks itself (/dev/shm/models).
_SHARED_TREES = ("/tmp", "/var/tmp", "/dev/shm")
_STAGE_TMPFS = "/dev/shm"


def _strings(value: Any, where: str) -> Iterable[tuple[str, str]]:
    """(where, text) for every string in a setting's value, nested ones included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def control_characters(text: str) -> list[str]:
    """The control characters in text, as Python escapes ('\\n', '\\x00'); [] when clean."""
    found = {c for c in text if unicodedata.category(c) in _FORBIDDEN_CATEGORIES}
    return sorted(repr(c)[1:-1] for c in found)


def path_escape(path: str) -> str | None:
    """Why an absolute path could mean another directory than it reads as, or None."""
    if not path.startswith("/"):
        return "it is not absolute"
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    if any(p in ("", ".", "..") for p in parts):
        return "it has an empty, '.' or '..' component"
    return None


def _hub_cli_problem(cli: str) -> str | None:
    """model_hub_cli is installed as VENV/bin/hf: VENV must be a directory of its own."""
    venv = posixpath.dirname(posixpath.dirname(cli))
    in_system_tree = (venv + "/").startswith(_SYSTEM_TREES) or (
        venv.startswith("/usr/") and not venv.startswith("/usr/local/")
    )
    if not cli.endswith("/bin/hf"):
        return "the CLI is installed as DIR/bin/hf; accepted: such as /opt/sglang-hub/bin/hf"
    if venv in _SYSTEM_DIRS or in_system_tree:
        return (
            f"its environment would be {venv}, a system directory that the Hugging Face CLI's "
            "install would take over; accepted: DIR/bin/hf with DIR a directory of its own, "
            "such as /opt/sglang-hub/bin/hf"
        )
    return None


def _shared_tree_problem(key: str, path: str) -> str | None:
    """A root path under a tree every local user writes in (/tmp, /var/tmp, /dev/shm): another
    user could make the directory first, or plant a file root then runs or serves."""
    where = posixpath.dirname(posixpath.dirname(path)) if key == "model_hub_cli" else path
    where = where.rstrip("/") or "/"
    if key == "model_stage_dir" and where == _STAGE_TMPFS:
        return None  # the staging script makes and checks STAGE_DIR/models itself
    if key == "model_stage_dir":
        accepted = f"{_STAGE_TMPFS} itself (the staging script makes and checks its models tree)"
        accepted += " or a tmpfs mounted where only root writes"
    else:
        accepted = "a directory that only root writes to, such as "
        accepted += schema()["properties"][key]["default"]
    for tree in _SHARED_TREES:
        if where == tree or where.startswith(tree + "/"):
            return (
                f"it lies in {tree}, which every local user can write in: another user could "
                f"make {where} first or plant a file there that root then runs or serves; "
                f"accepted: {accepted}"
            )
    return None


def _source_problem(source: str) -> str | None:
    if source.startswith("hf://"):
        repo, _, revision = source.removeprefix("hf://").rpartition("@")
        if ".." in repo or "--" in repo or ".." in revision:
            return (
                "a hub repository or revision holding '..' or '--' (the hub forbids them in "
                "names; a revision with '..' would leave the cache directory); accepted: "
                "hf://org/name@revision"
            )
        return None
    path = source.removeprefix("controller:")
    why = path_escape(path)
    if why is None and path.rstrip("/") in ("", "/"):
        why = "it is the root directory"
    return f"{why}; accepted: a model directory as a plain absolute path" if why else None


def _rollout_problem(values: Mapping[str, Any]) -> str | None:
    """A canary needs a rank that keeps the old engine to be compared with: fewer canary ranks
    than dp_size (the schema has checked each key's own shape). Only a canary asked for by
    name: an unset strategy that cannot compare rolls as today (plan/canary_plan.py says so)."""
    props = schema()["properties"]
    rollout = {**props["rollout"]["default"], **values.get("rollout", {})}
    dp_size = values.get("dp_size", props["dp_size"]["default"])
    if rollout.get("strategy") != "canary" or rollout["canary_ranks"] < dp_size:
        return None
    accepted = (
        f"rollout.canary_ranks {'1' if dp_size == 2 else f'from 1 to {dp_size - 1}'}, or "
        'rollout.strategy "rolling"'
        if dp_size > 1
        else 'rollout.strategy "rolling" (one rank has none to compare with)'
    )
    return (
        f"rollout.canary_ranks = {rollout['canary_ranks']} with dp_size {dp_size} leaves no rank "
        f"on the old engine to compare the canary with; accepted: {accepted}, set in the "
        "inventory on the controller"
    )


def control_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, why) for values holding control characters, nested strings included."""
    problems: list[tuple[str, str]] = []
    for key, value in values.items():
        for where, text in _strings(value, key):
            bad = control_characters(text)
            if bad:
                problems.append(
                    (
                        key,
                        f"{where} holds control characters ({', '.join(bad)}); accepted: "
                        "text without control characters (no newline, tab, NUL or escape)",
                    )
                )
    return problems


def value_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, why) for values of the right shape that are still unsafe to use."""
    problems: list[tuple[str, str]] = []
    for key in _PATH_KEYS:
        if key in values:
            why = path_escape(values[key])
            if why:
                problems.append((key, f"{why}; accepted: a plain absolute path"))
    for key in _PATH_KEYS:
        if key in values and not any(k == key for k, _ in problems):
            why = _shared_tree_problem(key, values[key])
            if why:
                problems.append((key, why))
    if "model_hub_cli" in values and not any(k == "model_hub_cli" for k, _ in problems):
        why = _hub_cli_problem(values["model_hub_cli"])
        if why:
            problems.append(("model_hub_cli", why))
    if "model_source" in values:
        why = _source_problem(values["model_source"])
        if why:
            problems.append(("model_source", why))
    name = values.get("model_name")
    if isinstance(name, str) and any(p in (".", "..") for p in name.split("/")):
        problems.append(
            (
                "model_name",
                "a '.' or '..' part would name a directory outside the stage dir; "
                'accepted: a model name such as "Qwen/Qwen3.6-27B"',
            )
        )
    if (why := _rollout_problem(values)) is not None:
        problems.append(("rollout", why))
    if values.get("service_user") == "root":
        problems.append(
            (
                "service_user",
                "the servers would run as root; accepted: an unprivileged system "
                'user such as "sglang" (created by the deploy)',
            )
        )
    return problems
