"""A simulated CT200 for `make demo`: pyinfra's @fake connector answering with real outputs of
an 8 x RTX PRO 6000 Blackwell container (driver 570, CUDA 12.8; operations/simulated/ct200.py).
Nothing is contacted, and deploy.py refuses a run without --dry on it (`_demo`: the simulated
host's description). It runs from any directory:

    .venv/bin/pyinfra inventory/demo.py deploy.py --dry
    .venv/bin/python -m operations.plan inventory/demo.py
"""

import sys
from pathlib import Path

# pyinfra puts only the working directory on sys.path: the toolkit beside this file is found
# from anywhere (for this file, and for deploy.py after it).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from operations.simulated import ct200 as _ct200  # noqa: E402
from operations.simulated import group_data as _group_data  # noqa: E402

ct200 = [
    (
        "@fake/ct200",
        {
            "fake_responses": _ct200.fake_responses(),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            "_demo": "inventory/demo.py's CT200",
        },
    )
]
# The repository's settings (group_data/all.py), wherever the demo runs: pyinfra reads
# group_data/ from the working directory, whose files still override these.
all = ([name for name, _ in ct200], _group_data.read("all"))
