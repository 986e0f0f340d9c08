"""HTTP/1.1 over a bare socket, for requests no client library will send as they are.

Paths with `..` or `%00`, lying Content-Length headers, bodies that stop half way.
"""
from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int | None  # None: the server closed the connection without answering
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self):
        return json.loads(self.body)


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
            send_bytes: int | None = None, half_close: bool = False, timeout_s: float = 30.0) -> RawResponse:
    """Send `method path` with `body` (only its first `send_bytes` bytes when given) and read one response."""
    head = {"Host": "127.0.0.1", "Content-Length": str(len(body)), **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
    payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body[:send_bytes]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(payload)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all: read what it said
        data = _read_response(sock)
    return _parse(data)


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(rest) >= length:
                return data


def _parse(data: bytes) -> RawResponse:
    if not data:
        return RawResponse(None)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(status_line.split()[1]), headers, body)


def drip_head(port: int, path: str, give_up_s: float) -> tuple[bytes, float]:
    """Slowloris: send a request head one byte every 0.2 s, never finishing it, until the server
    answers and closes or `give_up_s` passes. Returns what the server sent and the seconds waited."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: ".encode())
        started = time.monotonic()
        answer = b""
        with contextlib.suppress(OSError):  # the server closing under a send: a broken pipe or a reset
            while time.monotonic() - started < give_up_s:
                sock.sendall(b"a")
                if select.select([sock], [], [], 0.2)[0]:
                    chunk = sock.recv(1 << 16)
                    answer += chunk
                    if not chunk:
                        break
        return answer, time.monotonic() - started
