"""The roll's drain, decided in the plan (operations/plan/drain.py), and what carries it out: the
router's reliability flags on its real command line, rank units that stop after the drain, the
drain script's reading of a rank's request gauges (the server double's real /metrics text)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from operations import kb
from operations.facts.serve import parse_serving
from operations.plan import drain, resolver
from operations.render import host_scripts
from operations.settings import Settings
from tests.unit.builders import facts, make_settings
from tests.unit.router_double import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
ROUTER = {"host": "ct200", "port": 8000, "bind": "0.0.0.0"}


def with_router(**router: object) -> Settings:
    return make_settings(router={**ROUTER, **router})


def test_without_a_router_the_plan_says_rolls_are_not_drain_protected() -> None:
    s = make_settings()
    plan, decision, warnings = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is None and warnings == []
    assert decision.value == "none: rolls are not drain-protected"
    assert "no router" in decision.why


def test_behind_the_router_each_rank_is_named_as_the_router_names_it() -> None:
    a = with_router()
    b = dataclasses.replace(with_router(), server_host="10.0.0.2", base_port=31000)
    everyone = [("ct200", a), ("ct201", b)]
    router = resolver.resolve_router(a, "ct200", everyone)
    for name, s in everyone:
        plan, decision, _ = drain.decide(name, s, everyone, kb.load())
        assert plan is not None
        # The worker URLs the drain removes and re-adds are the router's own --worker-urls.
        assert all(plan.worker(r) in router.workers for r in range(s.dp_size))
        assert plan.timeout_s == s.drain_timeout_s == 120
        assert "DELETE /workers/{id}" in decision.why and "POST /workers" in decision.why
        assert "pypi.org/project/smg/1.13.0" in decision.why
    # On its own host the router is reached on loopback; from another, at its host's address.
    own, _, _ = drain.decide("ct200", a, everyone, kb.load())
    assert own is not None and own.router_url == "http://127.0.0.1:8000"
    other = dataclasses.replace(a, server_host="10.0.0.1")
    everyone = [("ct200", other), ("ct201", b)]
    plan, _, _ = drain.decide("ct201", b, everyone, kb.load())
    assert plan is not None and plan.router_url == "http://10.0.0.1:8000"


def test_a_router_release_without_a_known_worker_api_is_a_warning_not_a_drain() -> None:
    s = with_router()
    knowledge = dataclasses.replace(kb.load(), routers={})
    plan, decision, warnings = drain.decide("ct200", s, [("ct200", s)], knowledge)
    assert plan is None and "not drain-protected" in decision.value
    assert warnings and "1.13.0" in warnings[0]


def test_the_router_command_line_carries_its_reliability_settings() -> None:
    s = with_router(retry_max_retries=7, cb_timeout_s=12)
    router = resolver.resolve_router(s, "ct200", [("ct200", s)])
    assert router.errors == []  # checked against sglang-router 0.3.2's real option table
    line = " ".join(router.argv)
    for flag in (
        "--retry-max-retries 7",
        "--retry-initial-backoff-ms 100",
        "--health-check-interval-secs 5",
        "--health-failure-threshold 2",
        "--health-success-threshold 2",
        "--cb-failure-threshold 5",
        "--cb-timeout-duration-secs 12",
        "--worker-startup-timeout-secs 1800",
    ):
        assert flag in line, flag


def test_rank_units_stop_after_the_drain() -> None:
    for seconds in (120, 600):
        s = make_settings(drain_timeout_s=seconds)
        plan = resolver.resolve(s, dataclasses.replace(facts(), model_key="0123abcd"))
        for rank in plan.ranks:
            stop = re.search(r"^TimeoutStopSec=(\d+)$", rank.unit, re.M)
            assert stop is not None and int(stop.group(1)) > seconds


@pytest.mark.integration
def test_the_drain_script_reads_running_and_queued_requests_from_the_double(
    tmp_path: Path,
) -> None:
    script = host_scripts.load("router_workers.py")  # the text the host runs
    # The double's /metrics, written by its own code (tests/doubles/packages/sglang).
    code = (
        "import sys, types; sys.modules['sglang._double_build'] = types.SimpleNamespace("
        "VERSION='0.5.11'); sys.path.insert(0, 'tests/doubles/packages');"
        "import argparse; from sglang._server_double import _State, metrics_text;"
        "s = _State(argparse.Namespace(served_model_name='m', model_path='/m'));"
        "s.running = 3; print(metrics_text(s))"
    )
    text = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    served = tmp_path / "metrics"
    served.write_text(text)
    assert script.in_flight(served.as_uri()) == 3
    served.write_text("# no gauges\n")
    assert script.in_flight(served.as_uri()) is None


# -- the router's control plane (docs/how-it-works/security-gateway-and-concurrency.md "The
# router's control plane") --------------

KEY = "k3y-0f-the-c0ntrol-plane-9a8b7c6d"


def run_drain(
    tmp_path: Path, plane: ControlPlane, key_file: Path, *args: str, draining: str = ""
) -> tuple[int, str]:
    script = tmp_path / "router_workers.py"
    script.write_text(host_scripts.script_text("router_workers.py"))  # what the host runs
    api = ["--list", "GET /workers", "--remove", "DELETE /workers/{id}", "--add", "POST /workers"]
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--router",
            plane.url,
            *api,
            "--key-file",
            str(key_file),
            "--timeout",
            "5",
            *(["--draining", draining] if draining else []),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.integration
def test_every_drain_call_sends_the_control_plane_key(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    plane = ControlPlane(KEY)
    try:
        rank = "http://127.0.0.1:9"
        rc, out = run_drain(tmp_path, plane, key_file, "in", f"sglang@0.service={rank}")
        assert rc == 0 and "readmitted sglang@0.service" in out, out
        assert [w["url"] for w in plane.workers.values()] == [rank]
        rc, out = run_drain(tmp_path, plane, key_file, "out", f"sglang@0.service={rank}=")
        assert rc == 0 and plane.workers == {}, out
        assert {c[0] for c in plane.calls} == {"GET", "POST", "DELETE"}
        assert {c[2] for c in plane.calls} == {f"Bearer {KEY}"}
    finally:
        plane.stop()


@pytest.mark.integration
def test_behind_smg_a_draining_rank_is_out_and_its_re_add_waits_until_smg_lets_it_go(
    tmp_path: Path,
) -> None:
    """smg's drain is a timer (the double's settle, as the real one's 5 s): `out` is done once
    the rank is listed draining, without waiting for the removal; `in` right after sees it
    still listed, waits until it has gone (a POST would be 409), adds it, and waits for ready."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    plane = ControlPlane(KEY, settle_s=1.0)
    rank = "http://127.0.0.1:9"
    try:
        plane.workers["id-0"] = {"url": rank, "is_healthy": True, "status": "ready"}
        rc, out = run_drain(tmp_path, plane, key_file, "out", f"u={rank}=", draining="draining")
        assert rc == 0, out
        assert plane.workers["id-0"]["status"] == "draining"  # out, before smg removed it
        rc, out = run_drain(tmp_path, plane, key_file, "in", f"u={rank}", draining="draining")
        assert rc == 0 and "readmitted u" in out, out
        assert [(w["url"], w["status"]) for w in plane.workers.values()] == [(rank, "ready")]
        # Never a POST while smg still listed it: no 409 was asked for.
        posts = [c for c in plane.calls if c[0] == "POST"]
        assert len(posts) == 1, plane.calls
    finally:
        plane.stop()


