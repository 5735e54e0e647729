"""Every refusal says why and exits non-zero, and no user mistake or unreachable host ends in a
traceback: each case through the entry point a user types (the plan command, the pyinfra CLI
with deploy.py or pve.py, the status command), against the simulated CT200 (@fake)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from functools import cache
from pathlib import Path

import pytest

from operations.cli.api_key import make_key
from operations.facts.host import Model, parse_model
from operations.plan.resolver import resolve
from operations.steps.serve import ranks_label
from tests.unit.builders import QWEN36, facts, make_settings

pytestmark = pytest.mark.integration  # runs pyinfra, the plan and status commands

# Every command runs in its own process, never in this one: loading an inventory imports
# pyinfra_cli, whose import runs gevent's monkey.patch_all(), and every later test of the file
# would then start its processes with gevent's subprocess in a process patched halfway through
# (the in-process inventory checks are in tests/unit/test_session.py).

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEMO = "inventory/demo.py"


def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr), stdin closed as in cron or CI."""
    result = subprocess.run(
        list(argv),
        cwd=ROOT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=180,
        env=env,
    )
    out = result.stdout + result.stderr
    assert "Traceback" not in out and "pyinfra error in" not in out, out
    return result.returncode, result.stdout, result.stderr


def plan(*args: str, inventory: str = DEMO, env: dict[str, str] | None = None) -> tuple[int, str]:
    rc, out, err = run(sys.executable, "-m", "operations.plan", inventory, *args, env=env)
    return rc, out + err


def deploy(*args: str, inventory: str = DEMO, deploy_file: str = "deploy.py") -> tuple[int, str]:
    """The pyinfra CLI without -y: a refusal must neither prompt nor end in EOFError."""
    rc, out, err = run(str(PYINFRA), inventory, deploy_file, *args)
    assert "Press enter" not in out + err, out + err
    return rc, out + err


def unfolded(panel: str) -> str:
    """A panel's text with the box and the wrapping removed."""
    text = "".join(c if c not in "│╭╮╰╯─" else " " for c in panel)
    return " ".join(text.split())


def data(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--data", p)]


ROUTER_30003 = 'router={"host": "@fake/ct200", "port": 30003}'
COLLISION = "router port 30003 (set in --data on the command line) collides with rank 3"


def test_the_routers_refusal_is_in_the_panel_with_its_reason(tmp_path: Path) -> None:
    rc, out = plan(*data(ROUTER_30003, f"engine_lock_dir={tmp_path}"))
    assert rc == 1
    assert "@fake/ct200: refused" in out and COLLISION in unfolded(out), out


def test_a_valid_router_plan_is_shown(tmp_path: Path) -> None:
    router = 'router={"host": "@fake/ct200", "port": 8000}'
    wide = {"COLUMNS": "300"}  # the temporary path on one line
    rc, out = plan(*data(router, f"engine_lock_dir={tmp_path}"), env=wide)
    assert rc == 0, out
    text = unfolded(out)
    assert "router: smg 1.13.0 on 0.0.0.0:8000, policy cache_aware, 8 worker(s)" in text
    assert "--worker-urls http://127.0.0.1:30000" in text and "--port 8000" in text
    # The pairing with the SGLang release: smg's CI never ran 0.5.11 (the knowledge base).
    assert "smg 1.13.0, unproven with sglang 0.5.11" in text
    # The control-plane key, made beside the engine locks by this first run: its path only.
    key_file = tmp_path / "router-control-plane.key"
    assert f"router key {key_file} on the controller (made by this run)" in text
    assert key_file.read_text().strip() not in out
    rc, out = plan(*data(router, f"engine_lock_dir={tmp_path}"), env=wide)
    assert f"router key {key_file} on the controller (read)" in unfolded(out), out


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("sglang_version=0.5.99", "'0.5.99' (set in --data on the command line) is not in the"),
        ("dp_size=9", "9"),
        ("attention_backend=fa3", "backends that run here: flashinfer, triton"),
        (ROUTER_30003, COLLISION),
    ],
)
@pytest.mark.parametrize("dry", [True, False], ids=["dry", "real"])
def test_a_refused_deploy_exits_1_without_a_change_or_a_prompt(
    setting: str, reason: str, dry: bool, tmp_path: Path
) -> None:
    # A real run: the demo host without its `_demo` mark (deploy.py refuses a real run on it).
    inventory = DEMO if dry else not_a_demo(tmp_path)
    # A router's control-plane key is made beside the engine locks: here, not in the project.
    locks = f"engine_lock_dir={tmp_path / 'locks'}"
    rc, out = deploy(*data(setting, locks), *(["--dry"] if dry else []), inventory=inventory)
    assert rc == 1, out
    # The refusal's lines wrap at the terminal's width (runtime/host_lines.py): read unwrapped.
    assert "[@fake/ct200] refused:" in out and reason in unfolded(out), out
    # No operation for the refusal: nothing in a change table, nothing run.
    assert "Refuse" not in out and "Detected changes" not in out, out
    assert "Beginning operation run" not in out, out


