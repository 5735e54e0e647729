"""The simulated CT200: what pyinfra's @fake connector answers for inventory/demo.py.

An 8 x RTX PRO 6000 Blackwell container (driver 570, CUDA 12.8) with the model mounted and
nothing installed yet. Each answer is keyed by a piece of the asking fact's own command and is
what that command prints on such a host (captured/ct200, see its README): the GPUs' part is the
NvidiaGpus fact's own output over the captured nvidia-smi of that host.
"""

from __future__ import annotations

import json
from pathlib import Path

from operations.facts.host import CONFIG_MARKER, TOKENIZER_MARKER
from operations.facts.preflight import SECTION

CAPTURED = Path(__file__).resolve().parent / "captured" / "ct200"
MODEL_BYTES = 53_800_000_000


def captured(name: str) -> list[str]:
    """The lines of captured/ct200/`name`."""
    return (CAPTURED / name).read_text().splitlines()


def fake_responses(
    gpus: list[str] | None = None, model_bytes: int = MODEL_BYTES
) -> dict[str, list[str]]:
    """fake_responses host data for pyinfra's @fake connector (substring matchers). `gpus`: what
    the NvidiaGpus fact's command prints (default: CT200's 8 GPUs on driver 570)."""
    gpus = captured("nvidia-gpus.txt") if gpus is None else gpus
    resources = captured("host-resources.txt")
    config = captured("model-config.json")
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
    # The source's tokenizer file, as the copy above lists it (changed_files).
    tokenizer = f"{TOKENIZER_MARKER} tokenizer.json"
    model = ["exists", str(model_bytes), tokenizer, CONFIG_MARKER, *config]
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
