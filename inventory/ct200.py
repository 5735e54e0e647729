"""The real CT200: a Proxmox LXC container with 8 x RTX PRO 6000 Blackwell.

Where to reach it comes from the environment, so no address or user lives in the repo:

    CT200_HOST          address or SSH alias of the container (default: ct200, e.g. from
                        ~/.ssh/config)
    CT200_USER          SSH user (default: root)
    SGLANG_API_KEY_FILE the file on this machine holding the API key clients send (default:
                        locks/api.key, which `make api-key` makes)

The gateway is in front by default: smg on port 8000 of the container (every address), with the
API key, in front of the eight ranks on 127.0.0.1:30000-30007. The dry run's `clients` row says
the URL clients use.

    pyinfra inventory/ct200.py deploy.py --dry     # preview
    pyinfra inventory/ct200.py deploy.py           # converge

SSH keys come from your agent or ~/.ssh/config, as with plain ssh.
"""

import os

from operations.runtime.reach import from_environment

_NAME = from_environment("CT200_HOST", "ct200", "the container's address or SSH alias")

ct200 = [
    (
        _NAME,
        {
            "ssh_user": os.environ.get("CT200_USER", "root"),
            # The gateway (smg, the settings' default router.version) with the API key.
            "router": {"host": _NAME, "port": 8000, "bind": "0.0.0.0"},
            "api_key_file": os.environ.get("SGLANG_API_KEY_FILE", "locks/api.key"),
        },
    )
]