def not_a_demo(tmp_path: Path) -> str:
    """inventory/demo.py's host, unmarked: what a real run on a host answering so would do."""
    inventory = tmp_path / "real.py"
    inventory.write_text(
        "from inventory import demo as _demo\n"
        "ct200 = [(n, {k: v for k, v in d.items() if k != '_demo'}) for n, d in _demo.ct200]\n"
    )
    return str(inventory)


def two_hosts(tmp_path: Path) -> str:
    inventory = tmp_path / "two.py"
    inventory.write_text(
        textwrap.dedent(
            """
            from tests.doubles.ct200 import fake_responses
            FAKE = {"fake_delay": 0, "fake_delay_jitter": 0}
            hosts = [
                ("@fake/ct200", {"fake_responses": fake_responses("rtx-pro-6000-x8"), **FAKE}),
                ("@fake/ct201", {"fake_responses": fake_responses("rtx-pro-6000-x8"), **FAKE,
                                 "attention_backend": "fa3"}),
            ]
            """
        )
    )
    return str(inventory)


def test_one_refused_host_of_two_fails_the_dry_run_and_is_no_change(tmp_path: Path) -> None:
    rc, out = deploy("--dry", inventory=two_hosts(tmp_path))
    assert rc == 1, out
    assert "[@fake/ct201] refused: 1 problem(s)" in out, out
    _, _, table = out.partition("--> Detected changes:")
    assert "@fake/ct200" in table and "@fake/ct201" not in table, table


def test_a_mistyped_key_is_one_line_through_pyinfra() -> None:
    rc, out = deploy("--dry", *data("sglang_versoin=0.5.11"))
    assert rc == 1
    (line,) = [ln.strip() for ln in out.splitlines() if "sglang_versoin" in ln]
    assert line.startswith("@fake/ct200: unknown setting 'sglang_versoin'"), line
    assert "did you mean 'sglang_version'?" in line


def test_a_missing_wheelhouse_is_refused_by_the_plan_and_the_deploy() -> None:
    rc, out = plan(*data("wheelhouse=./nope"))
    assert rc == 1
    (line,) = [ln for ln in out.splitlines() if "wheelhouse" in ln]
    assert line.startswith("error: @fake/ct200: wheelhouse = './nope' (set in --data")
    assert f"{ROOT}/nope does not exist on the controller" in line
    assert "scripts/fill_wheelhouse.py" in line
    rc, out = deploy("--dry", *data("wheelhouse=./nope"))
    assert rc == 1 and "FileNotFoundError" not in out
    assert "wheelhouse = './nope'" in out and "does not exist on the controller" in out


def without_address(tmp_path: Path, *variables: str) -> dict[str, str]:
    """The environment of a user who set none of `variables` and has no ~/.ssh/config."""
    env = {k: v for k, v in os.environ.items() if k not in variables}
    env["HOME"] = str(tmp_path)
    return env


def test_a_missing_api_key_file_is_refused_naming_how_to_make_it(tmp_path: Path) -> None:
    """inventory/ct200.py names locks/api.key (README's quick path makes it, step 3)."""
    env = without_address(tmp_path, "CT200_HOST", "CT200_USER")
    env["SGLANG_API_KEY_FILE"] = str(tmp_path / "api.key")
    rc, out = plan(inventory="inventory/ct200.py", env=env)
    assert rc == 1 and "Traceback" not in out
    (line,) = [ln for ln in unfolded(out).splitlines() if "api_key_file" in ln]
    assert "no such file on the controller" in line, line
    assert f"`make api-key API_KEY_FILE={tmp_path / 'api.key'}` makes one" in line, line


