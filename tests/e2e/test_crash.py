"""Crash safety on real systemd (issue 31).

A deploy killed (`kill -9` of pyinfra, which drops its SSH sessions with it) at a point inside
each step of a roll 0.5.11 -> 0.5.19 behind the real router with its control-plane key (smg
1.13.0, the default, and sglang-router 0.3.2: one container for each, all kill points in it),
in the order a run reaches them: the engine install, the
copy of a changed model, the API key file's write, between a rank's unit write and its
restart (rank drained out of the router), and after that rank's restart before it is put back
into the router; then the host's SSH sessions dropped mid-roll (sshd's, by PID: the controller
lives on). Each kill is triggered by the host at the point, never by a sleep: a test double
holds the call named (a rank's `systemctl stop`, `uv sync`, `base64 -d`, the health wait's
`systemctl show` after the batch's restart) and writes its PID first, or (the model copy) the
copy is seen half done. After each: every unit runs and at most one batch is out of the
router. The run after the last one converges (nothing left of the killed runs: no half copy, no
temp file of a write), the run after it changes nothing, and status agrees with every process.

What runs is a fact: the ServingState fact's own command, run in a testbed container, tells a
rank whose process runs what its unit file says from one whose file was rewritten after the
process started (a deploy killed between `_roll`'s unit write and its restart), before and
after the daemon-reload, and the plan rolls exactly that rank. The unit runs a plain process
(the fact reads systemd and the files, not the server), so no engine is installed here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.facts.serve import Serving, ServingState, parse_serving
from operations.plan.planned_files import sha256
from operations.plan.rank_state import rank_pending_restart
from operations.plan.serve_plan import ServePlan, roll_plan
from operations.runtime import deploy_lock
from tests import testbed as tb
from tests.e2e.deploying import LANE, Deploying, Indexes, start_deploy
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    MODEL_DIR,
    RELEASE,
    ROUTER_PORT,
    base_data,
    deploy,
    http,
    ok,
    release_indexes,
    serve_ops,
    serving_spec,
    status_inventory,
    unit_states,
)
from tests.e2e.serving import (
    run_status as status_command,
)
from tests.testbed import BootContainers, Container, ContainerSpec
from tests.unit.test_roll import ranks

pytestmark = pytest.mark.e2e


def unit_text(release: str) -> str:
    # A real unit systemd starts; the release is only in its text, as a rank unit's engine is.
    return (
        "[Unit]\nDescription=rank 0 (test_crash)\n\n[Service]\n"
        f"Environment=SGLANG_RELEASE={release}\n"
        "ExecStart=/bin/sleep infinity\n"
    )


def written(text: str) -> str:
    """A shell line that writes `text` as rank 0's unit, as put_file does (temp + rename)."""
    path = layout.unit_path(layout.unit_name(0))
    return f"printf '%s' '{text}' > {path}.tmp && mv -f {path}.tmp {path}"


def read(container: object) -> Serving:
    command = ServingState().command(
        engine_root="/opt/sglang",
        model_link="/dev/shm/models/m",
        paths=[layout.SECRETS_FILE],
        ranks=[0],
        router=False,
    )
    rc, out, err = container.ssh_run(command.get_raw_value())  # type: ignore[attr-defined]
    assert rc == 0, err
    return parse_serving(out.splitlines())


def test_a_unit_rewritten_after_its_process_started_is_pending_restart(
    boot_containers: BootContainers,
) -> None:
    (host,) = boot_containers(ContainerSpec())
    unit = layout.unit_name(0)

    def run(cmd: str) -> str:
        rc, out, err = host.ssh_run(cmd)
        assert rc == 0, f"{cmd}: {err}"
        return out

    run(f"{written(unit_text('0.5.11'))} && systemctl daemon-reload && systemctl start {unit}")
    started = read(host)
    assert started.ranks[0].running and started.ranks[0].started_at is not None
    assert rank_pending_restart(started, 0) is None, started.ranks[0]

    # The kill: the new unit is on disk, its process still the old one. The host's clock must
    # have passed the start's second (the fact compares seconds): wait for it, not a sleep.
    run(f"until [ $(date +%s) -gt {started.ranks[0].started_at} ]; do :; done")
    run(written(unit_text("0.5.19")))
    unreloaded = read(host)
    assert unreloaded.ranks[0].need_reload, unreloaded.ranks[0]
    assert (
        rank_pending_restart(unreloaded, 0) == "its unit file changed and systemd was not reloaded"
    )

    run("systemctl daemon-reload")
    reloaded = read(host)
    assert not reloaded.ranks[0].need_reload
    assert rank_pending_restart(reloaded, 0) == "its unit file changed after the process started"
    assert reloaded.ranks[0].main_pid == started.ranks[0].main_pid

    # The plan: the file is what the plan wants, yet the rank restarts (before: "nothing to
    # restart" for ever).
    want = ranks()[:1]
    on_disk = dataclasses.replace(
        reloaded,
        ranks={0: dataclasses.replace(reloaded.ranks[0], unit_sha256=sha256(want[0].unit))},
    )
    plan = roll_plan(want, on_disk, batch_size=1)
    assert [[r.rank for r in b] for b in plan.batches] == [[0]]
    assert "nothing to restart" not in ServePlan(roll=plan).summary()

    run(f"systemctl restart {unit}")
    restarted = read(host)
    assert restarted.ranks[0].main_pid != started.ranks[0].main_pid
    assert rank_pending_restart(restarted, 0) is None, restarted.ranks[0]


