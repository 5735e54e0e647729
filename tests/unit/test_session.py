"""One inventory session (operations/runtime/inventory.py): every command that reads an inventory
says the same one line for the same bad inventory, and none loads, checks or connects an
inventory any other way."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from operations.cli import engine_lock as lock
from operations.cli import plan, releases
from operations.cli.status import cli as status_cli
from operations.runtime.inventory import open_session

ROOT = Path(__file__).resolve().parents[2]
DEMO = "inventory/demo.py"
MISTYPED = "sglang_versoin=0.5.11"

# Each command's main and its exit status for an inventory it cannot read (status: 2, "the
# command itself could not run", docs/reference/status.md; the others 1).
COMMANDS: dict[str, tuple[Callable[[list[str]], int], list[str], int]] = {
    "plan": (plan.main, [], 1),
    "status": (status_cli.main, [], 2),
    "releases": (releases.main, [], 1),
    "lock": (lock.main, ["--python", "3.11"], 1),
}


def bad_inventory(tmp_path: Path, case: str) -> tuple[str, str]:
    """(path, the one line every command prints for it)."""
    path = tmp_path / "inventory.py"
    if case == "missing":
        return str(path), f"error: inventory '{path}': no such file"
    if case == "syntax":
        path.write_text("hosts = [(\n")
        return str(path), (
            f"error: inventory '{path}' could not be loaded: SyntaxError: '(' was never closed "
            "(inventory.py, line 1)"
        )
    if case == "raises":
        path.write_text("import os\nhosts = [(os.environ['NO_SUCH_VARIABLE_HERE'], {})]\n")
        return str(path), (
            f"error: inventory '{path}' could not be loaded: KeyError: 'NO_SUCH_VARIABLE_HERE'"
        )
    assert case == "no hosts"
    path.write_text("x = 1\n")
    return str(path), (
        f"error: inventory '{path}' names no hosts; accepted: a module with a list of hosts, "
        "e.g. ct200 = [('ct200', {...})] (inventory/ct200.py)"
    )


@pytest.mark.parametrize("case", ["missing", "syntax", "raises", "no hosts"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_says_one_line_for_an_inventory_it_cannot_read(
    command: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main, extra, status = COMMANDS[command]
    path, line = bad_inventory(tmp_path, case)
    assert main([path, *extra]) == status
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [line], (out, err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_data_argument_is_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    main, extra, status = COMMANDS[command]
    assert main([DEMO, *extra, "--data", "no-equals-sign"]) == status
    _, err = capsys.readouterr()
    assert err.splitlines() == ["error: --data 'no-equals-sign': expected KEY=VALUE"]


def the_settings_line(inventory: str) -> str:
    """What the settings module says of the mistyped key: the line every command shows (and
    deploy.py and pve.py, under pyinfra's CLI: tests/unit/test_operator_errors.py)."""
    session = open_session(inventory, {"sglang_versoin": "0.5.11"})
    (line,) = session.all_problems
    assert line.startswith("@fake/ct200: unknown setting 'sglang_versoin'"), line
    assert "did you mean 'sglang_version'?" in line
    return line


@pytest.fixture
def one_host(tmp_path: Path) -> str:
    """An inventory of the demo's host without its answers: a settings check contacts no host
    (and loading it starts no process)."""
    path = tmp_path / "one.py"
    path.write_text("hosts = [('@fake/ct200', {'fake_delay': 0, 'fake_delay_jitter': 0})]\n")
    return str(path)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_shows_a_bad_key_as_the_settings_modules_line(
    command: str, one_host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = the_settings_line(one_host)
    main, extra, _ = COMMANDS[command]
    json_flag = ["--json"] if command == "status" else []
    # A host whose settings do not pass is not asked: exit 1 in each.
    assert main([one_host, *extra, *json_flag, "--data", MISTYPED]) == 1
    out, err = capsys.readouterr()
    if command == "status":
        (host,) = json.loads(out)["hosts"].values()
        assert host["reachable"] is False
        assert host["error"] == "settings: " + line.removeprefix("@fake/ct200: ")
        return
    shown = {"plan": "error: ", "lock": "error: ", "releases": "  not asked: "}[command]
    assert f"{shown}{line}" in (out + err).splitlines(), out + err


def test_the_two_container_inventory_loads_with_the_router_on_ct200(tmp_path: Path) -> None:
    """No key file made by hand: the session makes the router's control-plane key beside the
    engine locks, once, and both hosts read it."""
    session = open_session("inventory/two.py", {"engine_lock_dir": str(tmp_path)})
    assert session.problems == {}
    assert sorted(session.settings) == ["ct200", "ct201"]
    assert {s.router.host for s in session.settings.values() if s.router} == {"ct200"}
    key = (tmp_path / "router-control-plane.key").read_text().strip()
    read = [s.controller_files.control_plane_key for s in session.settings.values()]
    assert [(r.key, r.made) for r in read if r is not None] == [(key, True), (key, False)]


# -- nothing else loads an inventory ------------------------------------------------------------

SESSION = "operations/runtime/inventory.py"
# pyinfra's inventory loading and connecting, and the settings check of a whole inventory.
SESSION_ONLY = {"make_inventory", "connect_all", "load_inventory", "ctx_inventory"}


def product_files() -> list[Path]:
    files = [*ROOT.glob("*.py"), *ROOT.glob("inventory/**/*.py"), *ROOT.glob("group_data/*.py")]
    for tree in ("operations", "scripts", "bench"):
        files += (ROOT / tree).rglob("*.py")
    return sorted(files)


def session_calls(path: Path) -> set[str]:
    """The session-only names `path` imports, calls or reads as an attribute."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names if a.name in SESSION_ONLY}
            if node.module == "pyinfra_cli.inventory":
                found.add(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in SESSION_ONLY:
            found.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in SESSION_ONLY:
            found.add(node.id)
    return found


def test_only_the_session_loads_checks_and_connects_an_inventory() -> None:
    files = product_files()
    assert ROOT / SESSION in files and ROOT / "operations" / "cli" / "plan.py" in files
    assert session_calls(ROOT / SESSION) >= {"make_inventory", "connect_all", "load_inventory"}
    elsewhere = {
        str(p.relative_to(ROOT)): names
        for p in files
        if p != ROOT / SESSION
        and p != ROOT / "operations" / "settings" / "__init__.py"  # where load_inventory is defined
        and (names := session_calls(p))
    }
    assert elsewhere == {}, f"load and connect an inventory through {SESSION}: {elsewhere}"


def test_the_check_sees_a_second_session() -> None:
    """The check above fails on a module that loads an inventory itself."""
    tree = ast.parse(
        "from pyinfra_cli.inventory import make_inventory\n"
        "from pyinfra.api import connect\n"
        "connect.connect_all(state)\n"
    )
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "connect_all" in names & SESSION_ONLY


def test_hosts_with_bad_settings_are_not_contacted(tmp_path: Path) -> None:
    """One host's mistake is its own: the other is connected and visited; the bad one is
    neither (its lines are the settings module's, grouped under its name)."""
    inventory = tmp_path / "two.py"
    inventory.write_text(
        "FAKE = {'fake_delay': 0, 'fake_delay_jitter': 0}\n"
        "hosts = [\n"
        "    ('@fake/ct200', FAKE),\n"
        "    ('@fake/ct201', {**FAKE, 'dp_size': 'eight', 'sglang_versoin': '0.5.11'}),\n"
        "]\n"
    )
    session = open_session(str(inventory), {})
    assert list(session.settings) == ["@fake/ct200"]
    (problems,) = session.problems.values()
    assert len(problems) == 2 and all(p.startswith("@fake/ct201: ") for p in problems)
    session.connect()
    visits = list(session.each())
    assert [(v.name, v.settings is not None, len(v.problems)) for v in visits] == [
        ("@fake/ct200", True, 0),
        ("@fake/ct201", False, 2),
    ]
    bad = next(h for h in session.hosts if h.name == "@fake/ct201")
    assert not bad.connected
