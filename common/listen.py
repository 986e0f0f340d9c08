"""The listening TCP socket of the gateways: bound as uvicorn binds it (SO_REUSEADDR, backlog 2048).

Without socket activation the supervisor binds it once and hands the one fd to every gateway
(`--fd`), as systemd's is handed on: the kernel queues connections on it while a gateway
restarts, and whichever gateway accepts first takes the next one. With `--reuse-port` each
gateway binds its own socket with SO_REUSEPORT instead, and the kernel deals new connections
among them by a hash of the addresses.
"""

from __future__ import annotations

import socket

BACKLOG = 2048  # uvicorn's default


def listen_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A listening socket on host:port (IPv6 when the host is); OSError when it cannot be had.

    `listen=False`: bound only; asyncio's server calls listen() when it starts serving. An
    SO_REUSEPORT socket gets its share of new connections only from then on, so a gateway
    that is still starting is dealt none.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
