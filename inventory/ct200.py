"""The real CT200: a Proxmox LXC container with 8 x RTX PRO 6000 Blackwell.

Where to reach it comes from the environment, so no address or user lives in the repo:

    CT200_HOST   address or SSH alias of the container (default: ct200, e.g. from ~/.ssh/config)
    CT200_USER   SSH user (default: root)

    pyinfra inventory/ct200.py deploy.py --dry     # preview
    pyinfra inventory/ct200.py deploy.py           # converge

SSH keys come from your agent or ~/.ssh/config, as with plain ssh.
"""

import os

from operations.runtime.reach import from_environment

ct200 = [
    (
        from_environment("CT200_HOST", "ct200", "the container's address or SSH alias"),
        {"ssh_user": os.environ.get("CT200_USER", "root")},
    )
]
