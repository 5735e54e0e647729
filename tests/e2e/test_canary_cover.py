"""A canary covers every rank (issue 49), end to end on its own testbed container (three ranks
of the SGLang server double behind the real router, as tests/e2e/test_canary.py serves two):
a rank down before a canary deploy is not started on the new flags before the verdict and
stays stopped after a failed one, and a canary that never gets healthy is rolled back onto its
saved unit in the same run; neither leaves a rank on the rejected flags. The strategy is
unset: the canary is the default on a serving host.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from tests import testbed as tb
from tests.e2e.deploying import Indexes
from tests.e2e.serving import deploy, ok, tokenized_model_host
from tests.e2e.serving import serving_indexes as serving_indexes  # the `indexes` fixture
from tests.e2e.test_canary import RATE, data, fraction, rate, record, slow_canary_undone
from tests.testbed import Container

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def host(testbed: tb.Testbed) -> Iterator[Container]:
    yield from tokenized_model_host(testbed)


def fail_while_unit_says(c: Container, rank: int, pattern: str) -> None:
    """A runtime drop-in: the rank's start fails (ExecStartPre) while its unit file matches
    `pattern` (a grep regex without blanks or quotes), so a canary on that command line never
    gets healthy and its saved unit starts."""
    dropin = f"/run/systemd/system/sglang@{rank}.service.d/fail.conf"
    check = f"if grep -q {pattern} {layout.rank_unit_path(rank)}; then exit 1; fi"
    content = f'[Service]\nExecStartPre=/bin/sh -c "{check}"\n'
    rc, _, err = c.ssh_run(
        f"mkdir -p {Path(dropin).parent} && printf '%s' {shlex.quote(content)} > {dropin}"
        " && systemctl daemon-reload"
    )
    assert rc == 0, err
    _, out, _ = c.ssh_run(f"systemctl cat sglang@{rank}.service")
    assert f'ExecStartPre=/bin/sh -c "{check}"' in out, out


def active(c: Container, ranks: range) -> list[str]:
    units = " ".join(f"sglang@{r}.service" for r in ranks)
    _, out, _ = c.ssh_run(f"systemctl is-active {units}")
    return out.split()


def test_a_rank_down_and_a_canary_never_healthy_leave_no_rank_on_the_rejected_flags(
    host: Container, indexes: Indexes, tmp_path: Path
) -> None:
    c = host
    slow_canary_undone(c)
    rate(c, "sglang@.service", RATE)
    # The strategy unset (rollout given without it): a canary, the host serving already.
    unset = {"soak_s": 2, "max_slowdown": 0.1}

    def three(fraction: float, **extra: Any) -> dict[str, Any]:
        return data(c, indexes, dp_size=3, mem_fraction_static=fraction, **extra)

    ok(deploy(tmp_path, {c: three(0.9)}))
    assert active(c, range(3)) == ["active"] * 3

    # 1. Rank 2 is down before a canary deploy whose canary is 4 times slower: rank 2 is not
    # started before the verdict, and after the failed verdict it is still stopped, on its old
    # unit, named in the output.
    rc, _, err = c.ssh_run("systemctl stop sglang@2.service")
    assert rc == 0, err
    rate(c, "sglang@0.service", RATE // 4)
    failed = deploy(tmp_path, {c: three(0.45, rollout=unset)})
    assert failed.rc != 0, failed
    assert "canary: FAILED (speed" in failed.output, failed
    assert "sglang@2.service not started: stopped until a verdict passes" in failed.output
    assert [fraction(c, r) for r in range(3)] == ["0.9"] * 3
    assert active(c, range(3)) == ["active", "active", "inactive"]
    assert record(c)["ok"] is False and record(c)["rolled_back"] is True

    # 2. A canary that never gets healthy: rolled back onto its saved unit in the same run, the
    # deploy fails naming it; rank 2 still stopped, no rank on the rejected line.
    slow_canary_undone(c)
    fail_while_unit_says(c, 0, "mem-fraction-static.0.35")
    never = deploy(tmp_path, {c: three(0.35, rollout=unset, health_timeout_s=30)})
    assert never.rc != 0, never
    assert "sglang@0.service: the canary failed at health; rolled back onto its saved unit" in (
        never.output
    ), never
    assert "Canary | compare" not in never.output, never
    assert [fraction(c, r) for r in range(3)] == ["0.9"] * 3
    assert active(c, range(3)) == ["active", "active", "inactive"]

    # 3. The same change once the canary can start: it passes, and rank 2 starts on the new
    # line only after the verdict.
    slow_canary_undone(c)
    passed = deploy(tmp_path, {c: three(0.35, rollout=unset, health_timeout_s=30)})
    ok(passed)
    assert "canary: passed" in passed.output, passed
    # pyinfra's log names each operation as it starts: the comparison, then rank 2's start.
    compared = passed.output.index("Canary | compare sglang@0.service")
    started = passed.output.index("start sglang@2.service (after the canary's verdict passed)")
    assert compared < started, passed
    assert [fraction(c, r) for r in range(3)] == ["0.35"] * 3
    assert active(c, range(3)) == ["active"] * 3
