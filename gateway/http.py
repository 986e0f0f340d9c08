"""uvicorn's httptools protocol, with each response leaving in one send().

ASGI answers in two messages, `http.response.start` and `http.response.body`, and uvicorn
writes each to the socket as it comes: two send() calls per response. On loopback and on
virtual machines a send() is most of a request's cost (the kernel runs the whole TCP path,
and wakes the reader, inside it): py-spy put 18 % of the gateway's samples in those two
writes. CoalescingTransport holds what is written during one event-loop step and hands it
to the real transport in one write at the end of the step, so headers and body leave
together. Measured on the raw-ASGI ceiling app alone (wrk, 64 clients): +40 % req/s.

Hand-written because uvicorn has no option for it; it subclasses only `connection_made`,
and everything but write/writelines/close goes straight to uvicorn's own transport.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport wrapper: writes made in one loop step go out in one write, at its end."""

    __slots__ = ("_transport", "_loop", "_chunks")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._chunks:
            self._loop.call_soon(self.flush)
        self._chunks.append(data)

    def writelines(self, chunks) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        chunks = self._chunks
        if not chunks:
            return
        self._chunks = []
        if self._transport.is_closing():
            return  # the peer is gone: as the transport itself would, drop it
        self._transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._chunks))

    def close(self) -> None:
        self.flush()  # what was written before close() still goes, as with any transport
        self._transport.close()

    def abort(self) -> None:
        self._chunks = []
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)  # pause_reading, is_closing, get_extra_info, ...


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a CoalescingTransport (pass as `uvicorn.Config(http=...)`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))


# The gateway's uvicorn settings for serving (gateway/__main__.py; bench/ceilings/send_once.py
# serves the ceiling app with the same, so the two stay comparable).
UVICORN_OPTIONS = {
    "loop": "uvloop",
    "http": GatewayHttpProtocol,  # one send() per response
    "proxy_headers": False,  # nothing here reads the client address; saves ~3 us/request
    "server_header": False,  # no "server: uvicorn" to validate and write per response
    "access_log": False,
    "lifespan": "on",
    "log_level": "warning",
}
