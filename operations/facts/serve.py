"""What serves now, in one round trip: the deploy's fact of its rank units and what they run.

Every rank unit file (its checksum and its ExecStart=, which names the engine environment and
the staged model copy the rank runs), the state systemd has for it, the router unit, the other
managed files, the service user, the engine environments and the staged model link. The status
command reads the same with its probes of /health, /metrics and GPU memory added
(operations/facts/serve_status.py); `Serving` holds both answers.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout
from operations.facts.engine import MARKER, EngineHost, parse_engine_state, state_script
from operations.facts.once import gathered
from operations.facts.toolkit_record import MAX_BYTES, ToolkitRecord, parse_record
from operations.render import execstart, host_scripts
from operations.settings import Settings

UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ExecMainStartTimestamp",
    "Environment",
    # "yes" when the unit file (or a drop-in) changed on disk since systemd loaded it
    # (org.freedesktop.systemd1(5), Unit properties: NeedDaemonReload).
    "NeedDaemonReload",
)

# The program that reads the router's worker list on the host (one `python3 -c` argument).
ROUTER_LIST_SCRIPT = "router_list.py"


@dataclass(frozen=True)
class UnitState:
    """One unit: its file (checksum, ExecStart=) and `systemctl show`; `load` is "not-found"
    when systemd has no such unit."""

    unit_sha256: str | None = None
    exec_start: str | None = None
    load: str | None = None
    active: str | None = None
    sub: str | None = None
    main_pid: int | None = None
    restarts: int | None = None
    # When the running process started (epoch seconds); None when it is not running.
    started_at: int | None = None
    # CUDA_VISIBLE_DEVICES from the unit's Environment=.
    visible_devices: str | None = None
    # The unit file's modification time (epoch seconds, `stat -c %Y`); None when absent.
    changed_at: int | None = None
    # systemd's NeedDaemonReload: the file on disk is not the definition systemd holds.
    need_reload: bool = False

    @property
    def exists(self) -> bool:
        return self.unit_sha256 is not None or self.load not in (None, "not-found")

    @property
    def running(self) -> bool:
        return self.active in ("active", "activating", "reloading")

    def argv(self) -> list[str]:
        """ExecStart= as the words it runs (operations/render/execstart.py: the writer's inverse);
        [] when the line cannot be split."""
        if not self.exec_start:
            return []
        try:
            return execstart.decode(self.exec_start)
        except execstart.ExecStartError:
            return []

    def engine_env(self) -> str | None:
        """The environment directory the unit runs (ENV/bin/python -> ENV)."""
        words = self.argv()
        return layout.env_of_python(words[0]) if words else None

    def model_path(self) -> str | None:
        words = self.argv()
        for i, word in enumerate(words[:-1]):
            if word == "--model-path":
                return words[i + 1]
        return None


@dataclass(frozen=True)
class GpuUsage:
    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int


@dataclass(frozen=True)
class RankLoad:
    """A rank's requests from its /metrics: running and queued (None: the page lacks that
    gauge), or why the page could not be read."""

    running: float | None = None
    queued: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class EngineEnv:
    """A complete engine environment under ENGINE_ROOT/envs, as its marker file records it."""

    release: str | None = None
    lane: str | None = None


@dataclass(frozen=True)
class RankStart:
    """A rank's last start as its journal tells it in its release's words
    (programs/startup_phases.py StartupPhases): seconds per phase (None: the log told none),
    the last phase seen and when, after the unit's start; or why it could not be read."""

    healthy_s: float | None = None
    weights_s: float | None = None
    graphs_s: float | None = None
    graphs: int = 0
    warmup_s: float | None = None
    autotune_s: float | None = None
    last_phase: str | None = None
    last_at: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Serving:
    # The host's clock when it answered (uptimes are computed against it, not ours).
    now: int | None = None
    ranks: dict[int, UnitState] = field(default_factory=dict)
    router: UnitState | None = None
    # sha256 of each other managed file (target unit, scripts, secrets); absent when missing.
    files: dict[str, str] = field(default_factory=dict)
    # Modification times (epoch seconds) of the files a rank reads only at its start (the API
    # key file), by path; absent when missing.
    changed_at: dict[str, int] = field(default_factory=dict)
    user_exists: bool = False
    # Environment name -> its marker; the name `current` points at.
    envs: dict[str, EngineEnv] = field(default_factory=dict)
    engine_current: str | None = None
    # The copy the model link points at (".SLUG@KEY").
    model_target: str | None = None
    # The status's probes (the ServingStatus fact, serve_status.py; empty in the deploy's):
    # rank (or "router") -> "200", "503", "refused", "timeout", "error:WHAT"; absent: not probed.
    health: dict[str, str] = field(default_factory=dict)
    # Why nothing was probed (no python3); None when the probes ran or none were asked.
    health_error: str | None = None
    # rank -> its running and queued requests from /metrics; absent: not read.
    load: dict[str, RankLoad] = field(default_factory=dict)
    # rank -> its last start, phase by phase; absent: not read.
    starts: dict[str, RankStart] = field(default_factory=dict)
    gpus: list[GpuUsage] = field(default_factory=list)
    # What nvidia-smi said when it failed; None when it answered or was not asked.
    gpu_error: str | None = None
    # status only: the last throughput records' lines (facts/throughput.py parses them).
    throughput_lines: list[str] = field(default_factory=list)
    # status only: the canary fact's lines (facts/canary.py parse_canary reads them).
    canary_lines: list[str] = field(default_factory=list)
    # status only: the tune fact's lines (facts/tune.py parse_tune reads them).
    tune_lines: list[str] = field(default_factory=list)
    # Unit -> `systemctl is-enabled` ("enabled", "disabled", "" when unknown), for the units
    # asked with `enabled=` (the stage unit: a converged run needs no SystemdStatus fact).
    enabled: dict[str, str] = field(default_factory=dict)
    # What the EngineState fact reads, when asked with `engine=True` (a deploy); else None.
    engine: EngineHost | None = None
    # The router's workers (URL -> healthy) as this host read them, when asked with
    # `router_list`; None when not asked or the router did not answer (router_workers_error).
    router_workers: dict[str, bool] | None = None
    router_workers_error: str | None = None
    # Each worker's state as the router lists it: smg's status (pending, ready, not_ready,
    # failed, draining), sglang-router 0.3.2's is_healthy as healthy/unhealthy.
    router_states: dict[str, str] = field(default_factory=dict)
    # Each worker smg keeps out of routing while its status stands, and why (its `stalled`:
    # unreachable or wedged); absent: routable.
    router_stalled: dict[str, str] = field(default_factory=dict)
    # The router environments under ENGINE_ROOT/router (sglang-router-0.3.2, smg-1.13.0), by path.
    router_envs: list[str] = field(default_factory=list)
    # The toolkit version that last deployed the host (layout.TOOLKIT_RECORD, facts/
    # toolkit_record.py); None: no record.
    toolkit: ToolkitRecord | None = None
    # A throughput check started and did not pass (layout.THROUGHPUT_PENDING: failed, or cut
    # off): the next deploy runs it again (plan/throughput_plan.py).
    throughput_pending: bool = False


