"""The router: its command line (every rank of every host as a worker) and unit, for the host
that runs it, checked against the release's own option table (smg's, or sglang-router's up to
0.3.2: the knowledge base's `routers` entry names the package and its launcher module) and the
hosts' rank ports; its control-plane key; its pairing with the SGLang release (tested or
unproven); and the plan's warnings about what it and the ranks leave open.

The control plane (sglang-router 0.3.2, read in its sdist): `POST /workers`, `GET /workers`
and `DELETE /workers/{id}` are one route group (src/server.rs:634-639) behind
`control_plane_auth_middleware` when `--control-plane-api-keys` (or JWT) is configured, else
behind the plain `--api-key` check, which lets everything through when no key is set
(src/server.rs:641-656; src/middleware.rs:114-148). The control-plane check wants
`Authorization: Bearer KEY` and answers 401 without it or for a wrong key, 403 for a key of
role `user` (src/auth/middleware.rs:214-361; keys kept as SHA-256, compared in constant time,
src/auth/config.rs:123-237). A worker added through `POST /workers` is then sent client
requests with the client's own `Authorization` header (src/routers/header_utils.rs:207-219,
src/routers/http/router.rs:544-557): an open control plane hands a stranger every client's
bearer key. So the router always starts with one admin key (programs/router_launch.py reads it
from a systemd credential), and every drain call sends it (programs/router_workers.py). smg
1.13.0 keeps the same key format and the 401 (the knowledge base's `control_plane`, with a
capture of the real binary); its Python launcher reads the key only from its parser, so it goes
in-process the same way.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from operations import kb as kbmod
from operations import layout
from operations.kb.argv import cli_problems
from operations.plan.vocabulary import Decision
from operations.render import units
from operations.settings import Settings


@dataclass(frozen=True)
class RouterPlan:
    argv: list[str]
    unit: str
    workers: list[str]
    health_url: str
    env_dir: str
    version: str
    package: str = "smg"
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The router's release and its pairing with the SGLang release (plan --why).
    decisions: list[Decision] = field(default_factory=list)


def worker_urls(all_settings: list[tuple[str, Settings]]) -> list[str]:
    """Every rank of every host, as the router reaches it."""
    return [
        layout.worker_url(s.server_host, s.base_port + rank)
        for _, s in all_settings
        for rank in range(s.dp_size)
    ]


# What the launcher adds to the options in its own process (programs/router_launch.py): checked
# against the release's option table like the rest of the command line.
CONTROL_PLANE_OPTION = "--control-plane-api-keys"


def pairing(release: kbmod.RouterRelease, sglang: str) -> tuple[Decision, str | None]:
    """The router release with the SGLang release behind it, as the plan shows it (--why), and
    a warning when nothing shows that they work together over HTTP (`releases` lists it as
    unproven)."""
    name = f"{release.package} {release.version}"
    engines = release.engines
    if engines is None:
        why = f"{name}'s worker API and launcher: {release.why}"
        return Decision("router", name, why), None
    sources = ", ".join(s.url for s in engines.source)
    tested = ", ".join(engines.tested)
    if sglang in engines.tested:
        value = f"{name}, known to work with sglang {sglang}"
        return Decision("router", value, f"tested: {tested} ({sources})"), None
    unproven = (
        f"router {name} with sglang {sglang} is unproven: no run of them together over HTTP is "
        f"known (tested: {tested}; unproven: {engines.unproven}); {engines.why} ({sources})"
    )
    value = f"{name}, unproven with sglang {sglang}"
    return Decision("router", value, unproven), unproven


def control_key_text(settings: Settings) -> str | None:
    """The control-plane key file's text, as the settings loader read it on the controller
    (Settings.control_plane_key_file: router.control_plane_key_file, or the one made beside the
    engine locks; checked by settings.controller_problems); None: no router, or it could not
    be read."""
    read = settings.controller_files.control_plane_key
    if settings.router is None or read is None or not read.key:
        return None
    return read.key + "\n"


def key_changes(settings: Settings, files: Mapping[str, str]) -> bool:
    """Whether this run writes the control-plane key on this host: the controller's key is not
    the one there. `files`: the ServingState fact's sha256s. A key the loader could not read is
    not written (the settings refuse it)."""
    text = control_key_text(settings)
    if text is None:
        return False
    return files.get(layout.CONTROL_PLANE_KEY_FILE) != hashlib.sha256(text.encode()).hexdigest()


def _loopback(address: str) -> bool:
    if address in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def open_binds(settings: Settings, host_name: str) -> list[str]:
    """Warnings: what this host serves to anyone who reaches it (no api_key_file)."""
    if settings.api_key_file:
        return []
    found = []
    if not _loopback(settings.server_host):
        last = settings.base_port + settings.dp_size - 1
        found.append(
            f"{host_name}: server_host {settings.server_host} (set in "
            f"{settings.origin('server_host')}) with no api_key_file: ranks on ports "
            f"{settings.base_port}-{last} answer anyone who reaches that address; set "
            "api_key_file (docs/how-it-works/security.md)"
        )
    router = settings.router
    if router is not None and router.host == host_name and not _loopback(router.bind):
        found.append(
            f"{host_name}: router bind {router.bind}:{router.port} (set in "
            f"{settings.origin('router')}) with no api_key_file: anyone who reaches it is "
            "served, and the router forwards each client's bearer key to the ranks; set "
            "api_key_file (docs/how-it-works/security.md, the router's control plane)"
        )
    return found


def health_options(settings: Settings, release: kbmod.RouterRelease | None) -> list[str]:
    """smg's rules for ranks on the same host, where the release has them (its `health` entry):
    a rank whose /health fails is taken out and comes back when it answers again, never dropped
    for good (`--no-remove-unhealthy-workers`: every rank is a static --worker-urls worker);
    a rank that stops producing tokens while its queue grows, or stops answering, gets no new
    requests (`--worker-wedge-secs`, `--worker-stall-secs`, from the settings)."""
    router = settings.router
    health = release.health if release is not None else None
    if router is None or health is None:
        return []
    return [
        "--no-remove-unhealthy-workers",
        "--worker-stall-secs",
        str(router.worker_stall_s),
        "--worker-wedge-secs",
        str(router.worker_wedge_s),
    ]


def _port_problems(
    settings: Settings, host_name: str, all_settings: list[tuple[str, Settings]]
) -> tuple[list[str], list[str]]:
    """The router's ports against its own and every host's rank ports; loopback rank addresses
    it cannot reach from another host."""
    router = settings.router
    assert router is not None
    errors: list[str] = []
    warnings: list[str] = []
    if router.metrics_port == router.port:
        errors.append(
            f"router metrics_port {router.metrics_port} (set in {settings.origin('router')}) is "
            "the router's own port; choose another"
        )
    for name, s in all_settings:
        ports = range(s.base_port, s.base_port + s.dp_size)
        for what, port in (
            ("router port", router.port),
            ("router metrics_port", router.metrics_port),
        ):
            if name == host_name and port in ports:
                errors.append(
                    f"{what} {port} (set in {settings.origin('router')}) collides with "
                    f"rank {port - s.base_port} of {name} (ports {ports.start}-{ports.stop - 1})"
                    "; choose a router port outside every host's rank ports"
                )
        if name != host_name and s.server_host.startswith("127."):
            warnings.append(
                f"router on {host_name} reaches {name}'s ranks at {s.server_host}, a loopback "
                "address: set server_host for that host to an address the router can reach"
            )
    return errors, warnings


def ready_path(package: str) -> str:
    """Where the router says it can route a request. smg's /health answers 200 as soon as its
    process listens (model_gateway/src/server.rs:157, 1214 in the smg 1.13.0 sdist), while its
    workers are still being checked: a chat request then gets 404 model_not_found (seen by the
    e2e smoke through the router). Its /readiness answers 200 once a worker is healthy
    (server.rs:153, 1213; health.rs:159-192, 228-258). sglang-router 0.3.2 has only /health."""
    return "/readiness" if package == "smg" else "/health"


def resolve_router(
    settings: Settings,
    host_name: str,
    all_settings: list[tuple[str, Settings]],
    knowledge: kbmod.Knowledge | None = None,
) -> RouterPlan:
    """The router's command line and unit, for the host that runs it (knowledge: the plan's;
    None: the knowledge base's, loaded)."""
    knowledge = knowledge if knowledge is not None else kbmod.load()
    router = settings.router
    assert router is not None and router.host == host_name
    env_dir = layout.router_env_dir(settings)
    workers = worker_urls(all_settings)
    release = knowledge.routers.get(router.version)
    package = kbmod.router_package(router.version)
    argv = [
        layout.env_python(env_dir),
        # The launcher adds the control-plane key in its own process (router_launch.py).
        layout.ROUTER_LAUNCH_SCRIPT,
        release.launcher if release is not None else f"{package.replace('-', '_')}.launch_router",
        "--worker-urls",
        *workers,
        "--policy",
        router.policy,
        "--host",
        router.bind,
        "--port",
        str(router.port),
        # Reliability (settings.Router says why each differs from the router's own default).
        "--retry-max-retries",
        str(router.retry_max_retries),
        "--retry-initial-backoff-ms",
        str(router.retry_initial_backoff_ms),
        "--health-check-interval-secs",
        str(router.health_check_interval_s),
        "--health-failure-threshold",
        str(router.health_failure_threshold),
        "--health-success-threshold",
        str(router.health_success_threshold),
        "--cb-failure-threshold",
        str(router.cb_failure_threshold),
        "--cb-timeout-duration-secs",
        str(router.cb_timeout_s),
        "--worker-startup-timeout-secs",
        str(router.worker_startup_timeout_s),
        # Its Prometheus metrics, where the targets file says (operations/plan/monitoring.py).
        "--prometheus-host",
        router.bind,
        "--prometheus-port",
        str(router.metrics_port),
    ]
    argv += health_options(settings, release)
    errors: list[str] = []
    warnings: list[str] = []
    decisions: list[Decision] = []
    if release is None:
        known = ", ".join(f"{r.version} ({r.package})" for r in knowledge.routers.values())
        errors.append(
            f"router.version {router.version!r} (set in {settings.origin('router')}): not a "
            f"router release the knowledge base knows; accepted: {known}"
        )
    else:
        decision, unproven = pairing(release, settings.sglang_version)
        decisions.append(decision)
        warnings += [unproven] if unproven is not None else []
    table = kbmod.load_cli_table(package, router.version)
    if table is None:
        errors.append(
            f"router version {router.version!r}: no option table for {package} "
            f"{router.version}; run 'python scripts/gen_cli_table.py {package} "
            f"{router.version}' (see operations/kb/knowledge/cli/README.md)"
        )
    else:
        launched = [*argv[3:], CONTROL_PLANE_OPTION, "sglang-deploy:sglang-deploy:admin:KEY"]
        found, warned = cli_problems(launched, table, "router command line")
        errors += found
        warnings += warned
        if CONTROL_PLANE_OPTION not in table.options:
            errors.append(
                f"router version {router.version!r}: {package} {router.version} has no "
                f"{CONTROL_PLANE_OPTION}, so its worker API (add, remove) would be open to "
                "anyone who reaches its port; pin a release that has it (smg 1.13.0)"
            )
    for name, s in all_settings:
        if s.dp_size > 0 and s.control_plane_key_file != settings.control_plane_key_file:
            errors.append(
                f"the router's control-plane key: {name} reads {s.control_plane_key_file!r} "
                f"({s.control_plane_key_origin()}), the router on {host_name} "
                f"{settings.control_plane_key_file!r} ({settings.control_plane_key_origin()}); "
                "every host behind the router sends its one key: set the same "
                "router.control_plane_key_file (or engine_lock_dir) for every host"
            )
    port_errors, port_warnings = _port_problems(settings, host_name, all_settings)
    errors += port_errors
    warnings += port_warnings
    unit = units.router_unit(settings, argv, len(workers), package)
    return RouterPlan(
        argv=argv,
        unit=unit,
        workers=workers,
        health_url=layout.health_url(router.bind, router.port, ready_path(package)),
        env_dir=env_dir,
        version=router.version,
        package=package,
        errors=errors,
        warnings=warnings,
        decisions=decisions,
    )
