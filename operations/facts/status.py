"""What serves now, for `python -m operations.status`: every rank unit's state and /health, the
engine's `current` target, the staged model, GPU memory and the router, in one round trip.

The health probes run on the host itself (python3's urllib, all ranks at once, a short timeout),
so a rank bound to a loopback or private address is checked from where it listens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations.facts.engine import MARKER

ROUTER_KEY = "router"
# Every `systemctl show` block starts with this line, so properties are never attributed to the
# wrong unit whatever order systemd prints them in.
UNIT_HEADER = "@@unit"
UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ExecMainStartTimestamp",
    "Environment",
)
GPU_QUERY = "index,name,memory.used,memory.total"
GPU_TIMEOUT_S = 10  # a wedged driver must not hang the status

# argv: timeout, then KEY=URL pairs; prints "health KEY CODE" (the HTTP status) or
# "health KEY refused|timeout|error:WHAT". Proxies are ignored: the URLs are the host's own.
_PROBE = """\
import sys, socket, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
timeout = float(sys.argv[1])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def probe(pair):
    key, url = pair.split("=", 1)
    try:
        with opener.open(url, timeout=timeout) as r:
            return key, str(r.status)
    except urllib.error.HTTPError as e:
        return key, str(e.code)
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            return key, "refused"
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return key, "timeout"
        return key, "error:" + type(reason).__name__
    except (socket.timeout, TimeoutError):
        return key, "timeout"
    except Exception as e:
        return key, "error:" + type(e).__name__
pairs = sys.argv[2:]
with ThreadPoolExecutor(max(1, len(pairs))) as pool:
    for key, answer in pool.map(probe, pairs):
        print("health", key, answer)
