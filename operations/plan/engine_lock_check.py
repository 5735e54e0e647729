"""Whether the controller may keep (or upload) an engine's uv.lock: pure, on the lock's text.

A lock decides what every later host of an engine installs as root, and the first host's lock
comes back from that host (engine.fetch_lock). The controller keeps it only if it could have
come from the settings' own sources alone:

- every `[[package]]` comes from a registry the settings name: the main index
  (`package_index_url`, else PyPI's https://pypi.org/simple), one of the engine's explicit
  indexes (engine_spec.indexes), or, offline, a wheelhouse directory (any host's: the path
  is where the lock was resolved, the install reads this host's own wheelhouse); the project
  itself is the one virtual package (`sglang-engine`, source `virtual = "."`). A git, URL, path
  or editable source, or any other registry, is refused. uv never writes credentials into a
  lock, so the settings' URLs are compared without them, and a lock URL that holds some is
  refused as another index;
- every wheel and sdist fetched from an index carries a sha256 hash (uv's `hash =
  "sha256:..."`); a wheel of the wheelhouse has none (uv writes no hash for a find-links
  directory) and must be a file the controller's own wheelhouse holds;
- every package has a wheel: the engine never builds from source (`no-build`), so a package
  with only an sdist is one the lock could install only by running its build.

The lock format: https://docs.astral.sh/uv/concepts/projects/layout/#the-lockfile (uv.lock,
`version = 1`): `[[package]]` tables with `name`, `version`, `source`, `sdist`, `wheels`.
"""

from __future__ import annotations

import re
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from operations.plan.engine_spec import EngineSpec, indexes
from operations.redact import redact
from operations.settings import Settings

PYPI = "https://pypi.org/simple"  # uv's default index when the settings name none
PROJECT = "sglang-engine"  # engine_spec.project_toml's [project] name
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


class LockArgs(TypedDict):
    """LockSources as an operation's keyword arguments (engine.py's lock operations)."""

    registries: list[str]
    wheelhouse: str | None
    wheelhouse_files: list[str] | None


@dataclass(frozen=True)
class LockSources:
    """Where a lock of this engine may take its packages from."""

    registries: tuple[str, ...]  # index URLs as the settings spell them (may hold credentials)
    wheelhouse: str | None = None  # the host's wheelhouse directory, offline
    wheelhouse_files: frozenset[str] | None = None  # the controller's wheel names, offline

    def to_args(self) -> LockArgs:
        """For an operation's or a FunctionCommand's arguments (plain values)."""
        files = sorted(self.wheelhouse_files) if self.wheelhouse_files is not None else None
        return {
            "registries": list(self.registries),
            "wheelhouse": self.wheelhouse,
            "wheelhouse_files": files,
        }

    @classmethod
    def from_args(
        cls, registries: Iterable[str], wheelhouse: str | None, files: Iterable[str] | None
    ) -> LockSources:
        return cls(tuple(registries), wheelhouse, frozenset(files) if files is not None else None)


def lock_sources(
    settings: Settings,
    spec: EngineSpec,
    wheelhouse_dir: str | None = None,
    wheelhouse_files: Iterable[str] | None = None,
) -> LockSources:
    """The settings' sources of `spec`'s lock: its main and explicit indexes, and offline the
    host's wheelhouse directory with the controller's wheel names."""
    main = settings.package_index_url or PYPI
    return LockSources(
        (main, *(i.url for i in indexes(settings, spec))),
        wheelhouse_dir,
        frozenset(wheelhouse_files) if wheelhouse_files is not None else None,
    )


def _plain(url: str) -> str:
    """An index URL as uv writes it into a lock: no credentials, no trailing slash."""
    parts = urllib.parse.urlsplit(url.strip())
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    if ":" in host:  # an IPv6 literal
        netloc = f"[{host}]" + (f":{parts.port}" if parts.port is not None else "")
    path = parts.path.rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme.lower(), netloc.lower(), path, parts.query, ""))


def _has_credentials(url: str) -> bool:
    return bool(urllib.parse.urlsplit(url).username or urllib.parse.urlsplit(url).password)


def check_lock(text: str, sources: LockSources) -> list[str]:
    """Every problem of the lock, each naming the package and what is wrong; [] when it may be
    kept and installed."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return [f"not a uv.lock: {exc}"]
    packages = document.get("package")
    if not isinstance(packages, list) or not packages:
        return ["not a uv.lock: no [[package]] table"]
    allowed = {_plain(u) for u in sources.registries}
    wheelhouse = sources.wheelhouse.rstrip("/") if sources.wheelhouse else None
    shown = ", ".join(redact(u) for u in sources.registries)
    if wheelhouse:
        shown += f", the wheelhouse {wheelhouse}"
    problems: list[str] = []
    for package in packages:
        if not isinstance(package, Mapping):
            problems.append(f"a [[package]] entry is {package!r}, not a table")
            continue
        problems += _package_problems(package, allowed, wheelhouse, sources, shown)
    return problems


def _package_problems(
    package: Mapping[str, object],
    allowed: set[str],
    wheelhouse: str | None,
    sources: LockSources,
    shown: str,
) -> list[str]:
    who = f"{package.get('name', '?')} {package.get('version', '?')}"
    source = package.get("source")
    if not isinstance(source, Mapping) or len(source) != 1:
        return [f"{who}: source {source!r} is not one registry"]
    ((kind, where),) = source.items()
    if kind == "virtual":
        if package.get("name") == PROJECT and where == ".":
            return []
        return [f"{who}: a virtual source {where!r}; only the project {PROJECT} may be one"]
    if kind != "registry" or not isinstance(where, str):
        return [f"{who}: from {kind} {redact(str(where))}; only the configured indexes may be used"]
    # Offline, uv records the find-links directory it resolved from: the wheelhouse of the host
    # that made the lock, whose engine_root may differ from this host's. The install never
    # reads that path (it exports the lock and installs from this host's wheelhouse, --no-index),
    # so any local directory passes here and each wheel must be one the controller holds.
    local = wheelhouse is not None and "://" not in where and where.startswith("/")
    if not local and (_has_credentials(where) or _plain(where) not in allowed):
        return [f"{who}: from {redact(where)}, not one of the configured indexes ({shown})"]
    problems = []
    wheels = package.get("wheels")
    if not isinstance(wheels, list) or not wheels:
        sdist = "an sdist only" if "sdist" in package else "no wheel"
        problems.append(f"{who}: {sdist}; the engine never builds from source (no-build)")
        wheels = []
    entries = [("wheel", w) for w in wheels]
    if "sdist" in package:
        entries.append(("sdist", package["sdist"]))
    for what, entry in entries:
        problems += _file_problems(who, what, entry, local, wheelhouse, sources)
    return problems


def _file_problems(
    who: str,
    what: str,
    entry: object,
    local: bool,
    wheelhouse: str | None,
    sources: LockSources,
) -> list[str]:
    if not isinstance(entry, Mapping):
        return [f"{who}: {what} {entry!r} is not a table"]
    if local and "path" in entry:
        path = str(entry["path"])
        file_name = path.rpartition("/")[2]
        if sources.wheelhouse_files is not None and file_name not in sources.wheelhouse_files:
            return [f"{who}: {what} {file_name} is not in the controller's wheelhouse"]
        return []
    name = str(entry.get("url") or entry.get("path") or "?").rsplit("/", 1)[-1]
    digest = entry.get("hash")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        found = "no hash" if digest is None else f"hash {digest!r}, not a sha256"
        return [f"{who}: {what} {urllib.parse.unquote(name)} has {found}"]
    return []
