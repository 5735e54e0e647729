"""Crash safety on real systemd (issue 31).

What runs is a fact: the ServingState fact's own command, run in a testbed container, tells a
rank whose process runs what its unit file says from one whose file was rewritten after the
process started (a deploy killed between `_roll`'s unit write and its restart), before and
after the daemon-reload, and the plan rolls exactly that rank. The unit runs a plain process
(the fact reads systemd and the files, not the server), so no engine is installed here.
"""

from __future__ import annotations

import dataclasses

import pytest

from operations import layout
from operations.facts.serve import Serving, ServingState, parse_serving
from operations.host_files import sha256
from operations.roll import ServePlan, roll_plan
from tests.testbed import BootContainers, ContainerSpec
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
    assert started.pending_restart(0) is None, started.ranks[0]

    # The kill: the new unit is on disk, its process still the old one. The host's clock must
    # have passed the start's second (the fact compares seconds): wait for it, not a sleep.
    run(f"until [ $(date +%s) -gt {started.ranks[0].started_at} ]; do :; done")
    run(written(unit_text("0.5.19")))
    unreloaded = read(host)
    assert unreloaded.ranks[0].need_reload, unreloaded.ranks[0]
    assert unreloaded.pending_restart(0) == "its unit file changed and systemd was not reloaded"

    run("systemctl daemon-reload")
    reloaded = read(host)
    assert not reloaded.ranks[0].need_reload
    assert reloaded.pending_restart(0) == "its unit file changed after the process started"
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
    assert restarted.pending_restart(0) is None, restarted.ranks[0]
