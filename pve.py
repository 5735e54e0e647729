"""Converge containers' GPUs, memory and driver from their Proxmox node:
`pyinfra inventory/pve.py pve.py [--dry]`.

Each inventory host is one container (pve_ctid), reached over SSH as root on its Proxmox node,
with the same settings (and checks) as the container's own deploy. See operations/steps/pve.py and
docs/how-to/proxmox-node.md.
"""

from pyinfra.context import host, state

from operations.steps.pve import converge

converge(state, host)
