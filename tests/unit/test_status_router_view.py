"""status beside each rank's own state: the router's view of it (its worker list, read on the
rank's host with the control-plane key by programs/router_list.py). The lines are the program's
own format (tests/unit/test_drain.py runs it against a control plane shaped as smg 1.13.0's);
the states are smg's (tests/fixtures/smg/behaviour-1.13.0.json: ready, not_ready, draining)."""

from __future__ import annotations

import json

from rich.console import Console

from operations import layout
from operations.cli import status as st
from operations.facts.serve import Serving
from operations.facts.serve_status import ServingStatus, parse_status
from tests.unit.builders import make_settings
from tests.unit.test_status import FIXTURES, ROUTER, fact

HOST = "127.0.0.10"
LISTED = [
    "router_workers ok",
    f"worker http://{HOST}:30000 ready",
    f"worker http://{HOST}:30001 draining",
    f"worker http://{HOST}:30002 not_ready",
    f"worker http://{HOST}:30003 ready",
    f"stalled http://{HOST}:30003 wedged",
    f"worker http://{HOST}:30004 failed",
    f"worker http://{HOST}:30005 ready",
    f"worker http://{HOST}:30006 ready",
    # Another host's rank behind the same router: not this host's row.
    "worker http://10.0.0.201:30000 ready",
]


def words(line: str) -> list[str]:
    """A table line's words, the box's rules left out."""
    return [w for w in line.replace("┃", " ").replace("│", " ").split() if w]


def header(text: str) -> list[str]:
    return next(words(line) for line in text.splitlines() if words(line)[:2] == ["rank", "unit"])


def result(status: Serving) -> st.HostResult:
    settings = make_settings(server_host=HOST, router=ROUTER)
    return st.host_result("ct200", settings, status)


def test_each_rank_shows_the_routers_own_state_beside_its_own() -> None:
    r = result(fact("eight-ranks-and-the-router-healthy", *LISTED))
    seen = [(row.router_state, row.router_stalled) for row in r.ranks]
    assert seen == [
        ("ready", None),
        ("draining", None),
        ("not_ready", None),
        ("ready", "wedged"),
        ("failed", None),
        ("ready", None),
        ("ready", None),
        ("not listed", None),
    ]
    # The rank's own state is its own: every rank answers /health here.
    assert all(row.healthy for row in r.ranks)
    assert r.router is not None and r.router.workers == "ok"
    doc = st.to_json([r])["hosts"]["ct200"]
    assert doc["ranks"][1]["router_state"] == "draining"
    assert doc["ranks"][3]["router_stalled"] == "wedged"
    assert doc["router"] is not None and doc["router"]["workers"] == "ok"


def test_the_table_has_a_router_column_wide_and_narrow() -> None:
    r = result(fact("eight-ranks-and-the-router-healthy", *LISTED))
    for width in (220, 80):
        console = Console(record=True, width=width)
        st.print_results([r], console=console)
        text = console.export_text()
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width, text
        assert "router" in header(text), text
        ranks = [[str(n)] for n in range(8)]
        rows = {words(ln)[0]: ln for ln in lines if words(ln)[:1] in ranks}
        assert " draining " in rows["1"] and " not_ready " in rows["2"], text
        assert "not listed" in rows["7"], text
        stalled = "stalled: wedged" if width > st.view.WIDE_COLUMNS else " wedged "
        assert stalled in rows["3"], text


def test_a_list_the_router_refused_is_said_once_and_no_rank_gets_a_guess() -> None:
    r = result(fact("eight-ranks-and-the-router-healthy", "router_workers error HTTPError"))
    assert [row.router_state for row in r.ranks] == [None] * 8
    assert r.router is not None and r.router.workers == "not read: HTTPError"
    console = Console(record=True, width=220)
    st.print_results([r], console=console)
    text = console.export_text()
    assert "its worker list not read: HTTPError" in text
    assert "router" not in header(text)  # no column of dashes


def test_without_a_router_nothing_is_asked_and_no_column_is_shown() -> None:
    r = st.host_result("ct200", make_settings(server_host=HOST), fact("rank-2-stopped"))
    assert r.router is None and all(row.router_state is None for row in r.ranks)
    args = st.fact_args(make_settings(server_host=HOST), "ct200")
    assert args["router_list"] is None
    assert "router_list.py" not in ServingStatus().command(**args).get_raw_value()


def test_the_fact_reads_the_list_with_the_key_file_never_the_key() -> None:
    settings = make_settings(server_host=HOST, router=ROUTER)
    url = f"http://{HOST}:8000/workers"
    args = st.fact_args(settings, "ct200", url)
    assert args["router_list"] == url
    command = ServingStatus().command(**args).get_raw_value()
    assert "router_list.py" in command and url in command
    assert layout.CONTROL_PLANE_KEY_FILE in command and "Bearer" in command
    # The captured fixtures' arguments (no router list) still make their captured commands.
    captured = json.loads((FIXTURES / "eight-ranks-and-the-router-healthy.json").read_text())
    assert ServingStatus().command(**captured["arg"]).get_raw_value() == captured["command"]
    # The status's parser keeps the deploy's reading of the list.
    assert parse_status(LISTED).router_states[f"http://{HOST}:30002"] == "not_ready"