NEW_RELEASE = "0.5.19"
REACHED = "/run/test-crash-reached"
ARMED = "/run/test-crash-armed"
UV = "/opt/sglang/tools/bin/uv"
SYSTEMCTL = "/usr/local/sbin/systemctl"
BASE64 = "/usr/local/bin/base64"
MODELS = "/dev/shm/models"
STAGING = f"{MODELS}/.*.tmp-*"
API_KEY = "sk-crash-0123456789abcdef0123456789"
# TEST DOUBLES, each with one fault-injection point: while ARMED exists and the call is the one
# named, the double writes its PID to REACHED and holds (the test kills the deploy meanwhile);
# every other call is the real program's. The doubles in /usr/local/{sbin,bin} come first in
# root's PATH over SSH (Debian's sshd default PATH).


def systemctl_double(rank: int) -> str:
    """systemctl: the first `stop` of `rank` once its unit file names the new release, i.e.
    between `_roll`'s unit write and its restart (operations/steps/serve.py restart_command: the
    batch's first call to systemd after the write), with that rank drained out of the router
    and its old process still serving."""
    return f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the roll between a unit write and its restart.
if [ "$1" = stop ] && [ -e {ARMED} ] && grep -q {NEW_RELEASE}-{LANE} \\
    /etc/systemd/system/sglang@{rank}.service 2>/dev/null; then
  case " $* " in
    *" sglang@{rank}.service "*)
      rm -f {ARMED}
      echo $$ > {REACHED}
      exec sleep 600 ;;
  esac
fi
exec /usr/bin/systemctl "$@"
"""


# uv, in place of the engine's own (moved to uv.real): its `sync` of the new engine, i.e. with
# the new environment made by `uv venv` and not yet installed (operations/steps/engine.py
# build_env).
UV_DOUBLE = f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the engine install after `uv venv`.
if [ "$1" = sync ] && [ -e {ARMED} ]; then
  rm -f {ARMED}
  echo $$ > {REACHED}
  exec sleep 600
fi
exec {UV}.real "$@"
"""
# base64: the `base64 -d` of put_file's write script (operations/steps/host_files.py) while the API
# key file's temp file exists, i.e. made with its final mode and owners, not yet written.
SECRET_TEMP = f"{layout.CONFIG_DIR}/.secrets.yaml.??????????"
BASE64_DOUBLE = f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the API key file's write before its first byte.
if [ "$1" = -d ] && [ -e {ARMED} ] && ls {SECRET_TEMP} >/dev/null 2>&1; then
  rm -f {ARMED}
  echo $$ > {REACHED}
  exec sleep 600
fi
exec /usr/bin/base64 "$@"
"""
# systemctl: the health wait's first `systemctl show` of `rank` after the batch restarted it
# (operations/programs/wait_healthy.py, a step of the batch's one host command,
# programs/roll_batch.py): the rank runs the new release, out of the router, not yet re-added.
# (The re-add itself runs inside the batch script's own process: no double can hold it; a
# controller killed here ends the script at its next line of output, before the re-add.)
RESTARTED = "/run/crash-test-restarted"


def health_wait_double(rank: int) -> str:
    unit = f"sglang@{rank}.service"
    return f"""#!/bin/sh
# TEST DOUBLE (tests/e2e/test_crash.py): holds the health wait after the batch's restart.
if [ -e {ARMED} ]; then
  case " $* " in
    *" start {unit} "*|*" start "*" {unit} "*|*" restart {unit} "*|*" restart "*" {unit} "*)
      touch {RESTARTED} ;;
  esac
  if [ "$1" = show ] && [ "$2" = {unit} ] && [ -e {RESTARTED} ]; then
    rm -f {ARMED} {RESTARTED}
    echo $$ > {REACHED}
    exec sleep 600
  fi
