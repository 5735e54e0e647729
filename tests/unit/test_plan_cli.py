"""The plan command and the dry-run deploy against the simulated CT200 (pyinfra's @fake
connector): real pyinfra inventory loading, real fact commands, canned real outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.unit.widths import ours_wider_than

pytestmark = pytest.mark.integration  # runs the plan command and pyinfra

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"

# Runs the plan command or the pyinfra CLI with the @fake connector recording what reaches the
# host: every command with the fact that asked for it (None: an operation's), and every upload.
# Facts only read; anything else reaching the host is a change (or an attempt at one).
RECORDER = """
import atexit, contextvars, json, sys
from pyinfra.api import facts
from pyinfra.connectors.fake import FakeConnector

asking = contextvars.ContextVar("asking", default=None)
seen = []
get_fact = facts._get_fact
run = FakeConnector.run_shell_command
put = FakeConnector.put_file

def in_fact(state, host, cls, *args, **kwargs):
    token = asking.set(cls.__name__)
    try:
        return get_fact(state, host, cls, *args, **kwargs)
    finally:
        asking.reset(token)

def command(self, cmd, *args, **kwargs):
    seen.append([asking.get(), cmd if isinstance(cmd, str) else cmd.get_masked_value()])
    return run(self, cmd, *args, **kwargs)

def upload(self, src, dest, *args, **kwargs):
    seen.append([asking.get(), "put_file " + dest])
    return put(self, src, dest, *args, **kwargs)

facts._get_fact, FakeConnector.run_shell_command, FakeConnector.put_file = in_fact, command, upload
out, what = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(out, "w").write(json.dumps(seen)))
sys.argv = [what, *sys.argv[3:]]
if what == "plan":
    from operations.cli.plan import main
else:
    from pyinfra_cli.main import main
