"""TEST DOUBLE: canned answers that make pyinfra's @fake connector look like CT200.

nvidia-smi's part is produced by running the deploy's real NvidiaGpus fact command against the
nvidia-smi double and a fixture of real captured output, so the demo sees byte-for-byte what
the fact would read on such a host. The rest is in tests/fixtures/ct200 (see its README).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from operations.facts.gpu import NvidiaGpus
from operations.facts.host import CONFIG_MARKER
from operations.facts.preflight import SECTION

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
DOUBLE = ROOT / "doubles" / "nvidia-smi"


def nvidia_smi_env(bindir: Path, scenario: str) -> dict[str, str]:
    """The environment of a command that finds the nvidia-smi double first on PATH (linked into
    `bindir`), showing the captured `scenario` of tests/fixtures/nvidia-smi."""
    link = bindir / "nvidia-smi"
    if not link.is_symlink():
        os.symlink(DOUBLE, link)
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "NVIDIA_SMI_DOUBLE_DIR": str(FIXTURES / "nvidia-smi" / scenario),
    }


def nvidia_smi_output(scenario: str) -> list[str]:
    """What the NvidiaGpus fact's command prints on a host showing `scenario`."""
    with tempfile.TemporaryDirectory() as bindir:
        result = subprocess.run(
            ["sh", "-c", NvidiaGpus().command()],
            env=nvidia_smi_env(Path(bindir), scenario),
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    return result.stdout.splitlines()


def fake_responses(
    scenario: str = "rtx-pro-6000-x8", model_bytes: int = 53_800_000_000
) -> dict[str, Any]:
    """fake_responses host data for pyinfra's @fake connector (substring matchers)."""
    resources = (FIXTURES / "ct200" / "host-resources.txt").read_text().splitlines()
    config = (FIXTURES / "ct200" / "model-config.json").read_text().splitlines()
    shards = [f"model-{i:05d}-of-00015.safetensors" for i in range(1, 16)]
    never_staged = {
        "source": {"digest": "52cd26977905ef55", "bytes": model_bytes, "files": len(shards) + 4},
        "error": None,
        "staged": None,
        "leftovers": [],
        "hub_revision": None,
        "copy_bytes": model_bytes,
        "changed_files": ["config.json", "tokenizer.json", *shards],
        "mismatched": [],
        "up_to_date": False,
    }
    model = ["exists", str(model_bytes), CONFIG_MARKER, *config]
    gpus = nvidia_smi_output(scenario)
    return {
        # PreflightFacts (operations/facts/preflight.py): the three parts, each after its line.
        SECTION: [
            *(f"{SECTION}gpu", *gpus),
            *(f"{SECTION}resources", *resources),
            *(f"{SECTION}model", *model),
        ],
        # The staging script's plan (operations/facts/model.py): nothing staged yet.
        "Stage a model directory into a tmpfs": [json.dumps(never_staged)],
        "--query-gpu=": gpus,
        # pyinfra's own facts that the deploy's built-in operations read.
        "uname -s": ["Linux"],
        "GNU_LIBC_VERSION": resources,
        CONFIG_MARKER: model,
    }
