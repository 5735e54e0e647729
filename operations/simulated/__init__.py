"""The simulated hosts of the quick start (`make demo`, `make pve-demo`): the answers that make
pyinfra's @fake connector look like CT200 (`ct200`) and like its Proxmox node (`pve_node`), read
from what such hosts print (captured/, each file with its source), CT200 on day 2, converged
(`converged`, `make demo-day2`: computed from the plan's own files), and the repository's group
data, which the demo inventories carry so they read the same settings from any directory
(`group_data`). Nothing here contacts a host; the tests reuse these answers, never the reverse."""