SETTLE = ["--settle", "1", "--update", "PATCH /workers/{id}", "--applied", "GET /workers/{id}"]


def test_behind_smg_the_plan_sets_a_short_settle_for_the_drained_rank_with_its_source() -> None:
    s = with_router()
    plan, decision, _ = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is not None and plan.settle_s == drain.ROLL_SETTLE_S == 1
    assert "router settle 1s" in decision.value
    for said in ("PATCH /workers/{id}", "not its default 5s", "smg-1.13.0-capture"):
        assert said in decision.why, said
    # The step hands it to the drain script, with the release's calls.
    from operations.steps.serve import host_argv, router_workers

    argv = host_argv(
        router_workers,
        action="out",
        router=plan.router_url,
        api=("GET /workers", "DELETE /workers/{id}", "POST /workers"),
        timeout_s=5,
        targets=["u=http://127.0.0.1:9="],
        settle=(1, "PATCH /workers/{id}", "GET /workers/{id}"),
    )
    assert " ".join(SETTLE) in " ".join(argv)
    # sglang-router 0.3.2 removes at once: no settle to set.
    old = with_router(version="0.3.2")
    plan, decision, _ = drain.decide("ct200", old, [("ct200", old)], kb.load())
    assert plan is not None and plan.settle_s is None and "settle" not in decision.value