def _int(text: str) -> int | None:
    text = text.strip().lstrip("@")
    return int(text) if text.isdigit() else None


def _unit_props(props: dict[str, str]) -> dict[str, object]:
    devices = None
    for assignment in props.get("Environment", "").split():
        key, _, value = assignment.partition("=")
        if key == "CUDA_VISIBLE_DEVICES":
            devices = value
    pid = _int(props.get("MainPID", ""))
    started = _int(props.get("ExecMainStartTimestamp", ""))
    return {
        "load": props.get("LoadState") or None,
        "active": props.get("ActiveState") or None,
        "sub": props.get("SubState") or None,
        "main_pid": pid or None,
        "restarts": _int(props.get("NRestarts", "")),
        # systemd keeps the last start time after the process exited.
        "started_at": started if pid else None,
        "visible_devices": devices,
        "need_reload": props.get("NeedDaemonReload") == "yes",
    }


def _marker(text: str) -> EngineEnv:
    try:
        data = json.loads(text)
    except ValueError:
        return EngineEnv()
    if not isinstance(data, dict):
        return EngineEnv()
    release, lane = data.get("release"), data.get("lane")
    return EngineEnv(
        release if isinstance(release, str) else None, lane if isinstance(lane, str) else None
    )


_SHA256SUM_ESCAPE = re.compile(r"\\(.)")