fi
exec /usr/bin/systemctl "$@"
"""


# The host's SSH sessions, every one but the caller's own: each child of the listening sshd
# (one per connection) whose process tree the calling shell is not in. By PID, kill -9.
DROP_SESSIONS = """
listener=$(/usr/bin/systemctl show -p MainPID --value ssh.service)
mine=" "; p=$$
while [ "$p" -gt 1 ]; do mine="$mine$p "; p=$(cut -d' ' -f4 /proc/$p/stat); done
dropped=0
for stat in /proc/[0-9]*/stat; do
  pid=$(cut -d' ' -f1 "$stat" 2>/dev/null) || continue
  [ "$(cut -d' ' -f4 "$stat" 2>/dev/null)" = "$listener" ] || continue
  case "$mine" in *" $pid "*) continue ;; esac
  kill -9 "$pid" && dropped=$((dropped + 1))
done
echo "$dropped"
"""


def deploy_killed(deploying: Deploying) -> None:
    deploying.kill()


def held_at(
    c: Container,
    install: str,
    undo: str,
    run: Callable[[], Deploying],
    then: Callable[[Deploying], None] = deploy_killed,
) -> None:
    """Start `run` with the double `install` put in place and armed; when the host writes
    REACHED, `then` (kill -9 the deploy); then undo the double and end the held process by
    its PID."""
    assert c.ssh_run(f"{install} && touch {ARMED}")[0] == 0
    held = ""
    try:
        deploying = run()
        try:
            wait_for(
                lambda: c.ssh_run(f"test -s {REACHED}")[0] == 0,
                timeout=600,
                what="the deploy at the fault-injection point",
            )
            then(deploying)
        finally:
            if deploying.proc.poll() is None:
                deploying.kill()
        held = c.ssh_run(f"cat {REACHED}")[1].strip()
    finally:
        c.ssh_run(f"{undo}; rm -f {ARMED} {REACHED}")
        if held.isdigit():
            c.ssh_run(f"kill {held}")


def killed_at(c: Container, install: str, undo: str, run: Callable[[], Deploying]) -> None:
    held_at(c, install, undo, run)


def written_double(path: str, text: str) -> str:
    return f"cat > {path} <<'EOF'\n{text}EOF\nchmod 755 {path}"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    yield from release_indexes(tmp_path_factory, "crash", (RELEASE, NEW_RELEASE))


@pytest.fixture(scope="module", params=["1.13.0", "0.3.2"], ids=["smg", "sglang-router"])
def router_version(request: pytest.FixtureRequest) -> str:
    """The router the roll drains through: smg (the default) and sglang-router 0.3.2."""
    version: str = request.param
    return version


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed, router_version: str) -> Iterator[Container]:
    (container,) = testbed.boot(serving_spec())
    yield container
    testbed.destroy(container)


def router_data(c: Container, indexes: Indexes, version: str, **extra: object) -> dict[str, object]:
    router = {"host": c.name, "port": ROUTER_PORT, "bind": c.address, "version": version}
    return base_data(c, indexes, router=router, **extra)


def listed(c: Container) -> dict[str, bool]:
    # The worker API wants the router's control-plane key (docs/how-it-works/security.md).
    _, key, _ = c.ssh_run(f"cat {layout.CONTROL_PLANE_KEY_FILE}")
    status, body = http(f"http://{c.address}:{ROUTER_PORT}/workers", key=key.strip())
    assert status == 200, status
    # smg lists a drained worker as `draining` (it gets no new request) until its settle timer
    # removes it (the knowledge base's smg entry): out of the router either way.
    return {w["url"]: w["is_healthy"] for w in body["workers"] if w.get("status") != "draining"}


def worker(c: Container, rank: int) -> str:
    return f"http://{c.address}:{30000 + rank}"


def at_most_one_batch_out(c: Container, out: int | None) -> None:
    """Every rank's unit runs; the router lists every rank but `out` (a batch of 1), healthy."""
    states = unit_states(c, range(8))
    assert all(state == "active" for state, _ in states.values()), states
    workers = listed(c)
    want = [worker(c, r) for r in range(8) if r != out]
    assert sorted(workers) == want and all(workers.values()), workers


