"""A simulated CT200 for `make demo`: pyinfra's @fake connector answering with real outputs of
an 8 x RTX PRO 6000 Blackwell container (driver 570, CUDA 12.8). Nothing is contacted, and
deploy.py refuses a run without --dry on it (`_demo`: the simulated host's description).

    .venv/bin/pyinfra inventory/demo.py deploy.py --dry
    .venv/bin/python -m operations.plan inventory/demo.py
"""

from tests.doubles.ct200 import fake_responses

ct200 = [
    (
        "@fake/ct200",
        {
            "fake_responses": fake_responses("rtx-pro-6000-x8"),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            "_demo": "inventory/demo.py's CT200",
        },
    )
]
