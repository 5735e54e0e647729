"""Credentials never shown: URLs (settings errors, status, the engine's log line) and journal
text (a failed rank's last lines, printed by the deploy). The attacks: index URLs whose
credentials the first redaction leaked, and a rank that logs its API key at start (SGLang logs
`server_args=ServerArgs(..., api_key='...')`) and then fails, so the deploy shows its journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from operations.redact import mask_journal, redact, redact_text
from tests.doubles import wheels
from tests.unit.shipped import script_path

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-live-7f3a9c2e1b"
TOKEN = "tok3nS3cr3t"
RANK_ARGS = ("--api-key", KEY, "--port", "30000", "--model-path")
SMOKE_ARGS: tuple[str, ...] = ("--model", "m", "--timeout", "5", "--service-user", "nobody")
SMOKE_ARGS += ("--journal",)
SMOKE_ARGS += ("sglang@0.service=http://127.0.0.1:9", "--key-file")
WAIT_ARGS = (
    "--timeout",
    "30",
    "--service-user",
    "nobody",
    "sglang@0.service=http://127.0.0.1:9/health",
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:tok@mirror.example/simple", "https://***@mirror.example/simple"),
        # A password holding '@' or '/': the first redaction stopped at the first of them.
        (f"https://user:p@{TOKEN}@h/simple", "https://***@h/simple"),
        (f"https://user:pa/{TOKEN}@h/simple", "https://***@h/simple"),
        (f"https://{TOKEN}@h.example:8443/simple", "https://***@h.example:8443/simple"),
        # Tokens in the query or in the path (Gemfury, Cloudsmith, anaconda.org).
        (f"https://h.example/simple?token={TOKEN}", "https://h.example/simple?token=***"),
        (f"https://h.example/s/?a=1&sig={TOKEN}#x", "https://h.example/s/?a=***&sig=***#x"),
        ("https://pypi.fury.io/1aBcD2eFgH3iJkL4mNoP/acme/", "https://pypi.fury.io/***/acme/"),
        (
            "https://dl.cloudsmith.io/9xY8wV7uT6sR5qP4oN3m/org/repo/python/simple/",
            "https://dl.cloudsmith.io/***/org/repo/python/simple/",
        ),
        (f"https://conda.anaconda.org/t/{TOKEN}/chan", "https://conda.anaconda.org/t/***/chan"),
        # What carries no credential is shown as it is.
        ("https://download.pytorch.org/whl/cu128", "https://download.pytorch.org/whl/cu128"),
        ("https://mirror.example:8443/simple", "https://mirror.example:8443/simple"),
        ("hf://Qwen/Qwen3.6-27B@6a9e0b1", "hf://Qwen/Qwen3.6-27B@6a9e0b1"),
        (
            "https://h/pkgs/sglang-0.5.11-py3-none-any.whl",
            "https://h/pkgs/sglang-0.5.11-py3-none-any.whl",
        ),
    ],
)
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert redact_text(f"index '{url}' failed") == f"index '{shown}' failed"


def test_settings_errors_never_hold_the_password_with_an_at_sign() -> None:
    from operations.settings import Layer, SettingsError, load

    url = f"https://user:p@{TOKEN}@mirror.example/simple\n"
    with pytest.raises(SettingsError) as caught:
        load("ct200", [Layer("test", {"model_source": "/m/x", "package_index_url": url})])
    assert TOKEN not in str(caught.value) and "https://***@mirror.example" in str(caught.value)


def test_journal_fields_flags_and_the_literal_key_are_masked() -> None:
    line = (
        f"server_args=ServerArgs(model_path='/dev/shm/m', api_key='{KEY}', admin_api_key=None, "
        f'hf_token="{TOKEN}", port=30000) argv: --api-key {KEY} -H "Authorization: Bearer {KEY}"'
    )
    masked = mask_journal(line)
    assert KEY not in masked and TOKEN not in masked, masked
    assert "api_key='***'" in masked and "admin_api_key=None" in masked and "port=30000" in masked
    assert mask_journal(f"key was {KEY}.", (KEY,)) == "key was ***."


@pytest.fixture
def host(tmp_path: Path) -> dict[str, str]:
    """A failed rank's journal as the server double writes it, behind stand-ins for journalctl
    and systemctl (the unit is failed)."""
    packages = tmp_path / "packages"
    files = wheels._package_files("sglang", {"VERSION": "0.5.11"})
    files["sglang/_cli_table.json"] = wheels.cli_table("0.5.11")
    for name, data in files.items():
        (packages / name).parent.mkdir(parents=True, exist_ok=True)
        (packages / name).write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    # The double logs its ServerArgs, then fails: no GPU (as a rank whose GPU is gone does).
    rank = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *RANK_ARGS, str(tmp_path)],
        env={**env, "PYTHONPATH": str(packages)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rank.returncode == 1 and f"api_key='{KEY}'" in rank.stdout, rank
    (tmp_path / "journal").write_text(rank.stdout + rank.stderr)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {tmp_path / 'journal'}\n")
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\nprintf 'ActiveState=failed\\nSubState=failed\\nNRestarts=0\\n'\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


@pytest.mark.integration
def test_a_failed_ranks_journal_shown_by_the_health_wait_holds_no_key(
    host: dict[str, str],
) -> None:
    proc = subprocess.run(
        [sys.executable, str(script_path("wait_healthy.py")), *WAIT_ARGS],
        env=host,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "journal lines" in proc.stdout, proc
    assert "server_args=ServerArgs(" in proc.stdout and "api_key='***'" in proc.stdout, proc
    assert KEY not in proc.stdout + proc.stderr


@pytest.mark.integration
def test_a_failed_ranks_journal_shown_by_the_smoke_step_holds_no_key(
    host: dict[str, str], tmp_path: Path
) -> None:
    key_file = tmp_path / "secrets.yaml"
    key_file.write_text(f'api-key: "{KEY}"\n')
    proc = subprocess.run(
        [sys.executable, str(script_path("smoke.py")), *SMOKE_ARGS, str(key_file)],
        env=host,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "last 40 journal lines" in proc.stdout, proc
    assert "server_args=ServerArgs(" in proc.stdout, proc
    assert KEY not in proc.stdout + proc.stderr
