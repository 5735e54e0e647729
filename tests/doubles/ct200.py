"""TEST DOUBLE: CT200's nvidia-smi, for the tests, over the simulated CT200 of the product.

The simulated host's answers live with the product (operations/simulated/ct200.py); the tests
vary its GPUs: `fake_responses(scenario)` gives it the NvidiaGpus fact's real command run against
the nvidia-smi double and a scenario of tests/fixtures/nvidia-smi, byte for byte what the fact
would read on such a host. `python -m tests.doubles.ct200 SCENARIO` prints that output (the
simulated CT200's captured/ct200/nvidia-gpus.txt is the one of rtx-pro-6000-x8).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from operations.facts.gpu import NvidiaGpus
from operations.simulated import ct200

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
    scenario: str = "rtx-pro-6000-x8", model_bytes: int = ct200.MODEL_BYTES
) -> dict[str, list[str]]:
    """The simulated CT200's fake_responses, its GPUs showing `scenario`."""
    return ct200.fake_responses(nvidia_smi_output(scenario), model_bytes)


if __name__ == "__main__":
    print("\n".join(nvidia_smi_output(sys.argv[1] if len(sys.argv) > 1 else "rtx-pro-6000-x8")))