def _sha256sum(line: str) -> tuple[str, str] | None:
    """(name, digest) of one line of GNU sha256sum: "DIGEST  NAME"; a name holding a backslash
    or a newline is written escaped, its line marked by a leading backslash."""
    escaped = line.startswith("\\")
    digest, two_spaces, name = line.removeprefix("\\").partition("  ")
    if not two_spaces or len(digest) != 64:
        return None
    if escaped:
        name = _SHA256SUM_ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], name)
    return name, digest


def parse_serving(lines: list[str]) -> Serving:
    # `systemctl show` prints one block of KEY=VALUE per unit, blocks separated by a blank line,
    # in its own property order (Id is not first): a block is complete at its end, not at Id.
    block: dict[str, str] = {}
    blocks: list[dict[str, str]] = []
    units: dict[str, dict[str, object]] = {}
    values: dict[str, str] = {}
    files: dict[str, str] = {}
    changed_at: dict[str, int] = {}
    envs: dict[str, EngineEnv] = {}
    enabled: dict[str, str] = {}
    engine_lines: list[str] = []
    workers: dict[str, bool] | None = None
    states: dict[str, str] = {}
    stalled: dict[str, str] = {}
    router_envs: list[str] = []
    for line in lines:
        key, eq, value = line.partition("=")
        if eq and " " not in key and key[:1].isupper():
            if key in block:  # a block without the blank line after it
                blocks.append(block)
                block = {}
            block[key] = value.strip()
            continue
        if block:
            blocks.append(block)
            block = {}
        word, _, rest = line.partition(" ")
        if word == "unit" and (summed := _sha256sum(rest)) is not None:
            units.setdefault(summed[0], {})["unit_sha256"] = summed[1]
        elif word == "exec":
            name, _, command = rest.partition(" ")
            units.setdefault(name, {})["exec_start"] = command.strip() or None
        elif word == "mtime":
            when, _, name = rest.partition(" ")
            if (seconds := _int(when)) is not None and name:
                if name.startswith("/"):
                    changed_at[name] = seconds
                else:
                    units.setdefault(name, {})["changed_at"] = seconds
        elif word == "file" and (summed := _sha256sum(rest)) is not None:
            files[summed[0]] = summed[1]
        elif word == "env":
            name, _, marker = rest.partition(" ")
            envs[name] = _marker(marker)
        elif word == "enabled":
            unit, _, answer = rest.partition(" ")
            enabled[unit] = answer.strip()
        elif word == "engine":
            engine_lines.append(rest)
        elif word == "router_workers":
            if rest.strip() == "ok":
                workers = {}
            else:
                values["router_workers_error"] = rest.removeprefix("error").strip() or "?"
        elif word == "worker" and workers is not None:
            url, _, state = rest.strip().rpartition(" ")
            if url:
                states[url] = state
                # A draining worker is on its way out (smg removes it after its settle time):
                # as good as not listed.
                if state != "draining":
                    workers[url] = state in ("healthy", "ready")
        elif word == "stalled" and workers is not None:
            url, _, reason = rest.strip().rpartition(" ")
            if url:
                stalled[url] = reason
        elif word == "router_env":
            router_envs.append(rest.strip())
        elif word == "toolkit":
            values["toolkit"] = rest
        elif word:
            values[word] = rest.strip()
    if block:
        blocks.append(block)
    for found in blocks:
        name = found.get("Id", "")
        if name:
            units.setdefault(name, {}).update(_unit_props(found))

    ranks: dict[int, UnitState] = {}
    router = None
    for name, props in units.items():
        rank = layout.rank_of(name)
        if rank is not None:
            ranks[rank] = UnitState(**props)  # type: ignore[arg-type]
        elif name == layout.ROUTER_UNIT:
            router = UnitState(**props)  # type: ignore[arg-type]
    current = values.get("engine_current", "").rstrip("/").rsplit("/", 1)[-1] or None
    target = values.get("model_target", "").rstrip("/").rsplit("/", 1)[-1] or None
    return Serving(
        now=_int(values.get("now", "")),
        ranks=dict(sorted(ranks.items())),
        router=router,
        files=files,
        changed_at=changed_at,
        user_exists=values.get("user") == "yes",
        envs=envs,
        engine_current=current,
        model_target=target,
        enabled=enabled,
        # The engine lines end with dpkg's, which the deploy's host always prints (or nothing:
        # then the engine was not asked).
        engine=parse_engine_state(engine_lines) if engine_lines else None,
        router_workers=workers,
        router_workers_error=values.get("router_workers_error") or None,
        router_states=states,
        router_stalled=stalled,
        router_envs=router_envs,
        toolkit=parse_record(values.get("toolkit", "")),
        throughput_pending=values.get("throughput_pending") == "yes",
    )


