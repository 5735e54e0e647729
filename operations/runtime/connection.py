"""The controller's SSH connection to a host sends each message at once (TCP_NODELAY).

Neither pyinfra (3.10) nor paramiko (4.0) sets a socket option on the connection they open (no
`setsockopt` in either package), so Nagle's algorithm is on for the one TCP connection all of
a host's commands share: a small SSH message (a channel open, an exec request) waits for the
ACK of the message before it, and the host's TCP delays that ACK by up to 40 ms (Linux's
TCP_DELACK_MIN). A deploy opens a channel for every fact, every operation's command and every
roll batch. Measured on the testbed (bench/README.md): a channel open took 40-47 ms; with
TCP_NODELAY, 0.5 ms. paramiko writes each SSH packet whole, so nothing is sent in smaller
pieces for it; only packets that would have waited go at once.

Set as soon as the host is connected: by deploy.py before its first request (pyinfra's CLI
connects the hosts before it loads deploy.py), and by the inventory session of the read-only
commands (operations/runtime/inventory.py) as each host connects.
"""

from __future__ import annotations

import socket

from pyinfra.api.host import Host

from operations.runtime.pyinfra_internals import ssh_socket


def no_delay(host: Host) -> bool:
    """TCP_NODELAY on `host`'s SSH connection; False when it has none to set it on (another
    connector, not connected yet, or a connection that is no TCP socket of ours: a
    ProxyCommand's pipe, a jump host's channel)."""
    sock = ssh_socket(host)
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return True