def running_release(c: Container, rank: int) -> str:
    """What rank's process runs: its /proc/PID/cmdline's interpreter (ENV/bin/python)."""
    pid = unit_states(c, range(rank, rank + 1))[rank][1]
    _, out, _ = c.ssh_run(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    return NEW_RELEASE if f"{NEW_RELEASE}-{LANE}" in out else RELEASE


def served_copies(c: Container) -> set[str]:
    """The model copies the ranks' processes were started with (their unit files' --model-path
    is what they read at start: a unit rewritten since names a copy it does not run)."""
    found = set()
    for rank in range(8):
        pid = unit_states(c, range(rank, rank + 1))[rank][1]
        _, out, _ = c.ssh_run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline")
        words = out.split("\n")
        found.add(words[words.index("--model-path") + 1])
    return found


def copied_bytes(c: Container) -> int:
    """What the model copy in progress holds so far (0: none under way)."""
    _, out, _ = c.ssh_run(f"du -sbc {STAGING} 2>/dev/null | tail -n1 | cut -f1")
    return int(out.strip() or 0)


def lock_free(c: Container) -> bool:
    probe = (
        f'python3 -c \'import fcntl, os; fd = os.open("{deploy_lock.LOCK_PATH}", os.O_RDWR); '
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)'"
    )
    return c.ssh_run(probe)[0] == 0


