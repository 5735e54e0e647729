"""The host scripts as the host gets them (operations/render/host_scripts.py): one self-contained
text each, the shared modules inlined, nothing of this project imported. Each bundle runs in a bare
interpreter (`python3 -I`, from an empty directory), and the staging script also inline as the
ModelStaging fact sends it, within the kernel's limit on one argument."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra.api.command import StringCommand
from pyinfra.connectors.util import make_unix_command

from operations.facts.model import ModelStaging, script_text
from operations.render import host_scripts

FILES = host_scripts.FILES
# Every script the deploy writes to a host or sends inline, and what it prints for --help.
SHIPPED = {
    "stage_model.py": "Stage a model directory into a tmpfs",
    "stage_source.py": None,  # the ModelSource fact's, inline; argv is the source only
    "smoke.py": "--service-user",
    "wait_healthy.py": "--service-user",
    "router_workers.py": "--router",
    "roll_batch.py": "--batch",
    "router_launch.py": None,
    "engine_check.py": None,
    "cuda_toolkit.py": None,
    "serving_probe.py": None,  # the ServingState fact's, inline; argv is the URLs only
    "router_list.py": None,  # the ServingState fact's, inline
    "gpu_open.py": None,  # the GpuNodeAccess fact's, inline in its probe unit
    "canary_compare.py": "--canary",
}
# The scripts made of modules beside them, and those modules.
PARTS = {
    "canary_compare.py": [
        "canary_args",
        "canary_rows",
        "hostsafe",
        "load_client",
        "load_runner",
        "program_main",
        "roll_steps",
        "roll_waiting",
        "smoke_answers",
        "throughput_guard",
    ],
    "smoke.py": ["hostsafe", "smoke_answers"],
    "wait_healthy.py": ["hostsafe", "polling"],
    "router_workers.py": ["polling", "rank_metrics"],
    "serving_probe.py": ["rank_metrics", "startup_phases"],
    "roll_batch.py": ["roll_steps", "roll_waiting"],
    "stage_model.py": ["stage_manifest", "stage_tree", "stage_copy", "stage_run"],
    "stage_source.py": ["stage_manifest"],
    "throughput.py": [
        "hostsafe",
        "load_client",
        "load_runner",
        "program_main",
        "throughput_args",
        "throughput_guard",
    ],
}


def imports_of(text: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
    return found


@pytest.mark.parametrize("main", sorted(SHIPPED))
def test_each_bundle_imports_the_standard_library_only(main: str) -> None:
    text = host_scripts.script_text(main)
    assert imports_of(text) <= set(sys.stdlib_module_names) | {"__future__"}, main


@pytest.mark.integration
@pytest.mark.parametrize("main", [m for m, said in SHIPPED.items() if said])
def test_each_bundle_runs_alone_in_a_bare_interpreter(main: str, tmp_path: Path) -> None:
    """Written as put_file writes it, run with no project on any path: `--help` works."""
    script = tmp_path / main
    script.write_text(host_scripts.script_text(main))
    empty = tmp_path / "cwd"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-I", str(script), "--help"],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    said = SHIPPED[main]
    assert proc.returncode == 0 and said is not None and said in proc.stdout, proc


def definitions(text: str) -> list[str]:
    """The source of each top-level function and class in a module's text."""
    tree = ast.parse(text)
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return [str(ast.get_source_segment(text, n)) for n in nodes]


@pytest.mark.parametrize("main", sorted(PARTS))
def test_the_host_gets_each_shared_module_once(main: str) -> None:
    """The one copy of each part (the masking and the listener check, the staging script's
    jobs) reaches the script's host text, once; the script's own file imports it."""
    text = host_scripts.script_text(main)
    own = (FILES / main).read_text()
    for part in PARTS[main]:
        assert f"operations/programs/{part}.py, inlined" in text
        assert f"from operations.programs.{part} import" in own
        for definition in definitions((FILES / f"{part}.py").read_text()):
            assert text.count(definition) == 1, (part, definition[:60])
            assert definition not in own


def test_the_controller_masks_with_the_same_code() -> None:
    from operations import redact
    from operations.programs import hostsafe

    assert redact.mask_journal is hostsafe.mask_journal
    smoke = host_scripts.load("smoke.py")
    line = "server_args=ServerArgs(api_key='sk-1', url='https://u:p@h/x?token=t')"
    assert smoke.mask_journal(line) == redact.mask_journal(line)


def runtime_imports(text: str) -> set[str]:
    """The modules a text imports when it runs: those under `if TYPE_CHECKING:` aside."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(imports_of(ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(text))
    return found


def test_the_model_source_script_imports_typing_for_the_checker_only() -> None:
    """The ModelSource fact runs with every deploy, and importing typing costs it more than its
    scan (programs/stage_manifest.py): the staging types it shares are the checker's alone."""
    text = host_scripts.script_text("stage_source.py")
    assert "typing" in imports_of(text)  # the checker's: under TYPE_CHECKING
    assert "typing" not in runtime_imports(text)
    sample = "if TYPE_CHECKING:\n    import typing\nelse:\n    import os\ndef f():\n    import re\n"
    assert runtime_imports(sample) == {"os", "re"}


