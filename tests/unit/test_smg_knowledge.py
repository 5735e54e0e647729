"""What the knowledge base says about smg 1.13.0, held against the real binary's behaviour and
the pinned install.

tests/fixtures/smg/behaviour-1.13.0.json is written by scripts/capture_smg_behaviour.py, which
starts the released smg (installed from operations/kb/pins/smg-1.13.0-pyX.Y.txt) through
operations/programs/router_launch.py in front of two stand-in ranks. The `routers` entry was
read in the sdist; these tests fail when the two disagree, so a double that mirrors the entry
mirrors the real gateway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from operations import kb
from operations.kb.pins import router_file, router_requirements

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smg" / "behaviour-1.13.0.json"
KNOWLEDGE = kb.load()
SMG = KNOWLEDGE.routers["1.13.0"]


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(FIXTURE.read_text())
    assert found["smg"] == SMG.version
    return found


def test_the_worker_api_answers_as_the_entry_says(seen: dict[str, Any]) -> None:
    api = seen["worker_api"]
    assert api["POST /workers a listed url"]["status"] == SMG.duplicate_add_status == 409
    assert api["POST /workers a listed url"]["body"]["code"] == "WORKER_ALREADY_EXISTS"
    assert api["POST /workers a new url"]["status"] == 202
    assert api["DELETE /workers/{id}"] == 202
    assert api["DELETE /workers/{unknown id}"] == 404
    assert SMG.update_worker == "PATCH /workers/{id}"
    assert api["PATCH /workers/{id} health.drain_settle_secs"] == 202
    assert "status" in seen["get_workers"]["worker_keys"]


def test_the_control_plane_is_closed_by_the_option_only(seen: dict[str, Any]) -> None:
    plane = SMG.control_plane
    assert plane is not None
    auth = seen["auth"]
    assert auth["GET /workers without a key"] == plane.missing_key_status == 401
    assert auth["GET /workers with a wrong key"] == 401
    assert auth["DELETE /workers/{id} without a key"] == 401
    assert auth["GET /workers with the key"] == 200
    # The launcher took the key in-process (router_launch.py); the variable alone opens it.
    assert seen["launched_by"] == "operations/programs/router_launch.py"
    assert "control_plane" not in seen["security_posture_logged_with_the_key"]
    from_env = seen["env_CONTROL_PLANE_API_KEYS_without_the_option"]
    assert plane.no_environment
    assert from_env["GET /workers without a key"] == 200
    assert "control_plane" in from_env["security_posture_logged"]


def test_a_delete_drains_on_a_timer_not_on_the_requests_in_flight(seen: dict[str, Any]) -> None:
    drain = SMG.drain
    assert drain is not None and not drain.waits_for_in_flight
    run = seen["drain_default_with_requests_in_flight"]
    # The DELETE is a queued job (202): within a poll or two the worker is listed draining,
    # then it leaves the list; the other stays ready throughout.
    a = [t["statuses"].get("a", "gone") for t in run["status timeline"]]
    assert [x for x in a if x != "ready"] == [drain.state, "gone"] and drain.state == "draining"
    assert {t["statuses"]["b"] for t in run["status timeline"]} == {"ready"}
    assert drain.state in SMG.worker_states
    assert run["new requests that reached the draining worker"] == 0
    assert set(run["new requests sent while it drained, served by"]) == {"b"}
    assert drain.settle_secs <= run["removed_after_s"] < drain.settle_secs + 1
    # Removed with requests still in flight there: the roll must wait on the rank itself.
    assert run["requests in flight on the drained worker at the DELETE"] > 0
    assert run["requests still in flight on the worker when smg removed it"] > 0
    assert run["the in-flight requests' answers"].count("200 from a") == 2
    assert 1.0 <= seen["drain_after_patch_settle_1s"]["removed_after_s"] < 2.0


def test_a_workers_own_settle_is_set_by_a_queued_patch_or_carried_by_its_post(
    seen: dict[str, Any],
) -> None:
    """What the roll's short settle rests on (plan/drain.py ROLL_SETTLE_S, router_workers.py
    --settle): PATCH is a job GET /workers/{id} reports until done; a POST's settle is listed;
    settle 1 still lists the worker draining, 0 removes it within a poll."""
    drain = SMG.drain
    assert drain is not None
    assert (drain.settle_update, drain.settle_applied) == (SMG.update_worker, "GET /workers/{id}")
    update = seen["PATCH /workers/{id}: GET /workers/{id} while the update runs"]
    assert update["PATCH status"] == 202
    jobs = update["job_status seen (null: done)"]
    assert jobs[-1] is None and jobs[:-1] and all(j.startswith("UpdateWorker ") for j in jobs[:-1])
    assert update["worker statuses seen"] == ["ready"]  # routable while it runs
    assert update["listed health after the PATCH"] is None  # the listing shows a POST's only
    posted = seen["drain_after_post_settle_1s"]
    assert posted["listed health"] == {"drain_settle_secs": 1}
    assert posted["statuses seen until removed"] == [drain.state]
    assert 1.0 <= posted["removed_after_s"] < 2.0
    assert seen["drain_after_patch_settle_0s"]["removed_after_s"] < 0.5


def test_a_static_worker_whose_health_fails_comes_back(seen: dict[str, Any]) -> None:
    assert SMG.health is not None
    assert seen["health"]["statuses seen"] == ["ready", "not_ready", "ready"]
    assert set(seen["health"]["statuses seen"]) <= set(SMG.worker_states)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_smg_is_pinned_with_hashes_in_its_own_file(python: str) -> None:
    path = router_file(SMG.version, python, SMG.package)
    assert path.name == f"smg-1.13.0-py{python}.txt"
    text = router_requirements(SMG.version, python, SMG.package)
    assert "smg==1.13.0 \\\n    --hash=sha256:" in text
    # The manylinux x86_64 wheel the capture installed, by its sha256 on PyPI.
    assert "cfae8171dac68a74b4822263b1864fa79952992ee472a25ba7266ccd200399b4" in text
    # Both wheels install an `smg` command: sglang-router never shares smg's environment.
    assert "sglang-router" not in text and "sglang_router" not in text
    assert set(KNOWLEDGE.routers["0.3.2"].commands) & set(SMG.commands) == {"smg"}
    assert router_file("0.3.2", python).name == f"router-0.3.2-py{python}.txt"
