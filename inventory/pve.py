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

ct200 = [
    (
        "ct200",
        {
            "ssh_hostname": os.environ.get("PVE_HOST", "pve"),
            "ssh_user": os.environ.get("PVE_USER", "root"),
            "pve_ctid": int(os.environ.get("CT200_CTID", "200")),
        },
    )
]
