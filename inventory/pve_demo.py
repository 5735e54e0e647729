"""A simulated Proxmox node for `make pve-demo`: pyinfra's @fake connector answering pve.py's facts
as CT200's node would (Proxmox VE 8.1, 8 GPUs, driver 570; operations/simulated/pve_node.py).
Nothing is contacted. The host is named for the node and the container, pve1/ct200; its
group is ct200 like the real entry (inventory/pve.py), so every setting applies. It runs from
any directory:

    pyinfra inventory/pve_demo.py pve.py --dry
"""

import sys
from pathlib import Path

# A real run against a simulation would report changes that never happened: only --dry.
if Path(sys.argv[0]).name == "pyinfra" and "--dry" not in sys.argv:
    sys.stderr.write(
        "inventory/pve_demo.py simulates a Proxmox node: run it with --dry "
        "(pyinfra inventory/pve_demo.py pve.py --dry)\n"
    )
    sys.exit(2)

# pyinfra puts only the working directory on sys.path: the toolkit beside this file is found
# from anywhere (for this file, and for pve.py after it).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from operations.simulated import group_data as _group_data  # noqa: E402
from operations.simulated import node_connector as _node_connector  # noqa: E402
from operations.simulated import pve_node as _pve_node  # noqa: E402

# The host is the node, named for it and its container: "pve1/ct200" (pyinfra's @fake connector
# would call it "@fake/pve1/ct200"; operations/simulated/node_connector.py says how).
_node_connector.on_path()
ct200 = [
    (
        f"@{_node_connector.NAME}/{_pve_node.NODE}/ct200",
        {
            "pve_ctid": 200,
            "fake_responses": _pve_node.fake_responses(),
            "fake_delay": 0,
            "fake_delay_jitter": 0,
        },
    )
]
# The repository's settings (group_data/all.py), wherever the demo runs: pyinfra reads
# group_data/ from the working directory, whose files still override these.
all = ([name for name, _ in ct200], _group_data.read("all"))