"""


@dataclass(frozen=True)
class UnitStatus:
    """`systemctl show` of one unit; `load` is "not-found" when there is no such unit."""

    load: str | None = None
    active: str | None = None
    sub: str | None = None
    main_pid: int | None = None
    restarts: int | None = None
    # When the running process started (epoch seconds); None when it is not running.
    started_at: int | None = None
    # CUDA_VISIBLE_DEVICES from the unit's Environment=.
    visible_devices: str | None = None

    @property
    def exists(self) -> bool:
        return self.load not in (None, "not-found")


@dataclass(frozen=True)
class GpuUsage:
    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int


@dataclass(frozen=True)
class HostStatus:
    # The host's clock when it answered (uptimes are computed against it, not ours).
    now: int | None = None
    ranks: dict[int, UnitStatus] = field(default_factory=dict)
    router: UnitStatus | None = None
    # rank (or "router") -> "200", "503", "refused", "timeout", "error:WHAT"; absent: not probed.
    health: dict[str, str] = field(default_factory=dict)
    # Why nothing was probed (no python3); None when the probes ran.
    health_error: str | None = None
    # The environment ENGINE_ROOT/current names, and what its marker file records.
    engine_current: str | None = None
    engine_release: str | None = None
    engine_lane: str | None = None
    engine_changed_at: int | None = None
    # The staged copy the model path points at (".SLUG@DIGEST") and its digest.
    model_target: str | None = None
    model_digest: str | None = None
    model_changed_at: int | None = None
    # The hub revision our download marker records (hf:// sources), else None.
    model_hub_revision: str | None = None
    gpus: list[GpuUsage] = field(default_factory=list)
    # What nvidia-smi said when it failed; None when it answered.
    gpu_error: str | None = None

    def stale(self, rank: int) -> bool:
        """The rank started before the engine or the model last switched: it runs the old one."""
        unit = self.ranks.get(rank)
        if unit is None or unit.started_at is None:
            return False
        changes = [t for t in (self.engine_changed_at, self.model_changed_at) if t is not None]
        return any(unit.started_at < t for t in changes)


def _int(text: str) -> int | None:
    text = text.strip().lstrip("@")
    return int(text) if text.isdigit() else None


def _unit(props: dict[str, str]) -> UnitStatus:
    devices = None
    for assignment in props.get("Environment", "").split():
        key, _, value = assignment.partition("=")
        if key == "CUDA_VISIBLE_DEVICES":
            devices = value
    started = _int(props.get("ExecMainStartTimestamp", ""))
    pid = _int(props.get("MainPID", ""))
    return UnitStatus(
        load=props.get("LoadState") or None,
        active=props.get("ActiveState") or None,
        sub=props.get("SubState") or None,
        main_pid=pid or None,
        restarts=_int(props.get("NRestarts", "")),
        # systemd keeps the last start time after the process exited.
        started_at=started if pid else None,
        visible_devices=devices,
    )


def _gpu(line: str) -> GpuUsage | None:
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 4 or not cells[0].isdigit():
        return None
    index, name, used, total = cells
    return GpuUsage(
        index=int(index),
        name=name,
        memory_used_mib=int(used) if used.isdigit() else 0,
        memory_total_mib=int(total) if total.isdigit() else 0,
    )


def _marker(text: str) -> tuple[str | None, str | None]:
    try:
        data = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    release, lane = data.get("release"), data.get("lane")
    return (
        release if isinstance(release, str) else None,
        lane if isinstance(lane, str) else None,
    )


def parse_status(lines: list[str]) -> HostStatus:
    values: dict[str, str] = {}
    units: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    health: dict[str, str] = {}
    gpu_lines: list[str] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == UNIT_HEADER:
            current = units.setdefault(rest, {})
        elif current is not None and "=" in line and not line.startswith("@@"):
            key, _, value = line.partition("=")
            current[key] = value.strip()
        elif word == "@@end":
            current = None
        elif word == "health":
            key, _, answer = rest.partition(" ")
            health[key] = answer.strip()
        elif word == "gpu":
            gpu_lines.append(rest)
        else:
            values[word] = rest

    ranks: dict[int, UnitStatus] = {}
    router = None
    for name, props in units.items():
        if name.startswith("sglang@") and name.endswith(".service"):
            number = name[len("sglang@") : -len(".service")]
            if number.isdigit():
                ranks[int(number)] = _unit(props)
        elif name == "sglang-router.service":
            router = _unit(props)

    gpus: list[GpuUsage] = []
    gpu_error = None
    rc = values.get("gpu_rc", "")
    if rc == "127":
        gpu_error = "nvidia-smi not found"
    elif rc == "124":
        gpu_error = f"nvidia-smi did not answer within {GPU_TIMEOUT_S}s"
    elif rc != "0":
        gpu_error = " ".join(gpu_lines) or f"nvidia-smi exit status {rc or '?'}"
    else:
        for line in gpu_lines:
            gpu = _gpu(line)
            if gpu is None:
                gpus, gpu_error = [], f"unexpected nvidia-smi output: {line!r}"
                break
            gpus.append(gpu)

    engine = values.get("engine_current", "").rstrip("/").rsplit("/", 1)[-1] or None
    release, lane = _marker(values.get("engine_marker", ""))
    target = values.get("model_target", "").rstrip("/").rsplit("/", 1)[-1] or None
    digest = target.rsplit("@", 1)[1] if target and "@" in target else None
    return HostStatus(
        now=_int(values.get("now", "")),
        ranks=dict(sorted(ranks.items())),
        router=router,
        health=health,
        health_error=values.get("health_unavailable") or None,
        engine_current=engine,
        engine_release=release,
        engine_lane=lane,
        engine_changed_at=_int(values.get("engine_changed", "")),
        model_target=target,
        model_digest=digest,
        model_changed_at=_int(values.get("model_changed", "")),
        model_hub_revision=values.get("model_hub_revision") or None,
        gpus=gpus,
        gpu_error=gpu_error,
    )


class ServingStatus(FactBase[HostStatus]):
    """
    Returns the state of every rank unit (the expected ones and any other present), their
    /health answers probed from the host, the engine and model that `current` and the staged
    model path point at, GPU memory use and the router unit. One round trip for the host.

    .. code:: python

        HostStatus(
            now=1767225600,
            ranks={0: UnitStatus(load="loaded", active="active", sub="running", main_pid=4242,
                                 restarts=0, started_at=1767225000, visible_devices="0")},
            router=None, health={"0": "200"}, health_error=None,
            engine_current="0.5.11-cu128-1a2b3c4d", engine_release="0.5.11", engine_lane="cu128",
            engine_changed_at=1767224000, model_target=".Qwen--Qwen3.6-27B@52cd26977905ef55",
            model_digest="52cd26977905ef55", model_changed_at=1767224500,
            model_hub_revision=None,
            gpus=[GpuUsage(index=0, name="NVIDIA H200", memory_used_mib=120000,
                           memory_total_mib=143771)],
            gpu_error=None,
        )

    + ranks: the configured ranks (queried even when their unit is missing)
    + health_urls: rank number (or "router") -> its /health URL, as the host reaches it
    + engine_root: ENGINE_ROOT (its `current` link and marker are read)
    + model_path: the staged model path the servers read
    + hub_marker: the hub download marker of an hf:// source, else None
    + router: whether to read sglang-router.service
    + timeout_s: each /health probe's timeout
    """

    def command(
        self,
        ranks: list[int],
        health_urls: dict[str, str],
        engine_root: str,
        model_path: str,
        hub_marker: str | None = None,
        router: bool = False,
        timeout_s: float = 2.0,
    ) -> StringCommand:
        units: list[str | QuoteString] = [f"sglang@{rank}.service" for rank in ranks]
        if router:
            units.append("sglang-router.service")
        probes: list[str | QuoteString] = [
            QuoteString(f"{key}={url}") for key, url in sorted(health_urls.items())
        ]
        hub: list[str | QuoteString] = []
        if hub_marker:
            hub = ['echo "model_hub_revision $(head -n1', QuoteString(hub_marker), '2>/dev/null)";']
        props = " ".join(f"-p {p}" for p in UNIT_PROPERTIES)
        return StringCommand(
            'echo "now $(date +%s)";',
            "units=$(cd /etc/systemd/system 2>/dev/null && for u in sglang@*.service; do",
            '[ -f "$u" ] && echo "$u"; done);',
            "for u in $(printf '%s\\n'",
            *units,
            "$units | sort -u); do",
            f'echo "{UNIT_HEADER} $u"; systemctl show "$u" --timestamp=unix {props} 2>/dev/null;',
            "done;",
            'echo "@@end";',
            "if command -v python3 >/dev/null 2>&1; then python3 -c",
            QuoteString(_PROBE),
            str(timeout_s),
            *probes,
            '; else echo "health_unavailable python3 not found on the host"; fi;',
            'echo "engine_current $(readlink',
            QuoteString(f"{engine_root}/current"),
            '2>/dev/null)";',
            'echo "engine_changed $(stat -c %Z',
            QuoteString(f"{engine_root}/current"),
            '2>/dev/null)";',
            'echo "engine_marker $(head -c 4096',
            QuoteString(f"{engine_root}/current/{MARKER}"),
            "2>/dev/null | tr -d '\\n')\";",
            'echo "model_target $(readlink',
            QuoteString(model_path),
            '2>/dev/null)";',
            'echo "model_changed $(stat -c %Z',
            QuoteString(model_path),
            '2>/dev/null)";',
            *hub,
            f"out=$(timeout {GPU_TIMEOUT_S} nvidia-smi --query-gpu={GPU_QUERY}",
            '--format=csv,noheader,nounits 2>&1); rc=$?; [ -n "$out" ] &&',
            "printf '%s\\n' \"$out\" | sed 's/^/gpu /'; echo \"gpu_rc $rc\"; true",
        )

    @staticmethod
    def default() -> HostStatus:
        return HostStatus()

    def process(self, output: list[str]) -> HostStatus:
        return parse_status(output)