def test_behind_smg_each_re_add_carries_the_ranks_api_key_by_its_files_path() -> None:
    """smg calls a worker POSTed without `api_key` unauthenticated (the knowledge base's
    routers."1.13.0".worker_api_key): with an API key, the plan hands the drain script the key
    file's path and the field, for the re-add only; never the key."""
    from operations.steps.serve import host_argv, router_workers

    s = dataclasses.replace(with_router(), api_key_file="/etc/keys/api-key")
    plan, decision, _ = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is not None and plan.worker_key == ("/etc/sglang/secrets.yaml", "api_key")
    assert "each re-add carries the ranks' API key (api_key" in decision.why
    assert "worker_api_key: smg-1.13.0" in decision.why
    common = {
        "router": plan.router_url,
        "api": ("GET /workers", "DELETE /workers/{id}", "POST /workers"),
        "timeout_s": 5,
        "worker_key": plan.worker_key,
    }
    back = host_argv(router_workers, action="in", targets=["u=http://127.0.0.1:9"], **common)
    out = host_argv(router_workers, action="out", targets=["u=http://127.0.0.1:9="], **common)
    keyed = ["--worker-key-file", "/etc/sglang/secrets.yaml", "--worker-key-field", "api_key"]
    assert " ".join(keyed) in " ".join(back)
    assert "--worker-key-file" not in out
    # No key configured, or sglang-router 0.3.2 (its worker API is not known to take one).
    old = dataclasses.replace(with_router(version="0.3.2"), api_key_file="/etc/k")
    for settings in (with_router(), old):
        plan, decision, _ = drain.decide("ct200", settings, [("ct200", settings)], kb.load())
        assert plan is not None and plan.worker_key is None
        assert "API key" not in decision.why


