"""The README's quick path, its commands against the container run as written against a testbed
container standing in for CT200 (reached through CT200_HOST/CT200_USER, as a user would), with
the API key `make api-key` makes (its file named by SGLANG_API_KEY_FILE, as inventory/ct200.py
reads it). Only the connection details a real user keeps in ~/.ssh are added, as pyinfra
`--data`; a stale instruction fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests import testbed as tb
from tests.testbed import Container, ContainerSpec

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MODEL = "/mnt/models/Qwen3.6-27B"  # group_data/all.py's model_source
CONFIG = json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]})


def real_use_commands() -> list[list[str]]:
    """The quick path's commands that talk to the container (inventory/ct200.py)."""
    section = README.split("## Quick path", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0].startswith(".venv/bin/") and "inventory/ct200.py" in words:
                commands.append(words)
    return commands


@pytest.fixture(scope="module")
def ct200(testbed: tb.Testbed) -> Container:
    # A real model's config and tokenizer (preflight checks the tokenizer is there while the
    # throughput check is on, as group_data/all.py leaves it).
    files: dict[str, str | bytes] = {
        f"{MODEL}/config.json": CONFIG,
        f"{MODEL}/tokenizer.json": "{}",
    }
    (container,) = testbed.boot(ContainerSpec(extra_files=files))
    return container


def test_readme_lists_the_real_use_commands() -> None:
    commands = [" ".join(c) for c in real_use_commands()]
    assert commands == [
        ".venv/bin/pyinfra inventory/ct200.py deploy.py --dry",
        ".venv/bin/pyinfra inventory/ct200.py deploy.py -y",
        ".venv/bin/python -m operations.status inventory/ct200.py",
    ]


@pytest.fixture(scope="module")
def api_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make api-key` makes (python -m operations.cli.api_key FILE)."""
    key = tmp_path_factory.mktemp("keys") / "api.key"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "operations.cli.api_key", str(key)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return key


def run_readme_command(ct200: Container, api_key: Path, index: int, *extra: str) -> tuple[int, str]:
    words = [*real_use_commands()[index], *extra]
    env = {
        **os.environ,
        "CT200_HOST": ct200.address,
        "CT200_USER": "root",
        "SGLANG_API_KEY_FILE": str(api_key),
    }
    connection = [
        "--data",
        f"ssh_key={ct200.key_path}",
        "--data",
        "ssh_known_hosts_file=/dev/null",
        # This machine has 24 GB: the memory check would (rightly) refuse 8 x 4 GiB.
        "--data",
        "ram_per_rank_gb=0.25",
    ]
    proc = subprocess.run(
        [str(REPO / words[0]), *words[1:], *connection],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    return proc.returncode, out


def test_the_preview_works_against_a_host_and_names_the_gateway(
    ct200: Container, api_key: Path
) -> None:
    """The preview; the converging run is what every other e2e test does."""
    rc, out = run_readme_command(ct200, api_key, 0)
    assert rc == 0, out[-4000:]
    assert f"{ct200.address}: ready" in out
    assert "--attention-backend flashinfer" in out
    # The quick path's words: the clients row names the gateway, with the key.
    clients = rf"│ clients +http://{re.escape(ct200.address)}:8000/v1 \(the router\); key +│"
    assert re.search(clients, out), out[-4000:]
    snapshot_paths = ["/etc/systemd/system/sglang@0.service", "/opt/sglang"]
    assert all(ct200.ssh_run(f"test -e {p}")[0] != 0 for p in snapshot_paths), "changed a host"


def test_status_of_a_host_never_deployed_says_so_and_fails(ct200: Container, api_key: Path) -> None:
    rc, out = run_readme_command(ct200, api_key, 2)
    assert rc == 1, out[-4000:]
    assert "missing" in out and "0/8 ranks healthy" in out


def test_probe_of_a_host_never_deployed_fails_naming_no_answer(
    ct200: Container, api_key: Path
) -> None:
    rc, out = run_readme_command(ct200, api_key, 2, "--probe")
    assert rc == 1, out[-4000:]
    assert "0/8 ranks healthy" in out