def test_a_deploy_killed_at_each_step_of_a_roll_or_its_ssh_sessions_dropped(
    host: Container, indexes: Indexes, router_version: str, tmp_path: Path
) -> None:
    c = host
    ok(deploy(tmp_path, {c: router_data(c, indexes, router_version)}))
    # Behind a router, a converged re-run changes nothing (issue 29).
    again = deploy(tmp_path, {c: router_data(c, indexes, router_version)})
    ok(again)
    assert {k: v for k, v in again.statuses.items() if v != "No changes"} == {}, again
    old_copies = served_copies(c)

    # The change rolled: a new release, a changed model (a shard a slow copy takes seconds
    # over) and an API key (a new secret).
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    shard = f"{MODEL_DIR}/model-00001-of-00001.safetensors"
    assert c.ssh_run(f"head -c 4M /dev/urandom > {shard}")[0] == 0
    new = {"sglang_version": NEW_RELEASE, "api_key_file": str(key_file)}

    def roll(**extra: object) -> Callable[[], Deploying]:
        data = router_data(c, indexes, router_version, **new, **extra)
        return lambda: start_deploy(tmp_path, {c: data})

    # 1. Killed inside the engine install: the new environment is made, not installed. Every
    # rank still serves the old release, all in the router; nothing names the partial one.
    killed_at(
        c, f"mv {UV} {UV}.real && {written_double(UV, UV_DOUBLE)}", f"mv -f {UV}.real {UV}", roll()
    )
    _, partial, _ = c.ssh_run(f"ls -d /opt/sglang/envs/{NEW_RELEASE}-*")
    assert partial.strip(), "the kill was not inside the install"
    assert [running_release(c, r) for r in range(8)] == [RELEASE] * 8
    at_most_one_batch_out(c, None)

    # 2. Killed while the changed model is copied (the re-run first finishes the engine): the
    # copy, throttled to 1 MB/s, is seen half done beside the served one; its stage process
    # is frozen first, so that the kill leaves it as a lost host session would (no cleanup).
    copying = roll(model_stage_bwlimit_mbps=1)()
    try:
        wait_for(
            lambda: copied_bytes(c) > 256 * 1024,
            timeout=600,
            what="the model copy under way",
            proc=copying.proc,  # type: ignore[arg-type]
        )
        _, temp, _ = c.ssh_run(f"ls -d {STAGING}")
        stage_pid = temp.strip().rsplit("-", 1)[1]
        assert c.ssh_run(f"kill -STOP {stage_pid}")[0] == 0
    finally:
        copying.kill()
    assert c.ssh_run(f"kill -9 {stage_pid}")[0] == 0
    _, size, _ = c.ssh_run(f"du -sb {temp.strip()} | cut -f1")
    assert 0 < int(size) < 4 * 1024 * 1024, size  # half copied, and left there
    # Never served half-copied: every rank runs the old copy, in the router.
    assert served_copies(c) == old_copies
    at_most_one_batch_out(c, None)

    # 3. Killed as the API key file is written (the re-run removes the leftover copy and
    # copies again): its temp file has its final mode and owners, not a byte yet; no rank
    # reads it, and the API key file is not there.
    killed_at(c, written_double(BASE64, BASE64_DOUBLE), f"rm -f {BASE64}", roll())
    _, stat, _ = c.ssh_run(f"stat -c '%a %U:%G %s' {SECRET_TEMP}")
    assert stat.split() == ["640", "root:sglang", "0"], stat
    assert c.ssh_run(f"test -e {layout.SECRETS_FILE}")[0] != 0
    _, left, _ = c.ssh_run(f"ls -d {STAGING} 2>/dev/null")
    assert not left.strip(), left
    at_most_one_batch_out(c, None)

    # 4. Killed between rank 0's unit write and its restart: rank 0's file names the new
    # release, its process still runs the old one, and it is out of the router (one batch).
    killed_at(c, written_double(SYSTEMCTL, systemctl_double(0)), f"rm -f {SYSTEMCTL}", roll())
    assert c.ssh_run(f"ls {SECRET_TEMP}")[0] != 0  # the re-run removed the killed write's
    _, mode, _ = c.ssh_run(f"stat -c '%a %U:%G' {layout.SECRETS_FILE}")
    assert mode.strip() == "640 root:sglang", mode
    assert running_release(c, 0) == RELEASE
    at_most_one_batch_out(c, 0)
    status = run_status(tmp_path, c, router_data(c, indexes, router_version, **new))
    assert "pending restart" in status["ranks"][0]["state"], status["ranks"][0]

    # 5. Killed after rank 0 restarted on the new release, before it is put back into the
    # (authenticated) router.
    killed_at(
        c,
        written_double(SYSTEMCTL, health_wait_double(0)),
        f"rm -f {SYSTEMCTL} {RESTARTED}",
        roll(),
    )
    assert running_release(c, 0) == NEW_RELEASE
    at_most_one_batch_out(c, 0)

    # 6. The host's SSH sessions dropped mid-roll (the controller lives on): while rank 3's
    # unit names the new release and it is not restarted. The re-run first put rank 0 back.
    def sessions_dropped(deploying: Deploying) -> None:
        assert not lock_free(c)  # the run holds the host's lock
        _, dropped, _ = c.ssh_run(DROP_SESSIONS)
        assert int(dropped) >= 1, dropped
        cut = deploying.finish(timeout=300)
        assert cut.rc != 0, str(cut)

    held_at(
        c,
        written_double(SYSTEMCTL, systemctl_double(3)),
        f"rm -f {SYSTEMCTL}",
        roll(),
        then=sessions_dropped,
    )
    assert [running_release(c, r) for r in range(4)] == [NEW_RELEASE] * 3 + [RELEASE]
    at_most_one_batch_out(c, 3)
    # The dropped run's lock went with its session: the next run need not wait for it.
    wait_for(lambda: lock_free(c), timeout=30, what="the dropped run's deploy lock released")
    status = run_status(tmp_path, c, router_data(c, indexes, router_version, **new))
    assert "pending restart" in status["ranks"][3]["state"], status["ranks"][3]
    assert [r["sglang_version"] for r in status["ranks"][:3]] == [NEW_RELEASE] * 3, status

    last = router_data(c, indexes, router_version, **new, deploy_lock_wait_s=0)
    finished = deploy(tmp_path, {c: last})
    ok(finished)
    backs = [k for k in serve_ops(finished) if "back into the router" in k]
    assert len(backs) == 5, serve_ops(finished)  # ranks 3 to 7
    assert [running_release(c, r) for r in range(8)] == [NEW_RELEASE] * 8
    assert len(served_copies(c) - old_copies) == 1, served_copies(c)
    at_most_one_batch_out(c, None)
    # Nothing of the killed runs is left: no copy in progress, no temp file of a write.
    _, left, _ = c.ssh_run(
        f"ls -d {STAGING} {layout.CONFIG_DIR}/.*.?????????? /etc/systemd/system/.*.?????????? "
        "2>/dev/null"
    )
    assert not left.strip(), left

    converged = deploy(tmp_path, {c: router_data(c, indexes, router_version, **new)})
    ok(converged)
    assert {k: v for k, v in converged.statuses.items() if v != "No changes"} == {}, converged
    status = run_status(tmp_path, c, router_data(c, indexes, router_version, **new))
    pids = unit_states(c, range(8))
    for row in status["ranks"]:
        assert row["state"] == "active (running)", row
        assert row["pid"] == pids[row["rank"]][1], row
        assert row["sglang_version"] == NEW_RELEASE, row


def run_status(tmp_path: Path, c: Container, data: dict[str, object]) -> dict[str, Any]:
    """`python -m operations.status --json` for the host: its document."""
    inventory = status_inventory(tmp_path, {c.name: {**c.host_data(), **data}})
    proc = status_command(inventory, "--json")
    doc: dict[str, Any] = json.loads(proc.stdout)
    host_doc: dict[str, Any] = doc["hosts"][c.name]
    return host_doc