@pytest.mark.integration
def test_a_re_add_sends_the_ranks_api_key_read_on_the_host(tmp_path: Path) -> None:
    """The drain script reads the key from SGLang's --config file and puts it in the POST's
    body (what smg then sends the rank); it never prints it; an unreadable file fails the step
    naming the file."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    secrets = tmp_path / "secrets.yaml"
    api_key = 'sk-rank-"key"-0123456789'
    secrets.write_text(f"api-key: {json.dumps(api_key)}\n")  # as serve_plan.secrets_text
    plane = ControlPlane(KEY)
    rank = "http://127.0.0.1:9"
    keyed = ("--worker-key-file", str(secrets), "--worker-key-field", "api_key")
    try:
        rc, out = run_drain(tmp_path, plane, key_file, *keyed, "in", f"u={rank}")
        assert rc == 0 and "readmitted u" in out, out
        assert [b for m, _, b in plane.bodies if m == "POST"] == [{"url": rank, "api_key": api_key}]
        assert api_key not in out
        secrets.chmod(0o000)
        plane.workers.clear()
        rc, out = run_drain(tmp_path, plane, key_file, *keyed, "in", f"u={rank}")
        if os.geteuid() != 0:  # root reads it anyway
            assert rc == 1 and f"the ranks' API key file {secrets}" in out, out
    finally:
        plane.stop()


@pytest.mark.integration
def test_behind_smg_the_drained_worker_settles_in_1s_set_before_its_removal(
    tmp_path: Path,
) -> None:
    """The double keeps smg's default settle (5 s): `out` PATCHes the worker's settle to 1,
    removes it only once GET /workers/{id} shows that job done (before, the double's replace
    would list it ready again, as smg's would), so `in` right after waits about 1 s, not 5;
    the re-add's POST carries the settle, and the next drain needs no PATCH."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    plane = ControlPlane(KEY, settle_s=5.0)
    rank = "http://127.0.0.1:9"
    try:
        plane.workers["id-0"] = {"url": rank, "is_healthy": True, "status": "ready"}
        smg = ("--draining", "draining", *SETTLE)
        rc, out = run_drain(tmp_path, plane, key_file, *smg, "out", f"u={rank}=")
        assert rc == 0, out
        called = [(m, p) for m, p, _ in plane.calls]
        patched, deleted = (
            called.index(("PATCH", "/workers/id-0")),
            called.index(("DELETE", "/workers/id-0")),
        )
        assert patched < called.index(("GET", "/workers/id-0")) < deleted, called
        assert plane.bodies[patched][2] == {"health": {"drain_settle_secs": 1}}
        assert plane.workers["id-0"]["status"] == "draining"  # the update did not undo it
        rc, out = run_drain(tmp_path, plane, key_file, *smg, "in", f"u={rank}")
        readmitted = re.search(r"readmitted u in ([0-9.]+) s", out)
        assert rc == 0 and readmitted is not None, out
        assert float(readmitted.group(1)) < 3.0, out  # 1 s settle, not the default 5 s
        posted = [b for m, _, b in plane.bodies if m == "POST"]
        assert posted == [{"url": rank, "health": {"drain_settle_secs": 1}}]
        # Its POST carried the settle (listed as its health): the next drain PATCHes nothing.
        before = len(plane.calls)
        rc, out = run_drain(tmp_path, plane, key_file, *smg, "out", f"u={rank}=")
        assert rc == 0 and "PATCH" not in {c[0] for c in plane.calls[before:]}, out
    finally:
        plane.stop()


@pytest.mark.integration
def test_a_refused_key_fails_the_drain_naming_the_file_not_the_key(tmp_path: Path) -> None:
    """Refused is not "the router does not answer" (which lets a roll go on undrained): the step
    fails, names the key file and the setting, and never prints the key."""
    wrong = tmp_path / "key"
    wrong.write_text("n0t-the-r1ght-key-at-all-123456\n")
    plane = ControlPlane(KEY)
    try:
        plane.workers["id-0"] = {"url": "http://127.0.0.1:9", "is_healthy": True}
        for args in (
            ("out", "sglang@0.service=http://127.0.0.1:9="),
            ("in", "sglang@0.service=http://127.0.0.1:9"),
        ):
            rc, out = run_drain(tmp_path, plane, wrong, *args)
            assert rc == 1, out
            assert "401" in out and "router.control_plane_key_file" in out, out
            assert "n0t-the-r1ght" not in out and KEY not in out
            assert "does not answer" not in out
        assert list(plane.workers) == ["id-0"]  # nothing changed
        # No key file (a router from before the key): nothing sent, refused just the same.
        rc, out = run_drain(tmp_path, plane, tmp_path / "absent", "out", "u=http://127.0.0.1:9=")
        assert rc == 1 and "no key (--key-file absent)" in out, out
        assert all(c[2] is None for c in plane.calls[-1:])
    finally:
        plane.stop()


@pytest.mark.integration
def test_the_router_before_the_key_took_anyones_workers(tmp_path: Path) -> None:
    """The failure this guards against, on the double of the router as it was started: with no
    control-plane key, a call without any key adds a stranger's server and removes a worker."""
    plane = ControlPlane(None)
    try:
        plane.workers["id-0"] = {"url": "http://127.0.0.1:9", "is_healthy": True}
        rc, out = run_drain(
            tmp_path, plane, tmp_path / "absent", "in", "stranger=http://127.0.0.1:7"
        )
        assert rc == 0, out
        assert "http://127.0.0.1:7" in [w["url"] for w in plane.workers.values()]
        assert all(c[2] is None for c in plane.calls)
    finally:
        plane.stop()


FAKE_ROUTER = """
import json, os, sys
def parse_router_args(args):
    return list(args)
def launch_router(args):
    cmdline = open("/proc/self/cmdline", "rb").read().decode()
    print(json.dumps({"args": args, "cmdline": cmdline}))
"""


def run_launcher(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """programs/router_launch.py as the router unit runs it, with a stand-in for sglang_router's
    parse_router_args/launch_router (launch_router.py:63-105 in the 0.3.2 sdist) that records
    the list it is given and the process's own command line."""
    package = tmp_path / "site" / "sglang_router"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "launch_router.py").write_text(FAKE_ROUTER)
    script = tmp_path / "router_launch.py"
    script.write_text(host_scripts.script_text("router_launch.py"))
    return subprocess.run(
        [sys.executable, str(script), "sglang_router.launch_router", "--port", "8000"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
def test_the_launcher_hands_the_key_to_the_parser_never_to_a_command_line(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "control-plane-key").write_text(KEY + "\n")
    proc = run_launcher(tmp_path, {"CREDENTIALS_DIRECTORY": str(credentials)})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    # sglang-router's own format, id:name:role:key (router_args.py:1028-1049), role admin.
    assert seen["args"] == [
        "--port",
        "8000",
        "--control-plane-api-keys",
        f"sglang-deploy:sglang-deploy drain:admin:{KEY}",
    ]
    assert KEY not in seen["cmdline"]
    # No credential: one line, exit 2, and the router is not started (open).
    for env in ({}, {"CREDENTIALS_DIRECTORY": str(tmp_path / "none")}):
        proc = run_launcher(tmp_path, env)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.integration
def test_the_launcher_gives_smg_the_ranks_api_key_in_process(tmp_path: Path) -> None:
    """Ranks that want an API key answer smg's probes 401 without it (seen: "HTTP backend
    detection failed ... /v1/models returned status 401"): the unit loads the ranks' key file as
    a second credential and the launcher hands it to the parser as --api-key, never to argv."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "control-plane-key").write_text(KEY + "\n")
    (credentials / "api-key").write_text('api-key: "ranks-key-9f8e"\n')
    proc = run_launcher(tmp_path, {"CREDENTIALS_DIRECTORY": str(credentials)})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["args"][-2:] == ["--api-key", "ranks-key-9f8e"]
    assert "ranks-key-9f8e" not in seen["cmdline"]


@pytest.mark.parametrize(
    ("version", "module", "env"),
    [
        ("1.13.0", "smg.launch_router", "/opt/sglang/router/smg-1.13.0/bin/python"),
        (
            "0.3.2",
            "sglang_router.launch_router",
            "/opt/sglang/router/sglang-router-0.3.2/bin/python",
        ),
    ],
)
def test_the_router_unit_loads_the_key_as_a_credential_and_no_key_is_in_it(
    version: str, module: str, env: str
) -> None:
    s = with_router(version=version)
    router = resolver.resolve_router(s, "ct200", [("ct200", s)])
    assert router.errors == []
    assert "LoadCredential=control-plane-key:/etc/sglang/router-control-plane.key" in router.unit
    # Each release from its own environment (both install an `smg` command), its own launcher.
    assert router.argv[:3] == [env, "/usr/local/lib/sglang-deploy/router_launch.py", module]
    assert "--control-plane-api-keys" not in router.argv  # the launcher adds it, in-process


def test_smg_loads_the_ranks_api_key_as_a_credential_where_the_ranks_want_one() -> None:
    """smg only (sglang-router 0.3.2 never probed the ranks), and only with an api_key_file."""
    credential = "LoadCredential=api-key:/etc/sglang/secrets.yaml"
    for version, api_key_file, loaded in [
        ("1.13.0", "/etc/keys/api", True),
        ("1.13.0", None, False),
        ("0.3.2", "/etc/keys/api", False),
    ]:
        s = dataclasses.replace(with_router(version=version), api_key_file=api_key_file)
        router = resolver.resolve_router(s, "ct200", [("ct200", s)])
        assert (credential in router.unit) == loaded, (version, api_key_file)
        assert "--api-key" not in router.argv


def test_a_router_release_without_control_plane_keys_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = kb.load_cli_table("sglang-router", "0.3.2")
    assert table is not None
    options = {k: v for k, v in table.options.items() if k != "--control-plane-api-keys"}
    bare = dataclasses.replace(table, options=options)
    # resolver/router.py asks the kb package for the table (kbmod.load_cli_table).
    monkeypatch.setattr(kb, "load_cli_table", lambda *_: bare)
    s = with_router()
    router = resolver.resolve_router(s, "ct200", [("ct200", s)])
    assert any("has no --control-plane-api-keys" in e for e in router.errors), router.errors


def test_the_key_is_written_when_the_controllers_is_not_the_hosts(tmp_path: Path) -> None:
    from operations.layout import CONTROL_PLANE_KEY_FILE
    from operations.plan.planned_files import sha256
    from operations.plan.resolver.router import key_changes

    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    given = with_router(control_plane_key_file=str(key_file))
    # The controller's key, on every host behind the router (the router's own included).
    assert key_changes(given, {CONTROL_PLANE_KEY_FILE: sha256(KEY + "\n")}) is False
    assert key_changes(given, {CONTROL_PLANE_KEY_FILE: "ab" * 32}) is True
    assert key_changes(given, {}) is True
    assert key_changes(make_settings(), {}) is False  # no router
    key_file.unlink()
    unread = with_router(control_plane_key_file=str(key_file))
    assert key_changes(unread, {}) is False  # not read: the settings refuse it, nothing written


def test_open_binds_are_warned_about() -> None:
    from operations.plan.resolver.router import open_binds

    s = with_router()  # bind 0.0.0.0, server_host 127.0.0.1, no api_key_file
    found = open_binds(s, "ct200")
    assert len(found) == 1 and "router bind 0.0.0.0:8000" in found[0]
    assert "forwards each client's bearer key" in found[0]
    wide = dataclasses.replace(s, server_host="0.0.0.0")
    assert len(open_binds(wide, "ct200")) == 2
    assert "server_host 0.0.0.0" in open_binds(wide, "ct200")[0]
    assert open_binds(with_router(bind="127.0.0.1"), "ct200") == []
    assert open_binds(dataclasses.replace(wide, api_key_file="/k"), "ct200") == []
    assert open_binds(s, "ct201") == []  # the router's bind is its own host's warning


def test_a_bad_control_plane_key_file_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    from operations.settings import controller_problems

    def problems(text: str | None) -> list[str]:
        path = tmp_path / "cp-key"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        return controller_problems("ct200", with_router(control_plane_key_file=str(path)))

    assert problems(KEY + "\n") == []
    for text, why in (
        (None, "no such file on the controller"),
        ("short\n", "shorter than 16 characters"),
        ("two words in one key here\n", "whitespace or control characters"),
    ):
        found = problems(text)
        assert len(found) == 1 and "router.control_plane_key_file, set in" in found[0], found
        assert why in found[0] and "\n" not in found[0]


def read_listing(plane: ControlPlane, key_file: Path) -> list[str]:
    """The ServingState fact's reading of the router's list, run as the fact runs it."""
    text = host_scripts.script_text("router_list.py")
    argv = [sys.executable, "-I", "-c", text, "5", f"{plane.url}/workers", str(key_file)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


@pytest.mark.integration
def test_the_facts_list_reading_sends_the_key_and_says_a_refusal(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    plane = ControlPlane(KEY)
    try:
        plane.workers["id-0"] = {"url": "http://127.0.0.1:9/", "is_healthy": True}
        plane.workers["id-1"] = {"url": "http://127.0.0.1:7", "is_healthy": False}
        assert read_listing(plane, key_file) == [
            "router_workers ok",
            "worker http://127.0.0.1:9 healthy",
            "worker http://127.0.0.1:7 unhealthy",
        ]
        assert plane.calls[-1] == ("GET", "/workers", f"Bearer {KEY}")
        key_file.write_text("n0t-the-r1ght-key-at-all-123456\n")
        refused = read_listing(plane, key_file)
        assert refused == ["router_workers error HTTPError"]
        assert read_listing(plane, tmp_path / "absent") == refused  # no key: none sent
        assert plane.calls[-1][2] is None
    finally:
        plane.stop()


@pytest.mark.integration
def test_the_list_reading_says_smgs_status_and_its_stall_veto(tmp_path: Path) -> None:
    """smg 1.13.0's GET /workers: `status` per worker, and `stalled` (unreachable or wedged)
    only while its liveness veto holds a worker out of routing (crates/protocols/src/worker.rs:
    1015-1019 of the sdist: skip_serializing_if none)."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    plane = ControlPlane(KEY, settle_s=5.0)
    try:
        plane.workers["id-0"] = {"url": "http://127.0.0.1:9", "is_healthy": True, "status": "ready"}
        plane.workers["id-1"] = {
            "url": "http://127.0.0.1:7",
            "is_healthy": True,
            "status": "ready",
            "stalled": "wedged",
        }
        plane.workers["id-2"] = {
            "url": "http://127.0.0.1:5",
            "is_healthy": False,
            "status": "failed",
        }
        lines = read_listing(plane, key_file)
        assert lines == [
            "router_workers ok",
            "worker http://127.0.0.1:9 ready",
            "worker http://127.0.0.1:7 ready",
            "stalled http://127.0.0.1:7 wedged",
            "worker http://127.0.0.1:5 failed",
        ]
        read = parse_serving(lines)
        assert read.router_stalled == {"http://127.0.0.1:7": "wedged"}
        assert read.router_states["http://127.0.0.1:5"] == "failed"
    finally:
        plane.stop()


def test_a_drain_waits_for_another_routable_worker_before_taking_its_own_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a saturating check the router may list the other workers not_ready for a few
    health checks; taking the last routable worker out then turns every client away (seen on
    the two-rank testbed: 503 "All workers are unavailable" while a canary's promotion drained
    the other rank). The drain waits until another worker is ready, and not past PEER_WAIT_S.
    Here no --router-metrics: the guard says it takes `ready` alone."""
    import argparse

    from operations.programs import router_workers as rw

    states = iter(["not_ready", "not_ready", "ready"])
    lists: list[str] = []

    def listed(args: argparse.Namespace) -> dict[str, rw.Worker]:
        state = next(states)
        lists.append(state)
        worker = {"id": "b", "url": "http://b", "is_healthy": state == "ready", "status": state}
        return {"http://b": worker}  # type: ignore[dict-item]

    monkeypatch.setattr(rw, "listed", listed)
    monkeypatch.setattr("operations.programs.router_workers.time.sleep", lambda seconds: None)
    args = argparse.Namespace(router_metrics="", breaker_timeout=None)
    leaving = [("sglang@0.service", "http://a", "")]
    first = {
        "http://a": {"id": "a", "url": "http://a", "is_healthy": True, "status": "ready"},
        "http://b": {"id": "b", "url": "http://b", "is_healthy": False, "status": "not_ready"},
    }
    got = rw.peer_routable(args, leaving, first)  # type: ignore[arg-type]
    assert got["http://b"]["status"] == "ready" and lists == ["not_ready", "not_ready", "ready"]
    assert "circuit breakers are unknown (no --router-metrics" in capsys.readouterr().out
    # No other worker listed: nothing to wait for.
    alone = {"http://a": first["http://a"]}
    assert rw.peer_routable(args, leaving, alone) is alone  # type: ignore[arg-type]
    # Never ready: it drains anyway after PEER_WAIT_S, and says so, and why.
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr("operations.programs.router_workers.time.monotonic", lambda: next(clock))
    monkeypatch.setattr(rw, "listed", lambda args: {"http://b": first["http://b"]})
    rw.peer_routable(args, leaving, first)  # type: ignore[arg-type]
    said = capsys.readouterr().out
    assert "no other worker is routable after 30 s (http://b listed not_ready): " in said
    assert "draining anyway" in said


def _smg_breaker_page(states: dict[str, float]) -> str:
    """smg's /metrics as it writes smg_worker_cb_state (the metrics capture's family and label;
    observability/metrics.rs:2559-2566), beside a gauge of the same label."""
    lines = ["# TYPE smg_worker_cb_state gauge"]
    lines += [f'smg_worker_cb_state{{worker="{url}"}} {value}' for url, value in states.items()]
    lines += [f'smg_worker_health{{worker="{url}"}} 1' for url in states]
    return "\n".join(lines) + "\n"


def test_the_breaker_gauge_is_the_one_the_real_smg_exports() -> None:
    """The family and its label are the captured smg's, and the capture saw the gauge at 1 for
    a worker GET /workers listed ready, whose listing has no breaker field."""
    from operations.programs import router_workers as rw

    fixtures = Path(__file__).parents[1] / "fixtures" / "smg"
    families = json.loads((fixtures / "metrics-1.13.0.json").read_text())["families"]
    assert families[rw.BREAKER_GAUGE] == {"labels": ["worker"], "type": "gauge"}
    seen = json.loads((fixtures / "behaviour-1.13.0.json").read_text())["circuit_breaker_open"]
    assert seen["b open: GET /workers"]["status"] == "ready"
    assert seen["b open: smg_worker_cb_state"]["b"] == rw.BREAKER_OPEN
    assert not [k for k in seen["b open: GET /workers"]["keys"] if "circuit" in k or "cb" in k]
    answer = seen["a drained, b listed ready with its breaker open: a chat request"]
    assert answer["status"] == 503 and "All workers are unavailable" in json.dumps(answer)


def test_breaker_states_read_smg_s_gauge_by_worker_url() -> None:
    from operations.programs import router_workers as rw

    page = _smg_breaker_page({"http://b:1/": 1.0, "http://c:2": 0.0})
    assert rw.breaker_states(page) == {"http://b:1": 1.0, "http://c:2": 0.0}
    # sglang-router 0.3.2's page, or any without the gauge: unknown, not "all closed".
    assert rw.breaker_states("sgl_router_requests_total 3\n") is None


def test_a_peer_listed_ready_with_its_breaker_open_or_stalled_is_not_routable() -> None:
    """smg places a request only on a worker that is Ready, not stalled and whose breaker is
    not open (Worker::is_available); GET /workers says the first two, the metrics the third."""
    from operations.programs import router_workers as rw

    ready: rw.Worker = {"id": "b", "url": "http://b", "is_healthy": True, "status": "ready"}
    assert rw.unplaceable(ready, None, 10) is None
    assert rw.unplaceable(ready, 0.0, 10) == "circuit breaker open"
    assert rw.unplaceable(ready, 9.9, 10) == "circuit breaker open"
    # Open for its whole timeout: smg's next look makes it half_open, which takes requests.
    assert rw.unplaceable(ready, 10.0, 10) is None
    assert rw.unplaceable(ready, 99.0, None) == "circuit breaker open"
    stalled: rw.Worker = {**ready, "stalled": "unreachable"}
    assert rw.unplaceable(stalled, None, 10) == "stalled (unreachable)"
    not_ready: rw.Worker = {**ready, "is_healthy": False, "status": "not_ready"}
    assert rw.unplaceable(not_ready, None, 10) == "listed not_ready"
    assert rw.unplaceable(None, None, 10) == "listed absent"


def test_a_drain_waits_for_a_peer_whose_breaker_lets_requests_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The testbed's case: the other rank listed ready, its breaker open. The drain waits
    until the router's metrics show it closed (or half_open), or until it has been seen open
    for the breaker's timeout; an unreadable page falls back to `ready`, said."""
    import argparse

    from operations.programs import router_workers as rw

    leaving = [("sglang@0.service", "http://a", "")]
    both = {
        "http://a": {"id": "a", "url": "http://a", "is_healthy": True, "status": "ready"},
        "http://b": {"id": "b", "url": "http://b", "is_healthy": True, "status": "ready"},
    }
    monkeypatch.setattr(rw, "listed", lambda args: both)
    monkeypatch.setattr("operations.programs.router_workers.time.sleep", lambda seconds: None)
    args = argparse.Namespace(router_metrics="http://r:29000", breaker_timeout=10.0)

    pages = iter([{"http://a": 0.0, "http://b": 1.0}] * 2 + [{"http://a": 0.0, "http://b": 2.0}])
    reads: list[dict[str, float]] = []

    def breakers(args: argparse.Namespace) -> dict[str, float] | None:
        reads.append(next(pages))
        return rw.breaker_states(_smg_breaker_page(reads[-1]))

    monkeypatch.setattr(rw, "router_breakers", breakers)
    rw.peer_routable(args, leaving, both)  # type: ignore[arg-type]
    assert len(reads) == 3  # waited while b's breaker was open, went on once half_open
    assert "draining anyway" not in capsys.readouterr().out

    # Open, with no request to move it: after the breaker's timeout it counts as half_open.
    clock = iter(range(0, 1000, 4))
    monkeypatch.setattr("operations.programs.router_workers.time.monotonic", lambda: next(clock))
    monkeypatch.setattr(rw, "router_breakers", lambda args: {"http://b": 1.0})
    reads.clear()
    rw.peer_routable(args, leaving, both)  # type: ignore[arg-type]
    assert "draining anyway" not in capsys.readouterr().out

    # No breaker timeout known: it waits PEER_WAIT_S, then drains, naming why.
    args = argparse.Namespace(router_metrics="http://r:29000", breaker_timeout=None)
    rw.peer_routable(args, leaving, both)  # type: ignore[arg-type]
    said = capsys.readouterr().out
    assert "(http://b circuit breaker open): draining anyway" in said

    # The page cannot be read: `ready` alone, said once.
    monkeypatch.setattr(rw, "router_breakers", lambda args: None)
    assert rw.peer_routable(args, leaving, both) is both  # type: ignore[arg-type]
    said = capsys.readouterr().out
    assert said.count("circuit breakers are unknown (http://r:29000: no smg_worker_cb_state)") == 1


def test_behind_a_router_the_plan_hands_the_drain_its_metrics_and_breaker_timeout() -> None:
    """The guard's metrics URL is the router's Prometheus server where the drain reaches the
    router (the canary reads the same one), and only `out` gets it."""
    from operations.plan.canary_plan import router_metrics_url
    from operations.steps.serve import host_argv, router_workers, workers_args

    s = with_router()
    plan, _, _ = drain.decide("ct200", s, [("ct200", s)], kb.load())
    assert plan is not None and s.router is not None
    assert plan.router_metrics == f"http://127.0.0.1:{s.router.metrics_port}"
    assert plan.breaker_timeout_s == s.router.cb_timeout_s
    assert router_metrics_url(s, plan) == plan.router_metrics
    out = " ".join(host_argv(router_workers, **workers_args(plan, "out", [0])))
    back = " ".join(host_argv(router_workers, **workers_args(plan, "in", [0])))
    want = f"--router-metrics {plan.router_metrics} --breaker-timeout {s.router.cb_timeout_s}"
    assert want in out and "--router-metrics" not in back