Words = list[str | QuoteString | StringCommand]


def units_words(ranks: list[int] | None, router: bool) -> Words:
    """The rank unit files, each read by one sha256sum, one grep and one `systemctl show` for
    them all (a process per tool, not per rank), with `ranks` and the router asked even
    without a file: "unit", "exec" and "mtime" lines, then systemd's KEY=VALUE blocks."""
    wanted: Words = [layout.unit_name(r) for r in ranks or []]
    if router:
        wanted.append(layout.ROUTER_UNIT)
    return [
        f'echo "now $(date +%s)"; set --; cd {layout.UNIT_DIR} 2>/dev/null &&',
        f'for u in {layout.RANK_UNIT_GLOB}; do [ -f "$u" ] && set -- "$@" "$u"; done;',
        "[ $# -eq 0 ] || { sha256sum -- \"$@\" | sed 's/^/unit /';",
        "grep -H '^ExecStart=' -- \"$@\" | sed 's/^\\([^:]*\\):ExecStart=/exec \\1 /'; };",
        # When each unit file, the router's and the API key file last changed: against
        # ExecMainStartTimestamp, whether the process runs what the files say now.
        f"stat -c 'mtime %Y %n' -- \"$@\" {layout.ROUTER_UNIT} {layout.SECRETS_FILE}",
        "2>/dev/null;",
        'set -- "$@"',
        *wanted,
        ';[ $# -eq 0 ] || systemctl show "$@" --timestamp=unix',
        *(f"-p {p}" for p in UNIT_PROPERTIES),
        "2>/dev/null; echo;",
    ]


def checksum_words(paths: list[str] | None) -> Words:
    """One sha256sum for every file: "file DIGEST  PATH", nothing for a missing one."""
    if not paths:
        return []
    return ["sha256sum --", *map(QuoteString, paths), "2>/dev/null | sed 's/^/file /';"]


def user_words(user: str | None) -> Words:
    if not user:
        return []
    return ['echo "user $(id -u', QuoteString(user), '>/dev/null 2>&1 && echo yes)";']


def links_words(engine_root: str, model_link: str) -> Words:
    """Each engine environment's marker ("env NAME MARKER"), `current` and the model link."""
    tree = layout.EngineTree(engine_root)
    return [
        # One word: the quoted root and its glob must not be split by the join's spaces.
        f"for m in {shlex.quote(tree.envs)}/*/{MARKER};",
        'do [ -f "$m" ] || continue; d=${m%/*};',
        'echo "env ${d##*/} $(head -c 4096 "$m" | tr -d \'\\n\')"; done;',
        f"for d in {shlex.quote(tree.routers)}/*/;",
        'do [ -d "$d" ] && echo "router_env ${d%/}"; done;',
        'echo "engine_current $(readlink',
        QuoteString(tree.current),
        '2>/dev/null)";',
        'echo "model_target $(readlink',
        QuoteString(model_link),
        '2>/dev/null)";',
    ]


def record_words() -> Words:
    """The toolkit's record on one line ("toolkit TEXT"; the text empty: no record), and
    whether a throughput check is pending ("throughput_pending yes", else empty)."""
    return [
        f'echo "toolkit $(head -c {MAX_BYTES}',
        QuoteString(layout.TOOLKIT_RECORD),
        "2>/dev/null | tr -d '\\n')\";",
        'echo "throughput_pending $(test -e',
        QuoteString(layout.THROUGHPUT_PENDING),
        '&& echo yes)";',
    ]


def serving_words(
    engine_root: str,
    model_link: str,
    paths: list[str] | None = None,
    user: str | None = None,
    ranks: list[int] | None = None,
    router: bool = True,
) -> Words:
    """What both the deploy's and the status's facts read first (their arguments alike)."""
    return [
        *units_words(ranks, router),
        *checksum_words(paths),
        *user_words(user),
        *links_words(engine_root, model_link),
        *record_words(),
    ]


