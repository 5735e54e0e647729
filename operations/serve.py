"""Step 4 of the deploy: one systemd unit per rank, started or rolled health-gated; the router.

What each rank runs (argv, environment, unit text) was decided by the resolver; this module only
turns "what should run" and the ServingState fact into the fewest changes:

- ranks that are not serving start together, then must all answer /health;
- serving ranks whose unit, engine (`current`), model or API key changed restart in batches of
  `restart_batch_size`, each batch healthy before the next; a batch that fails stops the roll and
  the ranks not yet restarted keep serving the previous version;
- ranks beyond `dp_size` are stopped, disabled and removed.
A converged host gathers one fact here and changes nothing.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any, cast

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand, QuoteString, StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.operations import server, systemd

from operations import resolver
from operations.facts.serve import Serving, ServingState
from operations.host_plan import HostReport
from operations.resolver import ROUTER_UNIT, SECRETS_FILE, Rank, RouterPlan
from operations.secret_files import put_secret
from operations.settings import Settings

UNIT_DIR = "/etc/systemd/system"
TARGET = "sglang.target"
SCRIPT_DIR = "/usr/local/lib/sglang-deploy"
WAIT_SCRIPT = f"{SCRIPT_DIR}/wait_healthy.py"
_WAIT_SOURCE = Path(__file__).parent / "files" / "wait_healthy.py"

TARGET_TEXT = """\
# Written by sglang-deploy (operations/serve.py).
[Unit]
Description=All SGLang ranks of this host
Wants=network-online.target