def test_plan_and_status_without_ct200_host_say_what_to_set(tmp_path: Path) -> None:
    env = without_address(tmp_path, "CT200_HOST", "CT200_USER")
    # The key README's quick path makes first (make api-key), so the host is what is missing.
    env["SGLANG_API_KEY_FILE"] = str(tmp_path / "api.key")
    make_key(tmp_path / "api.key")
    rc, out = plan(inventory="inventory/ct200.py", env=env)
    assert rc == 1
    assert "ct200: unreachable" in out, out
    assert "CT200_HOST is not set, so 'ct200' was tried: export CT200_HOST=" in unfolded(out)
    rc, stdout, _ = run(
        sys.executable, "-m", "operations.status", "inventory/ct200.py", "--json", env=env
    )
    assert rc == 1
    (host,) = json.loads(stdout)["hosts"].values()
    assert host["reachable"] is False and "export CT200_HOST=" in host["error"], host


def test_the_deploys_without_an_address_say_what_to_set(tmp_path: Path) -> None:
    for inventory, deploy_file, variable in [
        ("inventory/ct200.py", "deploy.py", "CT200_HOST"),
        ("inventory/pve.py", "pve.py", "PVE_HOST"),
    ]:
        env = without_address(tmp_path, variable)
        rc, out, err = run(str(PYINFRA), inventory, deploy_file, "--dry", env=env)
        assert rc != 0
        assert f"{variable} is not set: connecting to" in out + err, out + err


def test_an_inventory_that_does_not_load_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("hosts = [(\n")
    rc, out = plan(inventory=str(broken))
    assert rc == 1
    assert out.strip().splitlines() == [
        f"error: inventory '{broken}' could not be loaded: SyntaxError: '(' was never closed "
        "(broken.py, line 1)"
    ]


def test_a_non_numeric_ctid_is_a_settings_error(tmp_path: Path) -> None:
    env = {**os.environ, "CT200_CTID": "abc", "HOME": str(tmp_path)}
    rc, out = plan(inventory="inventory/pve.py", env=env)
    assert rc == 1
    assert "pve_ctid = 'abc'" in out, out


# -- the resolver's side, from facts alone ---------------------------------------------------


def test_a_refused_backend_names_only_backends_that_run_here() -> None:
    (error,) = resolve(make_settings(attention_backend="fa3"), facts()).errors
    assert error.endswith("; backends that run here: flashinfer, triton (or auto)"), error
    assert "fa4" not in error and "trtllm_mha" not in error


def test_an_unknown_release_is_one_error() -> None:
    (error,) = resolve(make_settings(sglang_version="0.5.99"), facts()).errors
    assert "'0.5.99'" in error and "is not in the knowledge base" in error


BF16 = QWEN36
FP8 = Model(
    exists=True,
    size_bytes=30_000_000_000,
    architecture="Qwen3_5ForConditionalGeneration",
    quantization="fp8",
)


def test_bf16_weights_under_the_fp8_name_are_refused_with_both_sides() -> None:
    settings = make_settings(model_name="Qwen/Qwen3.6-27B-FP8", sglang_version="0.5.11")
    (error,) = resolve(settings, facts(model=BF16)).errors
    assert "names Qwen3_5ForConditionalGeneration weights quantized fp8, 29 GB" in error
    assert "holds 50.1 GiB of Qwen3_5ForConditionalGeneration weights with no quantization" in error
    assert "set model_name to Qwen/Qwen3.6-27B (what these weights are)" in error


def test_fp8_weights_under_the_bf16_name_are_refused() -> None:
    (error,) = resolve(make_settings(), facts(model=FP8)).errors
    assert "names Qwen3_5ForConditionalGeneration weights with no quantization, 54 GB" in error
    assert "quantized fp8" in error and "set model_name to Qwen/Qwen3.6-27B-FP8" in error


def test_weights_that_match_their_name_pass() -> None:
    fp8 = make_settings(model_name="Qwen/Qwen3.6-27B-FP8", sglang_version="0.5.11")
    assert resolve(fp8, facts(model=FP8)).errors == []
    assert resolve(make_settings(), facts(model=BF16)).errors == []


