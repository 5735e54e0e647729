"""A rank's start, measured and kept short (issue 38), on one testbed container serving two ranks
of the SGLang server double (tests/doubles/packages/sglang/_startup_double.py: FlashInfer's JIT
under its per-module lock into its version-keyed workspace, Triton's autotune without a lock,
the phase lines in the release's words), deployed with the real `pyinfra -y INVENTORY deploy.py`.

- the engine's compile caches are its own directory, the service user's; a cold start of both
  ranks together builds each FlashInfer module once (the lock), and a restarted rank builds and
  tunes nothing;
- a switch to another engine builds into that engine's own caches, and a switch back to the kept
  engine builds and tunes nothing;
- an engine with FlashInfer's prebuilt modules (flashinfer-jit-cache, where the knowledge base
  lists it) builds nothing on its first start: each rank loads them from the jit cache. The
  other deploys turn it off (flashinfer_jit_cache: false), so that their engines compile;
- the health wait reads each start phase by phase from the rank's journal, and a start past its
  budget fails by name with its last phase and the journal lines around it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from operations import layout
from operations.plan.startup import startup_patterns
from tests import testbed as tb
from tests.e2e.deploying import LANE, Indexes
from tests.e2e.index import wait_for
from tests.e2e.serving import (
    RELEASE,
    base_data,
    deploy,
    health,
    ok,
    release_indexes,
    serving_spec,
)
from tests.testbed import Container

pytestmark = pytest.mark.e2e

RANKS = 2
OTHER = "0.5.19"  # another engine (its own FlashInfer, 0.6.18), serving the same model
BUILT = re.compile(r"\[double\] flashinfer jit: built (\S+) in (\S+)")
LOADED = re.compile(r"\[double\] flashinfer jit: loaded (\S+) from (\S+)")
# 0.5.11's FlashInfer 0.6.8.post1 has a cu128 jit cache: these deploys compile, without it.
COMPILING = {"flashinfer_jit_cache": False}
TUNED = "[double] triton autotune: tuned"
DROP_IN = "/etc/systemd/system/sglang@1.service.d/slow.conf"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexes]:
    yield from release_indexes(tmp_path_factory, "start", (RELEASE, OTHER))


@pytest.fixture(scope="module")
def served(
    testbed: tb.Testbed, indexes: Indexes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Container]:
    (container,) = testbed.boot(serving_spec())
    try:
        data = base_data(container, indexes, dp_size=RANKS, **COMPILING)
        ok(deploy(tmp_path_factory.mktemp("start-deploy"), {container: data}))
        yield container
    finally:
        testbed.destroy(container)


def invocation_journal(c: Container, rank: int) -> str:
    """The rank's journal since its current start (this invocation's lines only)."""
    unit = layout.unit_name(rank)
    _, out, _ = c.ssh_run(
        f"journalctl -o short-unix --no-pager -q _SYSTEMD_INVOCATION_ID="
        f"$(systemctl show -p InvocationID --value {unit})"
    )
    return out


def wait_script(c: Container, timeout: int, *ranks: int) -> tuple[int, str]:
    checks = [f"{layout.unit_name(r)}=http://{c.address}:{30000 + r}/health" for r in ranks]
    words = ["python3", layout.WAIT_SCRIPT, "--timeout", str(timeout), "--service-user"]
    command = shlex.join(
        [*words, "sglang", "--phases", startup_patterns(RELEASE), "--silence", "600", *checks]
    )
    rc, out, err = c.ssh_run(command, timeout=timeout + 60)
    return rc, out + err


def test_a_cold_start_builds_each_module_once_into_the_engines_own_cache(
    served: Container,
) -> None:
    c = served
    _, unit, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")
    cache = re.search(r'"FLASHINFER_WORKSPACE_BASE=([^"]+)"', unit)
    assert cache is not None, unit
    _, owner, _ = c.ssh_run(f"stat -c %U {shlex.quote(cache.group(1))}")
    assert owner.strip() == "sglang"
    built = [
        m.group(1) for rank in range(RANKS) for m in BUILT.finditer(invocation_journal(c, rank))
    ]
    # Both ranks started together: the lock let one build each module, the other waited.
    assert sorted(built) == ["batch_decode_with_kv_cache", "batch_prefill_with_kv_cache"], built
    where = {m.group(2) for r in range(RANKS) for m in BUILT.finditer(invocation_journal(c, r))}
    assert all(w.startswith(cache.group(1) + "/.cache/flashinfer/") for w in where), where


def test_a_restarted_rank_builds_and_tunes_nothing_and_its_start_is_read(
    served: Container,
) -> None:
    c = served
    c.ssh_run(f"systemctl restart {layout.unit_name(0)}")
    rc, out = wait_script(c, 120, 0)
    assert rc == 0, out
    journal = invocation_journal(c, 0)
    assert "ready to roll" in journal
    assert BUILT.search(journal) is None and TUNED not in journal, journal
    # The wait's one line: the start phase by phase, in 0.5.11's words.
    line = next(x for x in out.splitlines() if x.startswith("start-up "))
    assert re.search(r"sglang@0\.service: healthy \d+\.\d s: weights \d+\.\d s, graphs", line), line


def built_this_start(c: Container) -> list[tuple[str, str]]:
    """(module, workspace) of every FlashInfer module the ranks built in their current start."""
    return [
        (m.group(1), m.group(2))
        for rank in range(RANKS)
        for m in BUILT.finditer(invocation_journal(c, rank))
    ]


def test_a_switch_back_to_a_kept_engine_builds_and_tunes_nothing(
    served: Container, indexes: Indexes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    c = served
    data = base_data(c, indexes, dp_size=RANKS, **COMPILING)
    _, before, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")

    ok(deploy(tmp_path_factory.mktemp("other-engine"), {c: {**data, "sglang_version": OTHER}}))
    _, unit, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")
    kept = re.search(r'"FLASHINFER_WORKSPACE_BASE=([^"]+)"', before)
    other = re.search(r'"FLASHINFER_WORKSPACE_BASE=([^"]+)"', unit)
    assert kept is not None and other is not None, unit
    assert kept.group(1) != other.group(1), "each engine has its own compile caches"
    # The other engine's ranks compiled, each module once, into its own caches only.
    built = built_this_start(c)
    assert sorted(name for name, _ in built) == [
        "batch_decode_with_kv_cache",
        "batch_prefill_with_kv_cache",
    ], built
    assert all(where.startswith(other.group(1) + "/") for _, where in built), built

    ok(deploy(tmp_path_factory.mktemp("back"), {c: data}))
    _, unit, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")
    assert f'"FLASHINFER_WORKSPACE_BASE={kept.group(1)}"' in unit, unit
    assert f"{RELEASE}-{LANE}" in unit, unit  # the kept engine serves again
    for rank in range(RANKS):
        journal = invocation_journal(c, rank)
        assert "ready to roll" in journal, journal
        # The kept engine's caches survived the other engine's run: nothing compiled or tuned.
        assert BUILT.search(journal) is None and TUNED not in journal, (rank, journal)


def test_an_engine_with_the_jit_cache_builds_nothing_on_its_first_start(
    served: Container, indexes: Indexes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    c = served
    _, before, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")
    data = base_data(c, indexes, dp_size=RANKS)  # flashinfer_jit_cache: the default, on

    ok(deploy(tmp_path_factory.mktemp("jit-cache"), {c: data}))

    _, unit, _ = c.ssh_run(f"cat {layout.unit_path(layout.unit_name(0))}")
    assert unit != before and f"{RELEASE}-{LANE}" in unit, unit  # another engine of 0.5.11
    env = re.search(r"(/\S+/envs/[^/\s]+)/bin/python", unit)
    assert env is not None, unit
    _, version, _ = c.ssh_run(
        f"{env.group(1)}/bin/python -c 'from importlib.metadata import version; "
        'print(version("flashinfer-jit-cache"))\''
    )
    assert version.strip() == "0.6.8.post1+cu128"
    for rank in range(RANKS):
        journal = invocation_journal(c, rank)
        assert "ready to roll" in journal, journal
        # Nothing compiled: each module loaded from the installed jit cache's AOT directory.
        assert BUILT.search(journal) is None, (rank, journal)
        loaded = {m.group(1): m.group(2) for m in LOADED.finditer(journal)}
        assert sorted(loaded) == ["batch_decode_with_kv_cache", "batch_prefill_with_kv_cache"]
        assert all(
            where.startswith(env.group(1)) and where.endswith("/flashinfer_jit_cache/jit_cache")
            for where in loaded.values()
        ), loaded


def test_a_start_past_its_budget_fails_by_name_with_its_last_phase(served: Container) -> None:
    c = served
    c.ssh_run(
        f"mkdir -p {shlex.quote(str(Path(DROP_IN).parent))} && printf '[Service]\\n"
        "Environment=SGLANG_DOUBLE_LOAD_SECONDS=600\\n' > " + DROP_IN + " && "
        f"systemctl daemon-reload && systemctl restart {layout.unit_name(1)}"
    )
    try:
        rc, out = wait_script(c, 8, 1)
        assert rc == 1, out
        assert "sglang@1.service: no 200" in out, out
        assert "last phase weight_load_begin" in out, out
        assert "Load weight begin. avail mem=" in out, out  # the journal around that phase
    finally:
        c.ssh_run(
            f"rm -f {DROP_IN} && systemctl daemon-reload && systemctl restart {layout.unit_name(1)}"
        )
        wait_for(lambda: health(c, 30001) == 200, 120, "rank 1 healthy again")
