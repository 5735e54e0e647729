"""A simulated Proxmox node for `make pve-demo`: pyinfra's @fake connector answering pve.py's facts
as CT200's node would (Proxmox VE 8.1, 8 GPUs, driver 570; tests/doubles/pve_node.py). Nothing
is contacted. Named ct200 like the real entry (inventory/pve.py), so every setting applies.

    pyinfra inventory/pve_demo.py pve.py --dry
"""

import sys
from pathlib import Path

from tests.doubles.pve_node import fake_responses

# A real run against a simulation would report changes that never happened: only --dry.
if Path(sys.argv[0]).name == "pyinfra" and "--dry" not in sys.argv:
    sys.stderr.write(
        "inventory/pve_demo.py simulates a Proxmox node: run it with --dry "
        "(pyinfra inventory/pve_demo.py pve.py --dry)\n"
    )
    sys.exit(2)

ct200 = [
    (
        "@fake/ct200",
        {
            "pve_ctid": 200,
            "fake_responses": fake_responses(),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
        },
    )
]
