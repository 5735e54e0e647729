"""The plan only decides (issue 36): host_plan.decide reads no file, draws no random number and
asks nothing. The settings loader reads the key files once (operations/settings/
controller_files.py), runtime/gather.py asks the host and the controller, and a generated key is
made by the step that writes it (steps/host_files.put_planned)."""

from __future__ import annotations

import ast
import builtins
import io
import os
import secrets
from pathlib import Path
from typing import Any, NoReturn

import pytest

from operations import kb, layout
from operations.facts.serve import Serving
from operations.plan.host_plan import HostReport, decide
from operations.settings import Layer, Settings, load
from tests.unit.builders import BASE, make_settings
from tests.unit.test_host_report import gathered, staging

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "operations" / "plan"
KEY = "sk-read-once-by-the-loader"
CONTROL_KEY = "cp-key-of-the-controller-0123456789"

# What reads a file, lists a directory, reads the environment or draws a random number.
FORBIDDEN_MODULES = {"random", "secrets", "uuid", "pyinfra", "subprocess", "operations.facts.once"}
FORBIDDEN_CALLS = {"open", "input", "exec", "eval"}
FORBIDDEN_METHODS = {
    *("read_text", "read_bytes", "open", "urandom", "getrandom", "token_urlsafe", "token_hex"),
    *("scandir", "listdir", "walk", "iterdir", "glob", "rglob", "getenv", "getcwd"),
    *("exists", "isdir", "isfile", "is_dir", "is_file", "getsize", "stat", "lstat", "cwd"),
    *("get_fact", "gathered", "together"),
}
FORBIDDEN_ATTRIBUTES = {"environ"}


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES):
                found.append(f"{where}: imports {name}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"{where}: imports os.{a.name}" for a in node.names if a.name != "path"]
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
            found.append(f"{where}: calls {func.id}()")
        if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_METHODS:
            found.append(f"{where}: calls .{func.attr}()")
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{where}: uses .{node.attr}")
    return found


def test_the_plan_package_imports_and_calls_nothing_that_reads_or_draws() -> None:
    modules = sorted(PLAN.rglob("*.py"))
    assert len(modules) > 20, modules
    found = [line for path in modules for line in _offences(path)]
    assert found == [], "operations/plan/ reads, asks or draws:\n" + "\n".join(found)


def test_the_ast_check_sees_each_kind_of_offence(tmp_path: Path) -> None:
    """The check above is not vacuous: each kind of read, ask or draw is named."""
    sample = PLAN / "_offences_sample.py"
    text = (
        "import secrets\nfrom random import choice\nfrom os import urandom\n"
        "from pyinfra.api.host import Host\nimport os\n"
        "a = open('x')\nb = Path('x').read_text()\nc = os.environ\nd = os.scandir('/')\n"
    )
    sample.write_text(text)
    try:
        found = _offences(sample)
    finally:
        sample.unlink()
    kinds = [line.split(": ", 1)[1] for line in found]
    assert kinds == [
        "imports secrets",
        "imports random",
        "imports os.urandom",
        "imports pyinfra.api.host",
        "calls open()",
        "calls .read_text()",
        "uses .environ",
        "calls .scandir()",
    ], kinds


def _settings(tmp_path: Path) -> Settings:
    api_key = tmp_path / "api-key"
    api_key.write_text(KEY + "\n")
    control = tmp_path / "control-plane-key"
    control.write_text(CONTROL_KEY + "\n")
    router = {"host": "ct200", "port": 8000, "control_plane_key_file": str(control)}
    return make_settings(router=router, api_key_file=str(api_key))


def _decide(settings: Settings, serving: Serving) -> HostReport:
    return decide("ct200", settings, gathered(serving, staging(None)), kb.load(), None)


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise AssertionError("the plan read a file or drew a random number")


@pytest.mark.parametrize("keys", [True, False], ids=["controller-keys", "made-key"])
def test_decide_twice_on_the_same_inputs_gives_equal_plans(tmp_path: Path, keys: bool) -> None:
    if keys:
        settings = _settings(tmp_path)
    else:  # the key a run makes beside the engine locks, before the loader reads it
        data = {**BASE, "router": {"host": "ct200"}, "engine_lock_dir": str(tmp_path)}
        settings = load("ct200", [Layer("test", data)], make_key=True)
    first = _decide(settings, Serving())
    second = _decide(settings, Serving())
    assert first.errors == []
    assert first == second
    assert first.to_json() == second.to_json()
    assert first.serve is not None and first.serve.control_plane_key is not None
    # The plan writes the key the loader read, whichever file held it.
    assert first.serve.control_plane_key.content == (
        Path(settings.control_plane_key_file or "").read_bytes()
    )


def test_decide_reads_no_file_and_draws_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the product's own data is loaded (the knowledge base, the bundled programs), a plan
    is decided with every file read and every random draw refused; the key files the settings
    name were read by the loader, and removing them changes nothing."""
    settings = _settings(tmp_path)
    wanted = _decide(settings, Serving())
    for name in ("api-key", "control-plane-key"):
        (tmp_path / name).unlink()
    facts, knowledge = gathered(Serving(), staging(None)), kb.load()
    monkeypatch.setattr(builtins, "open", _refuse)
    monkeypatch.setattr(io, "open", _refuse)
    monkeypatch.setattr(os, "urandom", _refuse)
    monkeypatch.setattr(secrets, "token_bytes", _refuse)
    monkeypatch.setattr(secrets, "token_urlsafe", _refuse)
    found = decide("ct200", settings, facts, knowledge, None)
    monkeypatch.undo()
    assert found == wanted
    serve = found.serve
    assert serve is not None and serve.secret is not None and KEY in serve.secret
    assert serve.control_plane_key is not None
    assert serve.control_plane_key.content == (CONTROL_KEY + "\n").encode()


def test_the_keys_the_loader_read_are_never_shown(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    report = _decide(settings, Serving())
    shown = repr(report.to_json()) + repr(settings) + repr(settings.controller_files)
    assert KEY not in shown and CONTROL_KEY not in shown
    assert report.serve is not None and report.serve.secret is not None


def test_a_key_file_the_loader_could_not_read_is_an_error_not_a_removal(tmp_path: Path) -> None:
    """Before, the plan read the file itself (a traceback when it had gone); a plan without
    the key must not remove the host's key file as if none were configured."""
    settings = make_settings(api_key_file=str(tmp_path / "no-such-key"))
    files = {layout.SECRETS_FILE: "ab" * 32}
    report = _decide(settings, Serving(files=files))
    assert report.serve is not None
    assert not report.serve.remove_secret and report.serve.secret is None
    assert any("api_key_file" in e for e in report.errors), report.errors
