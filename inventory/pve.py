"""CT200 seen from its Proxmox node, for `pve.py`: one entry per container, named as in the
container's own inventory (so group_data/<group>.py and every setting apply to both), reached
over SSH as root on the node, with the container's id in pve_ctid.

    PVE_HOST     address or SSH alias of the Proxmox node (default: pve)
    PVE_USER     SSH user on the node (default: root; pct needs root)
    CT200_CTID   the container's id on the node (default: 200)

    pyinfra inventory/pve.py pve.py --dry                    # preview
    pyinfra inventory/pve.py pve.py                          # converge the container's config
    pyinfra inventory/pve.py pve.py --data pve_restart=true  # ... and restart it if it changed

More containers of the same node: more entries, each with its own name and pve_ctid.
"""

import os

from operations.runtime.reach import from_environment, hint
from operations.steps.pve import name_the_node_on_connect_errors

# Digits become the id; anything else is left to the settings check to refuse (one line naming
# pve_ctid and the value), never a traceback while the inventory loads.
_ctid = os.environ.get("CT200_CTID", "200")
_node = from_environment("PVE_HOST", "pve", "the Proxmox node's address or SSH alias", host="ct200")
_user = os.environ.get("PVE_USER", "root")
# An unreachable node is reported as the node, not as the container the entry is named after.
name_the_node_on_connect_errors("ct200", f"{_user}@{_node}", hint("ct200") or "")

ct200 = [
    (
        "ct200",
        {
            "ssh_hostname": _node,
            "ssh_user": _user,
            "pve_ctid": int(_ctid) if _ctid.isdigit() else _ctid,
        },
    )
]