def enabled_words(units: list[str] | None) -> Words:
    words: Words = []
    for unit in units or []:
        words += ['echo "enabled', QuoteString(unit), "$(systemctl is-enabled"]
        words += [QuoteString(unit), '2>/dev/null)";']
    return words


def router_list_words(url: str | None, timeout_s: float) -> Words:
    """The router's worker list as this host reads it (programs/router_list.py)."""
    if not url:
        return []
    return [
        "if command -v python3 >/dev/null 2>&1; then python3 -c",
        QuoteString(host_scripts.script_text(ROUTER_LIST_SCRIPT)),
        str(timeout_s),
        QuoteString(url),
        QuoteString(layout.CONTROL_PLANE_KEY_FILE),
        '; else echo "router_workers error python3 not found"; fi;',
    ]


def engine_words(engine_root: str, engine: bool) -> Words:
    """The EngineState fact's own script, its lines prefixed: one round trip for both."""
    if not engine:
        return []
    return ["(", state_script(engine_root), ") | sed 's/^/engine /';"]


class ServingState(FactBase[Serving]):
    """
    Returns the rank unit files in /etc/systemd/system (checksum, ExecStart=) with systemd's
    state of each, the router unit, the checksums of other managed files, whether the service
    user exists, the engine environments and `current`, the staged model link. One round trip
    whatever the number of ranks.

    .. code:: python

        Serving(
            now=1767225600,
            ranks={0: UnitState(unit_sha256="9f86...", load="loaded", active="active",
                                exec_start="/opt/sglang/envs/0.5.11-cu128-1a2b3c4d/bin/python "
                                           "-m sglang.launch_server --model-path ...",
                                sub="running", main_pid=4242, restarts=0,
                                started_at=1767225000, visible_devices="0")},
            router=None, files={}, user_exists=True,
            envs={"0.5.11-cu128-1a2b3c4d": EngineEnv("0.5.11", "cu128")},
            engine_current="0.5.11-cu128-1a2b3c4d",
            model_target=".Qwen--Qwen3.6-27B@52cd26977905ef55",
        )

    + engine_root: ENGINE_ROOT (its environments and `current` are read)
    + model_link: the staged model link (STAGE_DIR/models/SLUG)
    + paths: other managed files to checksum
    + user: the service user
    + ranks: ranks to show even without a unit file
    + router: whether to read sglang-router.service
    + enabled: units whose `systemctl is-enabled` answer to read
    + engine: also read what the EngineState fact reads (`Serving.engine`): the engine step's
      environments, uv, compilers and host packages, in the same round trip
    + router_list: the router's worker list URL as this host reaches it (a GET): which of this
      host's ranks the router lists (`Serving.router_workers`), so a rank an interrupted run
      left out of the router is put back
    + timeout_s: the router list's timeout
    """

    def command(
        self,
        engine_root: str,
        model_link: str,
        paths: list[str] | None = None,
        user: str | None = None,
        ranks: list[int] | None = None,
        router: bool = True,
        enabled: list[str] | None = None,
        engine: bool = False,
        router_list: str | None = None,
        timeout_s: float = 2.0,
    ) -> StringCommand:
        return StringCommand(
            *serving_words(engine_root, model_link, paths, user, ranks, router),
            *enabled_words(enabled),
            *router_list_words(router_list, timeout_s),
            *engine_words(engine_root, engine),
            "true",
        )

    @staticmethod
    def default() -> Serving:
        return Serving()

    def process(self, output: list[str]) -> Serving:
        return parse_serving(output)


def managed_paths(settings: Settings) -> list[str]:
    """Files the steps write besides the rank units, checksummed by the fact: the registry's
    (layout.managed_files)."""
    return layout.checksummed_paths(settings)


def serving_state(settings: Settings, router_list: str | None = None) -> Serving:
    """The ServingState fact as a deploy reads it (router_list: the router's worker list URL
    as this host reaches it, behind a router). The plan asks it once per run."""
    return gathered(
        ServingState,
        engine_root=settings.engine_root,
        model_link=layout.staged_model_link(settings),
        paths=managed_paths(settings),
        user=settings.service_user,
        enabled=[layout.STAGE_UNIT],
        engine=True,
        router_list=router_list,
    )
