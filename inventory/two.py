"""Two containers behind one router: CT200 and a second, CT201 (docs/how-to/add-a-host.md).
Each is one pyinfra host, deployed in parallel; the router runs on ct200 with every rank of both
as its workers.

    CT200_HOST, CT201_HOST       address or SSH alias of each container (default: its name)
    CT200_ADDRESS, CT201_ADDRESS the address each container's ranks listen on, which the router
                                 (on ct200) must reach: an address of that container, not an
                                 alias (default 127.0.0.1: the plan then warns that the router
                                 cannot reach ct201)
    CT200_USER, CT201_USER       SSH user (default: root)
    CONTROL_PLANE_KEY_FILE       a file on this machine holding the router's control-plane key,
                                 which both containers' drains send (docs/how-it-works/security.md,
                                 "The
                                 router's control plane"). Unset: the first run makes one beside
                                 the engine locks (locks/router-control-plane.key, mode 600)

    python -m operations.plan inventory/two.py               # both plans, the router's too
    pyinfra inventory/two.py deploy.py --dry                 # preview
    pyinfra inventory/two.py deploy.py                       # converge both
    python -m operations.status inventory/two.py --probe     # every rank and the router

Every other setting comes from group_data/all.py, as for inventory/ct200.py; a key set in an
entry below holds for that container alone (a second model source, another gpu_count...).
"""

import os

from operations.runtime.reach import from_environment


def container(name: str, number: str) -> tuple[str, dict[str, object]]:
    return (
        name,
        {
            "ssh_hostname": from_environment(
                f"CT{number}_HOST", name, f"{name}'s address or SSH alias", host=name
            ),
            "ssh_user": os.environ.get(f"CT{number}_USER", "root"),
            "server_host": os.environ.get(f"CT{number}_ADDRESS", "127.0.0.1"),
        },
    )


# One group: its data holds for both. The router listens on ct200 beside its ranks (30000-30007).
containers = (
    [container("ct200", "200"), container("ct201", "201")],
    {
        "router": {
            "host": "ct200",
            "port": 8000,
            "policy": "cache_aware",
            "bind": "0.0.0.0",
            "control_plane_key_file": os.environ.get("CONTROL_PLANE_KEY_FILE") or None,
        }
    },
)
