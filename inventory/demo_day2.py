"""A simulated CT200 on day 2, for `make demo-day2`: the host a deploy already converged, 8 ranks
serving 0.5.11 (group_data/all.py) from the staged copy, behind pyinfra's @fake connector
(operations/simulated/converged.py: its answers are computed from the plan's own files).
Nothing is contacted, and deploy.py refuses a run without --dry on it. It runs from any
directory:

    .venv/bin/pyinfra inventory/demo_day2.py deploy.py --dry        # no change
    .venv/bin/pyinfra inventory/demo_day2.py deploy.py --dry --data sglang_version=0.5.19
                                                                    # the roll, batch by batch
    .venv/bin/python -m operations.status inventory/demo_day2.py    # 8 healthy ranks
"""

import sys
from pathlib import Path

# pyinfra puts only the working directory on sys.path: the toolkit beside this file is found
# from anywhere (for this file, and for deploy.py after it).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from operations.simulated import converged as _converged  # noqa: E402
from operations.simulated import group_data as _group_data  # noqa: E402

ct200 = [
    (
        "@fake/ct200",
        {
            "fake_responses": _converged.fake_responses(),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            # The controller's locks: the converged engine's, which the first run copied back.
            "engine_lock_dir": _converged.controller_locks(),
            "_demo": "inventory/demo_day2.py's CT200",
        },
    )
]
# The repository's settings (group_data/all.py), wherever the demo runs: pyinfra reads
# group_data/ from the working directory, whose files still override these.
all = ([name for name, _ in ct200], _group_data.read("all"))