def test_the_model_fact_reads_the_quantization_method() -> None:
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    lines = ["exists", "30000000000", "@@config.json", json.dumps(config)]
    assert parse_model(lines).quantization == "fp8"
    del config["quantization_config"]
    assert parse_model(["exists", "1", "@@config.json", json.dumps(config)]).quantization is None


# -- what the operator reads ------------------------------------------------------------------


def test_pyinfras_change_table_fits_80_columns() -> None:
    """Operation names stay short: a deploy starting 8 ranks, as `make demo` shows it."""
    rc, out = deploy("--dry")
    assert rc == 0, out
    _, _, table = out.partition("--> Detected changes:")
    rows = [line.rstrip() for line in table.split("\n\n", 1)[0].splitlines() if line.strip()]
    assert any("Serve | start ranks 0-7" in row for row in rows), rows
    # One scheme: STEP | what, the step never repeated in the name (issue 30).
    names = [row.strip().split("  ")[0] for row in rows[1:]]
    steps = "Engine|Model|Serve|Smoke|Throughput|Record"
    assert all(re.match(rf"^({steps}) \| [^|]+$", n) for n in names), names
    assert not [n for n in names if re.match(r"^(\w+) \| \1:", n)], names
    # At 80 columns (make demo at a terminal) no row wraps: the longest name leaves room for
    # pyinfra's two count columns.
    assert max(len(row) for row in rows) <= 80, max(rows, key=len)


def test_ranks_in_an_operation_name() -> None:
    assert ranks_label([3]) == "sglang@3.service"
    assert ranks_label([2, 3]) == "sglang@2.service, sglang@3.service"
    assert ranks_label(list(range(8))) == "ranks 0-7"
    assert ranks_label([7, 0, 1, 2, 5]) == "ranks 0-2, 5, 7"


# -- the docs ---------------------------------------------------------------------------------

LINK = r"\]\((?!https?://|mailto:)([^)#\s]+)(?:#[^)\s]*)?\)"


def test_every_link_inside_the_repo_resolves_and_stays_inside() -> None:

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(LINK, doc.read_text()):
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT), f"{doc.name}: {target} leaves the repo"
            assert path.exists(), f"{doc.name}: {target} does not exist"


def test_every_doc_is_reachable_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name}" in readme, f"docs/{doc.name} is not linked from README.md"


def test_the_same_bad_key_is_the_same_line_in_the_plan_the_deploy_and_pve() -> None:
    """The settings module's line, as the plan prints it, is the line pyinfra's CLI logs for
    deploy.py and pve.py (the other commands: tests/unit/test_session.py)."""
    rc, out = plan(*data("sglang_versoin=0.5.11"))
    assert rc == 1
    (line,) = [ln.removeprefix("error: ") for ln in out.splitlines() if "sglang_versoin" in ln]
    assert line.startswith("@fake/ct200: unknown setting 'sglang_versoin'"), line
    # The pve demo's host is the node, named for it and its container (pve1/ct200).
    demos = [(DEMO, "deploy.py", "@fake/ct200"), ("inventory/pve_demo.py", "pve.py", "pve1/ct200")]
    for inventory, deploy_file, host in demos:
        rc, out = deploy(
            "--dry", *data("sglang_versoin=0.5.11"), inventory=inventory, deploy_file=deploy_file
        )
        assert rc == 1, out
        said = line.replace("@fake/ct200", host)
        assert said in [ln.strip() for ln in out.splitlines()], out


# -- the air-gap tools and the pipes -----------------------------------------------------------


@cache
def quick_path_key() -> str:
    """The API key README's quick path makes before anything else (`make api-key`), which
    inventory/ct200.py names through SGLANG_API_KEY_FILE."""
    path = Path(tempfile.mkdtemp(prefix="api-key-")) / "api.key"
    make_key(path)
    return str(path)