sys.exit(main())
"""


def recorded(tmp_path: Path, what: str, *args: str) -> tuple[str, list[tuple[str | None, str]]]:
    """(output, [(fact or None, command)]) of `python -m operations.plan ARGS` ("plan") or
    `pyinfra ARGS` ("pyinfra") against the simulated host."""
    log = tmp_path / f"{what}-commands.json"
    result = subprocess.run(
        [sys.executable, "-c", RECORDER, str(log), what, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    return out, [(fact, cmd) for fact, cmd in json.loads(log.read_text())]


def plan(
    *args: str, inventory: str = "inventory/demo.py", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "operations.plan", inventory, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def plan_json(*args: str, inventory: str = "inventory/demo.py") -> tuple[int, dict[str, Any]]:
    result = plan("--json", *args, inventory=inventory)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_demo_plan_has_eight_flashinfer_ranks_on_consecutive_ports() -> None:
    rc, doc = plan_json()
    assert rc == 0
    host = doc["hosts"]["@fake/ct200"]
    assert host["errors"] == []
    ranks = host["ranks"]
    assert [r["rank"] for r in ranks] == list(range(8))
    for r in ranks:
        argv = r["argv"]
        assert argv[argv.index("--attention-backend") + 1] == "flashinfer"
        assert argv[argv.index("--port") + 1] == str(30000 + r["rank"])
        # 0.5.11 pins flashinfer 0.6.8.post1: on sm_120 under cu128 its JIT needs the arch
        # named with its suffix (knowledge: rank_environment).
        # Every rank's JIT builds use the engine's own nvcc (knowledge: lanes.cu128.compiler).
        home = r["env"]["CUDA_HOME"]
        assert home.startswith("/opt/sglang/cuda/12.8.93-")
        # The engine's compile caches, one directory of its own (tests/unit/test_compile_caches.py).
        cache = r["env"]["SGLANG_CACHE_DIR"]
        assert cache.startswith("/opt/sglang/caches/0.5.11-cu128-")
        caches = {
            k: v for k, v in r["env"].items() if v.startswith(cache) or k.startswith("TRITON_")
        }
        assert set(caches) == {
            "SGLANG_CACHE_DIR",
            "FLASHINFER_WORKSPACE_BASE",
            "TRITON_CACHE_DIR",
            "TRITON_CACHE_AUTOTUNING",
            "TORCHINDUCTOR_CACHE_DIR",
            "CUDA_CACHE_PATH",
        }
        assert {k: v for k, v in r["env"].items() if k not in caches} == {
            "CUDA_VISIBLE_DEVICES": str(r["rank"]),
            "CUDA_HOME": home,
            "PATH": f"{home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "FLASHINFER_CUDA_ARCH_LIST": "12.0a",
        }
        assert "ExecStart=" in r["unit"]


def test_human_output_shows_decisions_and_ranks_on_stdout() -> None:
    """On stdout, so that `plan | less` and grep see it."""
    result = plan()
    assert result.returncode == 0, result.stderr
    for text in ("ready", "flashinfer", "30000-30007", "lane cu128", "sglang@{0-7}.service"):
        assert text in result.stdout
    assert result.stderr == ""


def test_the_compact_plan_fits_80_lines_with_the_command_line() -> None:
    """Issue 30: errors and warnings first, then one line per item, the rank command line
    visible, the reasons and sources behind --why."""
    result = plan(env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 40, result.stdout
    assert max(len(line) for line in lines) <= 80
    labels = [ln.strip("│ ").split(" ", 1)[0] for ln in lines[1:]]
    order = ["warning:", "release", "GPUs", "engine", "compiler", "model", "copy", "ranks"]
    assert [labels.index(label) for label in order] == sorted(
        labels.index(label) for label in order
    ), labels
    assert "backend flashinfer" in result.stdout and "changes" in labels
    assert "--mamba-scheduler-strategy extra_buffer" in result.stdout
    assert "config.json: Qwen3_5ForConditionalGeneration" in result.stdout
    # The sources are --why's: the compact plan names none.
    assert "(source:" not in result.stdout and "pytorch.org/whl" not in result.stdout


def test_why_shows_package_extras_that_rich_would_take_for_markup() -> None:
    """0.5.19 overrides flashinfer_python[cu13]: `[cu13]` is text, never rich markup."""
    result = plan("--why", "--data", "sglang_version=0.5.19", env={"COLUMNS": "200"})
    assert "replaces the release's flashinfer_python[cu13]==0.6.18" in result.stdout, result.stdout
    assert "cuda_nvcc-linux-x86_64-12.8.93-archive.tar.xz" in result.stdout


def test_the_json_lists_the_compilers_archives_with_their_urls() -> None:
    rc, doc = plan_json()
    assert rc == 0
    archives = doc["hosts"]["@fake/ct200"]["compiler_archives"]
    assert [a["name"] for a in archives] == ["cuda_nvcc", "cuda_cudart", "cuda_cccl"]
    for a in archives:
        assert a["url"].startswith("https://developer.download.nvidia.com/compute/cuda/redist/")
        assert a["url"].endswith("/" + a["file"]) and len(a["sha256"]) == 64


def test_a_mirrors_credentials_never_reach_the_plan() -> None:
    secret = "cuda_redist_url=https://user:s3cret@mirror.example/redist"
    for args in (["--why"], ["--json"], []):
        result = plan(*args, "--data", secret)
        assert result.returncode == 0 and "s3cret" not in result.stdout + result.stderr
        assert "mirror.example/redist" in result.stdout


def test_panel_wraps_values_instead_of_cutting_them() -> None:
    """An 80-column log (a pipe): every value whole, over as many lines as it needs; under
    --why the reasons and sources follow the box, wrapped at spaces only: no URL is broken, and
    the only lines over 80 columns are a URL that is longer on its own."""
    result = plan("--why")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    long = [ln for ln in lines if len(ln) > 80]
    # A line over 80 columns is one word longer on its own: a URL or a path, never broken.
    assert all(" " not in ln.strip() for ln in long), long
    _, doc = plan_json()
    (host,) = doc["hosts"].values()
    reasons = " ".join(d["why"] for d in host["decisions"]) + " ".join(host["warnings"])
    urls = {u.rstrip(").;,") for u in re.findall(r"https://\S+", reasons)}
    assert urls
    for url in urls:
        assert any(url in ln for ln in lines), f"{url} broken or missing"
    assert "…" not in result.stdout
    assert any("rank environment: FLASHINFER_CUDA_ARCH_LIST=12.0a" in ln for ln in lines)
    (at,) = [i for i, ln in enumerate(lines) if "engine pin: torch==2.11.0+cu128" in ln]
    assert "only from https://download.pytorch.org/whl/cu128" in lines[at + 1]


@pytest.mark.parametrize(
    ("data", "texts"),
    [
        (["sglang_version=0.5.23"], ["no cu128", "570.172.08", "cannot run", ">= 580"]),
        (["sglang_version=0.5.8"], ["does not serve Qwen3_5ForConditionalGeneration", "0.5.9"]),
        (["attention_backend=fa3"], ["'fa3'", "sm_120"]),
    ],
)
def test_refused_on_the_demo_host(data: list[str], texts: list[str]) -> None:
    args = [a for d in data for a in ("--data", d)]
    rc, doc = plan_json(*args)
    assert rc == 1
    errors = doc["hosts"]["@fake/ct200"]["errors"]
    assert any(all(t in e for t in texts) for e in errors), errors
    assert doc["hosts"]["@fake/ct200"]["ranks"] == []


def test_cuda13_host_gets_the_renamed_mamba_flag(tmp_path: Path) -> None:
    inventory = tmp_path / "cuda13.py"
    inventory.write_text(
        textwrap.dedent(
            """
            from tests.doubles.ct200 import fake_responses
            hosts = [("@fake/ct201", {
                "fake_responses": fake_responses("rtx-pro-6000-x8-driver-580"),
                "fake_delay": 0, "fake_delay_jitter": 0,
            })]
            """
        )
    )
    rc, doc = plan_json(
        "--data", "sglang_version=0.5.23", "--data", "cuda_lane=cu130", inventory=str(inventory)
    )
    assert rc == 0, doc
    argv = doc["hosts"]["@fake/ct201"]["ranks"][0]["argv"]
    assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert "--mamba-scheduler-strategy" not in argv


def test_bad_settings_are_one_line_each_without_traceback() -> None:
    result = plan("--data", "dp_sise=4", "--data", "base_port=80")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 2, result.stdout
    assert any("did you mean 'dp_size'" in ln and "--data" in ln for ln in lines)
    assert any("base_port = 80" in ln and "1024 to 65471" in ln for ln in lines)


def test_the_plan_command_only_reads_facts(tmp_path: Path) -> None:
    out, commands = recorded(tmp_path, "plan", "inventory/demo.py")
    assert "ready" in out and "sglang@{0-7}.service" in out, out
    asked = [str(fact) for fact, _ in commands]  # "None": an operation's command
    # Four facts, each asked once and at the same time: the preflight facts, what serves now,
    # the staging plan (asked again only when a kept copy is a leftover; none here) and the
    # last canary verdict.
    facts = ["CanaryState", "ModelStaging", "PreflightFacts", "ServingState"]
    assert sorted(asked) == facts, commands


def test_make_demo_fits_80_lines_at_80_columns() -> None:
    """Issue 30: `make demo` (the dry deploy at 80 columns, pyinfra's change table included)
    is at most 80 lines, counting each line as a terminal of 80 columns wraps it."""
    result = subprocess.run(
        [str(PYINFRA), "inventory/demo.py", "deploy.py", "--dry"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    shown = sum(max(1, -(-len(line.rstrip()) // 80)) for line in lines)
    # 80 until the engine's compile caches (two operations: made, pruned) and the explicit
    # --watchdog-timeout added their lines; folding the caches' operations into the engine's
    # directories and prune would bring it back. +2 for the toolkit version: the plan's row
    # ("no toolkit version recorded ...", two lines with the changelog entry it points to) and
    # the operation that records it; +4 for the throughput check: its plan row ("bench", two
    # lines) and its two operations (the script, the client's run); +1 for the `clients` row
    # (the endpoint clients use, which the dry run must say).
    assert shown <= 93, "\n".join(lines)
    assert "--port PORT" in result.stdout + result.stderr
    # Issue 44: every line of ours fits (the staging summary was 109 columns wide).
    assert ours_wider_than(80, lines) == [], "\n".join(lines)


def test_dry_deploy_shows_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    """`make demo`: the real pyinfra CLI over the simulated host."""
    out, commands = recorded(tmp_path, "pyinfra", "inventory/demo.py", "deploy.py", "--dry", "-y")
    assert "--attention-backend flashinfer" in out
    assert "sglang@{0-7}.service" in out and "ports 30000-30007" in out
    assert {"PreflightFacts", "ModelStaging", "ServingState"} <= {f for f, _ in commands}
    # Facts only, no operation's command and no upload reached the host.
    assert [cmd for fact, cmd in commands if fact is None] == []


def test_the_recorder_sees_what_a_real_run_changes(tmp_path: Path) -> None:
    """The same deploy without --dry: the recorder above catches operations' commands, so an
    empty list there means none ran. (On the simulated host the run stops at the engine step,
    whose commands answer nothing; it got far enough to change the host.)"""
    # The demo inventory refuses a real run (next test): the same host without its `_demo`.
    inventory = tmp_path / "real.py"
    inventory.write_text(
        "from inventory import demo as _demo\n"
        "ct200 = [(n, {k: v for k, v in d.items() if k != '_demo'}) for n, d in _demo.ct200]\n"
    )
    _, commands = recorded(tmp_path, "pyinfra", str(inventory), "deploy.py", "-y")
    changes = [cmd for fact, cmd in commands if fact is None]
    assert "mkdir -p /opt/sglang/envs" in changes, changes


def test_the_demo_refuses_a_real_run_up_front_naming_dry(tmp_path: Path) -> None:
    """Issue 30: `pyinfra inventory/demo.py deploy.py -y` (no --dry) changes nothing, asks no
    fact, and says to use --dry; exit status 1."""
    log = tmp_path / "pyinfra-commands.json"
    result = subprocess.run(
        [sys.executable, "-c", RECORDER, str(log), "pyinfra", "inventory/demo.py", "deploy.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out
    assert "is simulated" in out and "--dry" in out and "Press enter" not in out
    assert json.loads(log.read_text()) == []


def test_dry_deploy_with_bad_settings_stops_before_any_host_work() -> None:
    result = subprocess.run(
        [str(PYINFRA), "inventory/demo.py", "deploy.py", "--dry", "-y", "--data", "dp_size=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "dp_size = 0" in out and "from 1 to 64" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("dont_write", ["", "1"])
def test_a_deploy_caches_this_package_bytecode_unless_told_not_to(
    tmp_path: Path, dont_write: str
) -> None:
    """pyinfra's CLI sets sys.dont_write_bytecode for its process; operations/__init__.py
    gives our own modules Python's usual cache back, and PYTHONDONTWRITEBYTECODE still wins.
    The cache goes to a temporary PYTHONPYCACHEPREFIX, not into the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = dont_write
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path)
    result = subprocess.run(
        [str(PYINFRA), "inventory/demo.py", "deploy.py", "--dry", "-y"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert "--attention-backend flashinfer" in result.stdout + result.stderr, result.stderr
    # Under the prefix, each source directory's cache is the directory's own path.
    ours = f"/{(ROOT / 'operations').relative_to('/').as_posix()}/"
    cached = {p.name.split(".")[0] for p in tmp_path.rglob("*.pyc") if ours in p.as_posix()}
    if dont_write:
        assert cached == set()
    else:
        assert {"layout", "host_plan", "serve"} <= cached, cached