[Install]
WantedBy=multi-user.target
"""


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def secrets_text(settings: Settings) -> str | None:
    """The options file that carries the API key; None when no key is configured."""
    if not settings.api_key_file:
        return None
    key = Path(settings.api_key_file).expanduser().read_text().strip()
    # JSON string syntax is valid YAML and escapes whatever the key holds.
    import json

    return f"api-key: {json.dumps(key)}\n"


@operation()
def managed_file(
    dest: str,
    content: str | bytes,
    present_sha256: str | None,
    mode: str = "644",
    owner: str = "root",
    group: str = "root",
    dir_mode: str = "755",
) -> Any:
    """
    Upload ``content`` to ``dest`` unless the host already has exactly that. No diff is ever
    printed and the content never appears in a command, so this also carries secrets.

    + dest: remote path
    + content: the file's full text
    + present_sha256: sha256 of the remote file now (from a fact), None when absent
    + mode/owner/group: applied before the file is moved into place
    + dir_mode: the parent directory's mode (owner root, group ``group``) if it is created
    """
    data = content.encode() if isinstance(content, str) else content
    if present_sha256 == sha256(data):
        host.noop(f"{dest} is up to date")
        return
    parent = dest.rsplit("/", 1)[0] or "/"
    yield StringCommand(
        f"[ -d {shlex.quote(parent)} ] ||",
        "install",
        "-d",
        "-m",
        dir_mode,
        "-o",
        "root",
        "-g",
        group,
        parent,
    )
    temp = f"{dest}.sglang-deploy.tmp"
    yield FileUploadCommand(BytesIO(data), temp, remote_temp_filename=temp)
    yield StringCommand("chown", f"{owner}:{group}", temp)
    yield StringCommand("chmod", mode, temp)
    yield StringCommand("mv", "-f", temp, dest)


@operation(is_idempotent=False)
def wait_healthy(checks: list[tuple[str, str]], timeout_s: int, hint: str = "") -> Any:
    """
    Wait until every unit answers 200 on its /health URL; fail with the unit's journal.

    + checks: (unit, health URL) pairs
    + timeout_s: the deadline
    + hint: printed on failure (how to go back)
    """
    words = ["python3", WAIT_SCRIPT, "--timeout", str(timeout_s)]
    if hint:
        words += ["--hint", hint]
    words += [f"{unit}={url}" for unit, url in checks]
    yield shlex.join(words)


def _health_url(settings: Settings, port: int) -> str:
    address = settings.server_host
    if address in ("0.0.0.0", "::"):
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}/health"


def _unit_path(rank: int) -> str:
    return f"{UNIT_DIR}/{resolver.unit_name(rank)}"


def _batches(ranks: Sequence[Rank], size: int) -> list[list[Rank]]:
    return [list(ranks[i : i + size]) for i in range(0, len(ranks), size)]


@operation()
def service_user(user: str, exists: bool) -> Any:
    """
    A system user and group for the servers: no login, no root, a home for caches.

    + user: the name
    + exists: whether it exists now (from the ServingState fact)
    """
    if exists:
        host.noop(f"user {user} exists")
        return
    yield StringCommand(
        "useradd",
        "--system",
        "--user-group",
        "--create-home",
        "--home-dir",
        QuoteString(f"/var/lib/{user}"),
        "--shell",
        "/usr/sbin/nologin",
        QuoteString(user),
    )


class ServeStep:
    """Which ranks this run starts, restarts (and in what batches) and removes: the plan's
    'what changes' part, and the operations that do it."""

    def __init__(
        self, report: HostReport, serving: Serving, upstream: Sequence[OperationMeta]
    ) -> None:
        s = report.settings
        self.report = report
        self.serving = serving
        self.upstream = [meta for meta in upstream if meta is not None]
        want = {r.rank: r for r in report.plan.ranks}
        secret = secrets_text(s)
        secret_changed = (secret is not None) and serving.files.get(SECRETS_FILE) != sha256(secret)
        self.secret = secret
        self.remove = sorted(set(serving.ranks) - set(want))
        self.start: list[Rank] = []
        self.restart: list[Rank] = []
        self.maybe_restart: list[Rank] = []
        for rank in report.plan.ranks:
            now = serving.ranks.get(rank.rank)
            if now is None or now.active not in ("active", "activating", "reloading"):
                self.start.append(rank)
            elif now.unit_sha256 != sha256(rank.unit) or serving.stale(rank.rank) or secret_changed:
                self.restart.append(rank)
            elif any(meta.will_change for meta in self.upstream):
                self.maybe_restart.append(rank)

    def summary(self) -> str:
        """What this run does to the ranks, for the plan printed before any change."""
        size = self.report.settings.restart_batch_size

        def names(ranks: Sequence[Rank]) -> str:
            return ", ".join(str(r.rank) for r in ranks)

        parts = []
        if self.start:
            parts.append(f"start rank(s) {names(self.start)} together")
        if self.restart:
            batches = " then ".join(f"[{names(b)}]" for b in _batches(self.restart, size))
            parts.append(f"restart (changed) in batches {batches}")
        if self.maybe_restart:
            batches = " then ".join(f"[{names(b)}]" for b in _batches(self.maybe_restart, size))
            parts.append(f"restart if the engine or model changes, in batches {batches}")
        if self.remove:
            parts.append(f"stop and remove rank(s) {', '.join(map(str, self.remove))}")
        return "; ".join(parts) or "every rank runs what the plan says: nothing to restart"

    def upstream_changed(self) -> bool:
        return any(meta.did_change() for meta in self.upstream)

    def run(self) -> None:
        s = self.report.settings
        service_user(
            name=f"Serve: service user {s.service_user}",
            user=s.service_user,
            exists=self.serving.user_exists,
        )
        managed_file(
            name="Serve: health-wait script",
            dest=WAIT_SCRIPT,
            content=_WAIT_SOURCE.read_text(),
            present_sha256=self.serving.files.get(WAIT_SCRIPT),
            mode="755",
        )
        if self.secret is not None:
            # The one secret writer: mode 640 before the first byte, /etc/sglang 750 every run.
            put_secret(
                name="Serve: API key file (root and the service user only)",
                src=self.secret,
                dest=SECRETS_FILE,
                mode="640",
                group=s.service_user,
                dir_mode="750",
                dir_group=s.service_user,
            )
        elif SECRETS_FILE in self.serving.files:
            server.shell(name="Serve: remove the API key file", commands=[f"rm -f {SECRETS_FILE}"])
        target = managed_file(
            name="Serve: sglang.target",
            dest=f"{UNIT_DIR}/{TARGET}",
            content=TARGET_TEXT,
            present_sha256=self.serving.files.get(f"{UNIT_DIR}/{TARGET}"),
        )
        if self.remove:
            self._remove()
        if self.start:
            self._start(target)
        elif target.will_change:
            systemd.daemon_reload(name="Serve: reload systemd")
        if target.will_change:
            systemd.service(name="Serve: enable sglang.target", service=TARGET, enabled=True)
        for number, batch in enumerate(_batches(self.restart, s.restart_batch_size), 1):
            self._roll(batch, f"restart batch {number}", gate=None)
        for number, batch in enumerate(_batches(self.maybe_restart, s.restart_batch_size), 1):
            self._roll(batch, f"restart batch {number} (new engine or model)", gate=self)

    def _remove(self) -> None:
        units = [resolver.unit_name(r) for r in self.remove]
        paths = " ".join(_unit_path(r) for r in self.remove)
        server.shell(
            name=f"Serve: stop, disable and remove {', '.join(units)} (dp_size shrank)",
            commands=[
                f"systemctl disable --now {' '.join(units)}",
                f"rm -f {paths}",
                "systemctl daemon-reload",
                f"systemctl reset-failed {' '.join(units)} || true",
            ],
        )

    def _write_units(self, ranks: Sequence[Rank], why: str) -> None:
        for rank in ranks:
            managed_file(
                name=f"Serve: {rank.unit_name} ({why})",
                dest=_unit_path(rank.rank),
                content=rank.unit,
                present_sha256=self._unit_sha256(rank.rank),
            )

    def _unit_sha256(self, rank: int) -> str | None:
        now = self.serving.ranks.get(rank)
        return now.unit_sha256 if now is not None else None

    def _start(self, target: OperationMeta) -> None:
        s = self.report.settings
        self._write_units(self.start, "start")
        systemd.daemon_reload(name="Serve: reload systemd")
        units = [r.unit_name for r in self.start]
        server.shell(
            name=f"Serve: enable and start {', '.join(units)}",
            commands=[
                f"systemctl enable {' '.join(units)}",
                f"systemctl restart {' '.join(units)}",
            ],
        )
        wait_healthy(
            name=f"Serve: wait for /health of {', '.join(units)}",
            checks=[(r.unit_name, _health_url(s, r.port)) for r in self.start],
            timeout_s=s.health_timeout_s,
            hint=(
                "The ranks that were serving before this run were not touched: the deploy stops "
                "here, before any restart."
            ),
        )

    def _roll(self, batch: list[Rank], what: str, gate: ServeStep | None) -> None:
        s = self.report.settings
        units = [r.unit_name for r in batch]
        hint = (
            f"The roll stopped at {', '.join(units)}; ranks not yet restarted still serve the "
            "previous version. To go back, set the previous settings (pin, flags or model) and "
            "run the deploy again: the previous engine environment is kept and switches back "
            "without a download."
        )
        extra: dict[str, Any] = {"_if": gate.upstream_changed} if gate is not None else {}
        self._write_units(batch, what)
        systemd.daemon_reload(name=f"Serve: reload systemd ({what})", **extra)
        server.shell(
            name=f"Serve: {what}: restart {', '.join(units)}",
            commands=[f"systemctl restart {' '.join(units)}"],
            **extra,
        )
        wait_healthy(
            name=f"Serve: {what}: wait for /health of {', '.join(units)}",
            checks=[(r.unit_name, _health_url(s, r.port)) for r in batch],
            timeout_s=s.health_timeout_s,
            hint=hint,
            **extra,
        )


ROUTER_MARKER = ".sglang-deploy-complete"


def managed_paths(settings: Settings) -> list[str]:
    paths = [WAIT_SCRIPT, SECRETS_FILE, f"{UNIT_DIR}/{TARGET}", f"{UNIT_DIR}/{ROUTER_UNIT}"]
    if settings.router is not None:
        paths.append(f"{resolver.router_env_dir(settings)}/{ROUTER_MARKER}")
    return paths


def serving_state(settings: Settings) -> Serving:
    fact: Serving = host.get_fact(
        ServingState,
        engine_root=settings.engine_root,
        model_path=resolver.staged_model_path(settings),
        paths=managed_paths(settings),
        user=settings.service_user,
    )
    return fact


@deploy("Serve: SGLang ranks as systemd units")
def _serve(report: HostReport, upstream: Sequence[OperationMeta | None] = ()) -> ServeStep:
    serving = serving_state(report.settings)
    step = ServeStep(report, serving, [m for m in upstream if m])
    host.log(f"ranks: {step.summary()}", logger.info)
    step.run()
    if report.router is not None:
        _route(report, serving, report.router)
    return step


# @deploy types every call as returning OperationMeta; this step returns its ServeStep.
serve = cast(Callable[..., ServeStep], _serve)


@operation()
def router_env(engine_root: str, env_dir: str, version: str, installed: bool) -> Any:
    """
    sglang-router in its own environment, with the engine's uv and package sources.

    + engine_root: ENGINE_ROOT (uv and its config live there)
    + env_dir: the router's environment
    + version: the sglang-router release
    + installed: whether env_dir holds a checked install (from the ServingState fact)
    """
    if installed:
        host.noop(f"sglang-router {version} is installed")
        return
    uv = QuoteString(f"{engine_root}/tools/bin/uv")
    common = [
        "--config-file",
        QuoteString(f"{engine_root}/uv.toml"),
        "--cache-dir",
        QuoteString(f"{engine_root}/cache"),
        "--no-progress",
    ]
    env = QuoteString(env_dir)
    python = QuoteString(f"{env_dir}/bin/python")
    yield StringCommand("rm", "-rf", env)
    yield StringCommand(
        uv,
        "venv",
        *common,
        "--no-python-downloads",
        "--python-preference",
        "system",
        "--python",
        "python3",
        env,
    )
    yield StringCommand(
        uv, "pip", "install", *common, "--python", python, QuoteString(f"sglang-router=={version}")
    )
    yield StringCommand(
        python,
        "-c",
        QuoteString("import sglang_router.launch_router"),
        "&&",
        "touch",
        QuoteString(f"{env_dir}/{ROUTER_MARKER}"),
    )


def _route(report: HostReport, serving: Serving, plan: RouterPlan) -> None:
    s = report.settings
    env = router_env(
        name=f"Router: sglang-router {plan.version}",
        engine_root=s.engine_root,
        env_dir=plan.env_dir,
        version=plan.version,
        installed=f"{plan.env_dir}/{ROUTER_MARKER}" in serving.files,
    )
    unit = managed_file(
        name=f"Router: {ROUTER_UNIT}",
        dest=f"{UNIT_DIR}/{ROUTER_UNIT}",
        content=plan.unit,
        present_sha256=serving.files.get(f"{UNIT_DIR}/{ROUTER_UNIT}"),
    )
    if env.will_change or unit.will_change or serving.router_active != "active":
        systemd.daemon_reload(name="Router: reload systemd")
        server.shell(
            name=f"Router: (re)start {ROUTER_UNIT}",
            commands=[f"systemctl enable {ROUTER_UNIT}", f"systemctl restart {ROUTER_UNIT}"],
        )
        wait_healthy(
            name="Router: wait for /health",
            checks=[(ROUTER_UNIT, plan.health_url)],
            timeout_s=s.health_timeout_s,
        )
