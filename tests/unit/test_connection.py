"""TCP_NODELAY on a host's SSH connection (operations/runtime/connection.py): set on an SSH host's
TCP socket, and nothing done (False) for another connector, a host not connected yet, or a
connection that is no TCP socket (a ProxyCommand's pipe)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from operations.runtime.connection import no_delay


def _host(name: str) -> Host:
    inventory = Inventory(([name], {}))
    State(inventory=inventory, config=Config())
    return next(iter(inventory))


@pytest.fixture
def tcp() -> Iterator[socket.socket]:
    """A real TCP connection on loopback, its client side."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        try:
            yield client
        finally:
            client.close()
            accepted.close()


def _with_socket(host: Host, sock: object) -> None:
    transport = SimpleNamespace(sock=sock)
    host.connector.client = SimpleNamespace(get_transport=lambda: transport)  # type: ignore[attr-defined]


def test_an_ssh_hosts_connection_sends_at_once(tcp: socket.socket) -> None:
    host = _host("ct200.example")
    _with_socket(host, tcp)
    assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    assert no_delay(host) is True
    assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_host_not_connected_yet_is_left_alone() -> None:
    assert no_delay(_host("ct200.example")) is False


def test_another_connector_is_left_alone() -> None:
    assert no_delay(_host("@local")) is False


def test_a_connection_that_is_no_tcp_socket_is_left_alone() -> None:
    host = _host("ct200.example")
    left, right = socket.socketpair()  # AF_UNIX: as a ProxyCommand's pipe is no TCP socket
    try:
        _with_socket(host, left)
        assert no_delay(host) is False
        _with_socket(host, SimpleNamespace())  # a jump host's channel: no socket at all
        assert no_delay(host) is False
    finally:
        left.close()
        right.close()