def test_the_inline_staging_script_fits_in_one_argument() -> None:
    """The fact sends the script as one argument of `python3 -c`, inside pyinfra's `sh -c`
    (and sudo's): over SSH the whole command is one string for the remote shell, and Linux
    takes no single argument over MAX_ARG_STRLEN (128 KiB). Worst case: every option set."""
    fact = ModelStaging()
    keep = [f"hf-{i:040d}" for i in range(16)]
    command = fact.command(
        "/var/cache/sglang-models/hf/" + "x" * 200,
        "/dev/shm",
        "s" * 100,
        "full",
        key="hf-" + "f" * 40,
        keep=keep,
    )
    wrapped = StringCommand(
        *("if", "command", "-v", fact.requires_command(), ">/dev/null", "2>&1;", "then"),
        *("(", command, ");", "else", "echo", "'missing';", "fi"),
    )
    for sudo in (False, True):
        raw = make_unix_command(wrapped, _sudo=sudo).get_raw_value()
        size = len(raw.encode()) + 1  # the argument's NUL
        assert size < host_scripts.ARG_STRLEN_MAX, (sudo, size)
    # And room to grow: the script itself stays well under half of it.
    assert len(script_text().encode()) < host_scripts.ARG_STRLEN_MAX // 2


@pytest.mark.integration
def test_the_inline_staging_script_runs_as_the_fact_sends_it(tmp_path: Path) -> None:
    command = ModelStaging().command(str(tmp_path / "none"), str(tmp_path), "m").get_raw_value()
    proc = subprocess.run(
        ["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert '"error": "model source' in proc.stdout.splitlines()[-1]


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(text)
    return path


def test_a_name_two_parts_define_differently_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "def helper() -> int:\n    return 1\n")
    write(tmp_path, "b.py", "def helper() -> int:\n    return 2\n")
    main = write(
        tmp_path,
        "main.py",
        "from operations.programs.a import helper\nfrom operations.programs.b import helper\n",
    )
    with pytest.raises(host_scripts.BundleError, match="'helper'"):
        host_scripts.bundle(main, tmp_path)


def test_a_name_its_module_does_not_define_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "import os\n\nX = 1\n")
    main = write(tmp_path, "main.py", "from operations.programs.a import Y\n")
    with pytest.raises(host_scripts.BundleError, match="does not define Y"):
        host_scripts.bundle(main, tmp_path)


def test_an_import_cycle_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "from operations.programs.b import B\n\nA = 1\n")
    write(tmp_path, "b.py", "from operations.programs.a import A\n\nB = 2\n")
    main = write(tmp_path, "main.py", "from operations.programs.a import A\n")
    with pytest.raises(host_scripts.BundleError, match="a cycle"):
        host_scripts.bundle(main, tmp_path)


@pytest.mark.integration
def test_each_module_is_inlined_once_where_it_is_first_imported(tmp_path: Path) -> None:
    write(tmp_path, "a.py", '"""A."""\n\nfrom __future__ import annotations\n\nA = 1\n')
    write(tmp_path, "b.py", "from operations.programs.a import A\n\nB = A + 1\n")
    main = write(
        tmp_path,
        "main.py",
        '"""Main."""\n\nfrom __future__ import annotations\n\n'
        "from operations.programs.b import B\nfrom operations.programs.a import A\n\n"
        "print(A, B, __doc__)\n",
    )
    text = host_scripts.bundle(main, tmp_path)
    assert text.count("A = 1") == 1 and text.index("A = 1") < text.index("B = A + 1")
    proc = subprocess.run(
        [sys.executable, "-I", "-c", text], capture_output=True, text=True, check=True
    )
    assert proc.stdout == "1 2 Main.\n"


@pytest.fixture
def files_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """host_scripts over a copy of operations/programs, with empty in-process caches."""
    copy = tmp_path / "files"
    copy.mkdir()
    for path in FILES.glob("*.py"):
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(host_scripts, "FILES", copy)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    fresh()
    yield copy
    fresh()


def fresh() -> None:
    """As a new process starts: nothing bundled or read yet."""
    host_scripts.script_text.cache_clear()
    host_scripts._cached_bundles.cache_clear()


def test_a_second_run_reads_the_bundles_it_cached(
    files_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = host_scripts.script_text("smoke.py")
    assert list((files_copy / "__pycache__").glob("host-scripts-*.json"))

    def no_bundling(*args: object) -> str:
        raise AssertionError("bundled again although nothing changed")

    fresh()
    monkeypatch.setattr(host_scripts, "bundle", no_bundling)
    assert host_scripts.script_text("smoke.py") == first


@pytest.mark.parametrize("changed", ["hostsafe.py", "router_workers.py"])
def test_a_change_to_any_script_or_part_bundles_afresh(files_copy: Path, changed: str) -> None:
    """A part the script inlines, or any other file beside it: the cache is never stale."""
    host_scripts.script_text("smoke.py")
    (old,) = (files_copy / "__pycache__").glob("host-scripts-*.json")
    with (files_copy / changed).open("a") as f:
        f.write("\nCHANGED_HERE = 1\n")
    fresh()
    text = host_scripts.script_text("smoke.py")
    assert ("CHANGED_HERE = 1" in text) == (changed == "hostsafe.py")
    (new,) = (files_copy / "__pycache__").glob("host-scripts-*.json")
    assert new != old and not old.exists()


def test_no_cache_is_written_where_python_writes_no_bytecode(
    files_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert "def mask_journal" in host_scripts.script_text("smoke.py")
    assert not (files_copy / "__pycache__").exists()
