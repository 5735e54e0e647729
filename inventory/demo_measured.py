"""The simulated CT200 of day 2 (inventory/demo_day2.py) after a throughput check, a canary
that failed and was rolled back, and a tune: its status shows the last throughput record beside
the one before it, the verdict with its failed rows, and the tune's proposal. The throughput and
canary records are the real programs' output, captured against server doubles; the tune's are
composed in its records' format (operations/simulated/captured/ct200/README.md). Nothing is
contacted:

    .venv/bin/python -m operations.status inventory/demo_measured.py
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from operations.simulated import converged as _converged  # noqa: E402
from operations.simulated import group_data as _group_data  # noqa: E402

ct200 = [
    (
        "@fake/ct200",
        {
            "fake_responses": _converged.fake_responses(measured=True),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            "engine_lock_dir": _converged.controller_locks(),
            "_demo": "inventory/demo_measured.py's CT200",
        },
    )
]
all = ([name for name, _ in ct200], _group_data.read("all"))
