"""Every refusal says why and exits non-zero, and no user mistake or unreachable host ends in a
traceback: each case through the entry point a user types (the plan command, the pyinfra CLI
with deploy.py or pve.py, the status command), against the simulated CT200 (@fake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from operations.facts.host import Model, parse_model
from operations.resolver import resolve
from operations.serve import ranks_label
from tests.unit.builders import QWEN36, facts, make_settings

pytestmark = pytest.mark.integration  # runs pyinfra, the plan and status commands

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


def test_the_routers_refusal_is_in_the_panel_with_its_reason() -> None:
    rc, out = plan(*data(ROUTER_30003))
    assert rc == 1
    assert "@fake/ct200: refused" in out and COLLISION in unfolded(out), out


def test_a_valid_router_plan_is_shown() -> None:
    rc, out = plan(*data('router={"host": "@fake/ct200", "port": 8000}'))
    assert rc == 0, out
    text = unfolded(out)
    assert "router: sglang-router 0.3.2 on 0.0.0.0:8000, policy cache_aware, 8 worker(s)" in text
    assert "--worker-urls http://127.0.0.1:30000" in text and "--port 8000" in text


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
    setting: str, reason: str, dry: bool
) -> None:
    rc, out = deploy(*data(setting), *(["--dry"] if dry else []))
    assert rc == 1, out
    assert "[@fake/ct200] refused:" in out and reason in out, out
    # No operation for the refusal: nothing in a change table, nothing run.
    assert "Refuse" not in out and "Detected changes" not in out, out
    assert "Beginning operation run" not in out, out


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


def test_plan_and_status_without_ct200_host_say_what_to_set(tmp_path: Path) -> None:
    env = without_address(tmp_path, "CT200_HOST", "CT200_USER")
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


def test_pyinfras_change_table_fits_100_columns() -> None:
    """Operation names stay short: a deploy starting 8 ranks, as `make demo` shows it."""
    rc, out = deploy("--dry")
    assert rc == 0, out
    _, _, table = out.partition("--> Detected changes:")
    rows = [line.rstrip() for line in table.split("\n\n", 1)[0].splitlines() if line.strip()]
    assert any("Serve: enable and start ranks 0-7" in row for row in rows), rows
    assert max(len(row) for row in rows) <= 100, max(rows, key=len)


def test_ranks_in_an_operation_name() -> None:
    assert ranks_label([3]) == "sglang@3.service"
    assert ranks_label([2, 3]) == "sglang@2.service, sglang@3.service"
    assert ranks_label(list(range(8))) == "ranks 0-7"
    assert ranks_label([7, 0, 1, 2, 5]) == "ranks 0-2, 5, 7"


# -- the docs ---------------------------------------------------------------------------------

LINK = r"\]\((?!https?://|mailto:)([^)#\s]+)(?:#[^)\s]*)?\)"


def test_every_link_inside_the_repo_resolves_and_stays_inside() -> None:
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(LINK, doc.read_text()):
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT), f"{doc.name}: {target} leaves the repo"
            assert path.exists(), f"{doc.name}: {target} does not exist"


def test_every_doc_is_reachable_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name}" in readme, f"docs/{doc.name} is not linked from README.md"


def test_the_two_container_inventory_loads_with_the_router_on_ct200() -> None:
    from operations import settings as settings_mod
    from operations.plan import build_state

    state = build_state("inventory/two.py", {})
    loaded, problems = settings_mod.load_inventory(list(state.inventory))
    assert problems == []
    assert sorted(loaded) == ["ct200", "ct201"]
    assert {s.router.host for s in loaded.values() if s.router} == {"ct200"}