def lock(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    env = {**(env or os.environ), "SGLANG_API_KEY_FILE": quick_path_key()}
    rc, out, err = run(
        sys.executable, "-m", "operations.lock", "inventory/ct200.py", *args, env=env
    )
    return rc, out + err


@pytest.mark.parametrize(
    ("release", "texts"),
    [
        (
            "0.5.99",
            ["sglang_version '0.5.99'", "not in the knowledge base", "operations.releases"],
        ),
        ("0.5.23", ["cuda_lane 'cu128'", "has no cu128", "offers cu130"]),
    ],
)
def test_lock_refuses_what_the_plan_refuses_in_one_line(release: str, texts: list[str]) -> None:
    rc, out = lock("--python", "3.11", *data(f"sglang_version={release}"))
    assert rc == 1
    (line,) = out.splitlines()
    assert line.startswith("error: ct200: ") and all(t in line for t in texts), line
    assert "resolver should have refused" not in out


def test_lock_names_the_setting_of_an_index_it_cannot_reach(tmp_path: Path) -> None:
    """Every index on a closed loopback port: uv fails on the first it asks, and the line
    names the setting that points there."""
    closed = "http://127.0.0.1:9"
    rc, out = lock(
        "--python",
        "3.11",
        *data(
            f"torch_index_url={closed}/whl/{{lane}}",
            f"kernel_index_url={closed}/k/{{lane}}",
            f"flashinfer_index_url={closed}/fi/{{lane}}",
            f"package_index_url={closed}/simple",
            f"engine_lock_dir={tmp_path / 'locks'}",
        ),
        env={**os.environ, "UV_HTTP_RETRIES": "0", "UV_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert rc == 1
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out
    keys = ("kernel_index_url", "torch_index_url", "package_index_url", "flashinfer_index_url")
    assert any(f"{closed}/" in errors[0] and f"({key})" in errors[0] for key in keys), out
    assert "uv: " in out  # uv's own lines, shown as they came
    # No lock written (the router's control-plane key inventory/ct200.py's gateway needs is made
    # beside where locks go, as by any first run).
    assert not list((tmp_path / "locks").glob("*.lock"))


def test_a_missing_interpreter_says_what_to_install() -> None:
    """uv's words (0.13.9, captured with no python3.12 on the controller's PATH)."""
    from operations import kb
    from operations.cli.engine_lock import uv_problem
    from operations.plan.engine_spec import engine_spec

    said = (
        "error: Failed to inspect Python interpreter from search path at "
        "`/root/.pyenv/shims/python3.12`\n  cause: Querying Python at "
        "`/root/.pyenv/shims/python3.12` failed with exit status exit status: 127"
    )
    settings = make_settings()
    spec = engine_spec(settings, kb.load(), "3.12")
    line = uv_problem(said, settings, spec)
    assert "no Python 3.12 on this controller" in line and "apt-get install python3.12" in line


def test_the_kernel_index_is_named_by_its_setting() -> None:
    """uv's words (0.13.9) for a kernel index on a closed port."""
    from operations import kb
    from operations.cli.engine_lock import uv_problem
    from operations.plan.engine_spec import engine_spec

    settings = make_settings(kernel_index_url="http://127.0.0.1:9/k/{lane}")
    spec = engine_spec(settings, kb.load(), "3.11")
    said = (
        "error: Request failed after 3 retries in 6.2s\n"
        "  cause: Failed to fetch: http://127.0.0.1:9/k/cu129/sglang-kernel/\n"
        "  cause: Connection refused (os error 111)"
    )
    assert uv_problem(said, settings, spec) == (
        "uv could not read http://127.0.0.1:9/k/cu129 (kernel_index_url): "
        "Connection refused (os error 111)"
    )


def test_flashinfers_index_is_named_by_its_setting() -> None:
    """uv's words (0.13.9, as for the kernel index) for FlashInfer's index on a closed port."""
    from operations import kb
    from operations.cli.engine_lock import uv_problem
    from operations.plan.engine_spec import engine_spec

    settings = make_settings(flashinfer_index_url="http://127.0.0.1:9/fi/{lane}")
    spec = engine_spec(settings, kb.load(), "3.11")
    said = (
        "error: Request failed after 3 retries in 6.2s\n"
        "  cause: Failed to fetch: http://127.0.0.1:9/fi/cu128/flashinfer-jit-cache/\n"
        "  cause: Connection refused (os error 111)"
    )
    assert uv_problem(said, settings, spec) == (
        "uv could not read http://127.0.0.1:9/fi/cu128 (flashinfer_index_url): "
        "Connection refused (os error 111)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["operations.plan", DEMO, "--json"],
        ["operations.plan", DEMO],
        ["operations.status", DEMO, "--json"],
        ["operations.status", DEMO],
        ["operations.releases", DEMO, "--json"],
        ["operations.releases", DEMO],
        ["operations.kb", "--help"],
    ],
)
def test_a_closed_pipe_is_quiet_and_changes_no_exit_status(argv: list[str]) -> None:
    """`... | head`: the reader has gone before the first write. Nothing on stderr, and the exit
    status is the one the command has with every line read (operations/cli/closed_pipe.py)."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    read_to_the_end = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    said = f"exit {result.returncode} (read to the end: {read_to_the_end.returncode})"
    assert result.stderr == "", result.stderr
    assert result.returncode == read_to_the_end.returncode, said


@pytest.mark.skipif(os.geteuid() != 0, reason="the listener binds as root: needs root")
def test_the_health_wait_says_each_rank_as_it_comes_and_the_slowest_on_timeout(
    tmp_path: Path,
) -> None:
    """wait_healthy.py as the host runs it: rank 0 answers (a line with the count), rank 1's
    port has no listener: on the deadline both waited-for units are named and the journal of
    the first still waited for (the slowest) is printed."""
    from tests.e2e.index import free_port
    from tests.unit.shipped import script_path
    from tests.unit.test_listeners import Listener

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\nprintf 'ActiveState=active\\nSubState=running\\nNRestarts=0\\n'\n"
    )
    # journalctl -u UNIT ...: the unit it was asked for, so the test sees whose tail it is.
    (bin_dir / "journalctl").write_text('#!/bin/sh\necho "journal tail of $2"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    rank = Listener(-1)
    silent = free_port()
    try:
        proc = subprocess.run(
            [
                *(sys.executable, str(script_path("wait_healthy.py")), "--timeout", "2"),
                *("--service-user", "root"),
                f"sglang@0.service=http://127.0.0.1:{rank.port}/health",
                f"sglang@1.service=http://127.0.0.1:{silent}/health",
                f"sglang@2.service=http://127.0.0.1:{silent}/health",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        rank.stop()
    assert proc.returncode == 1, proc
    assert "sglang@0.service: healthy after" in proc.stdout and ", 1 of 3" in proc.stdout
    assert (
        f"sglang@1.service: no 200 from http://127.0.0.1:{silent}/health within 2s (still "
        "waiting for 2 of 3: sglang@1.service, sglang@2.service)"
    ) in proc.stdout, proc.stdout
    assert "journal tail of sglang@1.service" in proc.stdout


def test_a_model_name_the_knowledge_base_does_not_know_is_warned_with_its_architecture() -> None:
    """Issue 30: Llama's name over Qwen's weights passes no more in silence; the plan shows
    the architecture config.json names (the compact view's model line too)."""
    rc, out = plan("--json", *data("model_name=meta-llama/Llama-3.1-8B"))
    assert rc == 0, out
    (warning,) = [
        w for w in json.loads(out)["hosts"]["@fake/ct200"]["warnings"] if "model_name" in w
    ]
    assert "'meta-llama/Llama-3.1-8B'" in warning and "not in the knowledge base" in warning
    assert "config.json names Qwen3_5ForConditionalGeneration" in warning
    rc, out = plan()
    assert "config.json: Qwen3_5ForConditionalGeneration" in unfolded(out)
    assert "not in the knowledge base" not in out


def test_the_e2e_harness_keys_operations_by_their_step_as_before() -> None:
    """Operation names no longer repeat their step (pyinfra prints `Engine | install`); the
    e2e tests still find them as `Engine: install`, a router's as `Router: ...`."""
    from tests.e2e.deploying import parse_statuses

    log = "\n".join(
        [
            "--> Starting operation: Engine | install",
            "    [h] Success",
            "--> Starting operation: Serve | Router: unit",
            "    [h] No changes",
            "--> Starting operation: Model | stage the copy (beside)",
            "    [h] Success",
            "--> Starting operation: Smoke | chat requests",
            "    [h] Success",
        ]
    )
    assert parse_statuses(log, "h") == {
        "Engine: install": "Success",
        "Router: unit": "No changes",
        "stage the copy (beside)": "Success",
        "Smoke: chat requests": "Success",
    }
