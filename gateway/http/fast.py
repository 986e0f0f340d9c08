"""The HTTP fast path: uvicorn's httptools protocol, with each response leaving in one send().

The only module that imports uvicorn's private names (the import contract in
importlinter-fast-paths.ini holds it to that). It serves only inside the uvicorn versions CI has run
(UVICORN_VERSIONS) and when every name it uses is there (surface_refusal); otherwise
gateway/http/engine.py logs why and serves on uvicorn's public protocol instead.

ASGI answers in two messages, `http.response.start` and `http.response.body`, and uvicorn
writes each to the socket as it comes: two send() calls per response. On loopback and on
virtual machines a send() is most of a request's cost (the kernel runs the whole TCP path,
and wakes the reader, inside it): py-spy put 18 % of the gateway's samples in those two
writes. CoalescingTransport holds what is written during one event-loop step and hands it
to the real transport in one write at the end of the step, so headers and body leave
together. Measured on the raw-ASGI ceiling app alone (wrk, 64 clients): +40 % req/s.

Hand-written because uvicorn has no option for it; everything but write/writelines/close
goes straight to uvicorn's own transport.

The protocol also guards the request head, before any application code (the API key check
included) runs: httptools has no size limit (it joins a header's pieces as they come, so one
60 MB header took 6 s of the event loop) and uvicorn no read timeout for it (connections that
drip a header byte every 10 s stayed open for good). ConnectionLimits: 431 past
max_header_bytes, 408 and close when the head is not complete after header_timeout_s, 503 on
connections opened past max_connections.

Each connection is a descriptor: gateway/descriptors.py fits max_connections, with gRPC's
connections and the shared-memory regions, into the open-files limit at start, so that the
connections past the cap get 503, not EMFILE.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from ringserve.gateway.core.errors import (
    GatewayError,
    HeadersTooLarge,
    HeadTimeout,
    InvalidHttpRequest,
    TooManyConnections,
    error_body,
    status_of,
)
from ringserve.gateway.http.limits import ARRIVED_NS, ConnectionLimits
from ringserve.gateway.observe.access import new_request_id

# The uvicorn releases CI has run this module on: from the floor pyproject declares (constraints-floors.txt)
# to the newest minor of constraints.txt. Outside them the public path serves (gateway/http/engine.py), and a
# newer uvicorn can make the gateway slower, never down. Raise the ceiling once CI has run the new minor.
UVICORN_VERSIONS = ((0, 41, 0), (0, 56))  # >= the first, < the second
# What this module reads of uvicorn beyond its import line: methods it calls or overrides, and attributes
# the protocol's and the cycle's code sets (read from their code objects: an instance attribute has no
# other trace before an instance exists). A release that renames one fails here, at start, not mid-request.
PROTOCOL_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "_unset_keepalive_if_required",
    "_should_upgrade",
    "handle_websocket_upgrade",
    "_unsupported_upgrade_warning",
)
PROTOCOL_ATTRIBUTES = (
    "loop",
    "connections",
    "parser",
    "cycle",
    "flow",
    "transport",
    "url",
    "headers",
    "scope",
    "logger",
)
CYCLE_ATTRIBUTES = (
    "response_started",
    "disconnected",
    "keep_alive",
    "access_log",
    "flow",
    "scope",
    "default_headers",
    "waiting_for_100_continue",
    "transport",
    "response_complete",
    "message_event",
    "on_response",
    "more_body",
    "body",
)


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.30.6' -> (0, 30, 6); '0.56.0rc1' -> (0, 56, 0): the release's numbers, a suffix left off."""
    return tuple(int(part) for part in re.findall(r"^\d+|(?<=\.)\d+", version)[:3])


def surface_refusal(uvicorn_version: str) -> str | None:
    """Why the fast path must not serve on this uvicorn, or None: outside UVICORN_VERSIONS, or a name it
    uses is gone."""
    low, high = UVICORN_VERSIONS
    if not low <= version_tuple(uvicorn_version) < high:
        window = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
        return f"uvicorn {uvicorn_version} is outside the versions it was tested on ({window})"
    missing = [f"HttpToolsProtocol.{name}" for name in PROTOCOL_METHODS if not hasattr(HttpToolsProtocol, name)]
    protocol_sets = _assigned(HttpToolsProtocol, ("__init__", "connection_made", "on_message_begin"))
    missing += [f"HttpToolsProtocol.{name}" for name in PROTOCOL_ATTRIBUTES if name not in protocol_sets]
    cycle_sets = _assigned(RequestResponseCycle, ("__init__",))
    missing += [f"RequestResponseCycle.{name}" for name in CYCLE_ATTRIBUTES if name not in cycle_sets]
    if missing:
        return f"uvicorn {uvicorn_version} lacks {', '.join(missing)}"
    return None


def _assigned(cls: type, methods: tuple[str, ...]) -> set[str]:
    """The names the code of cls's `methods` uses (co_names: attributes set and read, globals)."""
    names: set[str] = set()
    for method in methods:
        code = getattr(getattr(cls, method, None), "__code__", None)
        names.update(code.co_names if code is not None else ())
    return names


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


class RefusedHead(Exception):
    """Raised in a parser callback to stop httptools; data_received answers `error` and closes."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


DEFAULT_LIMITS = ConnectionLimits()


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a CoalescingTransport, with ConnectionLimits on each request head.

    Pass as `uvicorn.Config(http=functools.partial(GatewayHttpProtocol, limits=...))`. The usual
    request's head comes in one read and costs two attribute checks; the head timer is armed
    once per connection, and again only for a head split across reads.
    """

    def __init__(self, *args, limits: ConnectionLimits = DEFAULT_LIMITS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.reading_head = False  # between on_message_begin and on_headers_complete
        self.head_bytes: int | None = None  # of a head unfinished at the end of a read: bytes so far (about)
        self.read_bytes = 0  # of the read being parsed
        self.read_ns = 0  # when it returned
        self.head_timer: asyncio.TimerHandle | None = None
        self.over_cap = False
        self.skipped_body_bytes = 0  # of an upgrade request's body still to come (see read_skipped_body)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))
        self.over_cap = len(self.connections) > self.limits.max_connections  # decided once: first come, first served
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_head_timer()
        cycle = self.cycle  # a request not answered yet may be cancelled (http/routes.py: on_disconnect)
        cancel = None if cycle is None or cycle.response_complete else getattr(cycle, "on_disconnect", None)
        super().connection_lost(exc)
        if cancel is not None:
            cancel()

    def data_received(self, data: bytes) -> None:
        # uvicorn's, plus the head's limits around feed_data.
        self._unset_keepalive_if_required()
        if self.skipped_body_bytes:
            data = self.read_skipped_body(data)
            if not data:
                return
        if self.head_bytes is not None:  # every byte of this read up to the head's end is head
            self.head_bytes += len(data)
        self.read_bytes = len(data)
        self.read_ns = time.perf_counter_ns()  # when this read's requests arrived (ARRIVED_NS)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, RefusedHead):
                self.refuse(exc.__context__.error)
                return
            # uvicorn answers a bare text "Invalid HTTP request received."; this says what the parser
            # refused (a body with both Transfer-Encoding and Content-Length, as requests sends for a
            # generator body with a length) in the JSON every other error has.
            self.logger.debug("invalid HTTP request: %s", exc)
            self.refuse(InvalidHttpRequest(str(exc)))
            return
        except httptools.HttpParserUpgrade as exc:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
                self.skipped_body_bytes = self.declared_body_bytes()
                rest = self.read_skipped_body(data[exc.args[0] :]) if self.skipped_body_bytes else data[exc.args[0] :]
                if rest:
                    self.data_received(rest)  # (a pipelined request behind it)
            return
        if self.reading_head:  # the head goes on in the next read
            if self.head_bytes is None:  # it began in this one: count what was parsed of it
                self.head_bytes = self.parsed_head_bytes()
            if self.head_bytes > self.limits.max_header_bytes:
                self.refuse(HeadersTooLarge(self.head_bytes, self.limits.max_header_bytes))
            elif self.head_timer is None:
                self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[ARRIVED_NS] = self.read_ns  # type: ignore[literal-required]
        self.reading_head = True

    def on_headers_complete(self) -> None:
        # At most the bytes since the head began: when that passes the limit, count the head itself.
        most_bytes = self.read_bytes if self.head_bytes is None else self.head_bytes
        self.reading_head = False
        self.head_bytes = None
        if self.head_timer is not None:
            self.stop_head_timer()
        if most_bytes > self.limits.max_header_bytes:
            size = self.parsed_head_bytes()
            if size > self.limits.max_header_bytes:
                raise RefusedHead(HeadersTooLarge(size, self.limits.max_header_bytes))
        if self.over_cap:
            raise RefusedHead(TooManyConnections(self.limits.max_connections))
        super().on_headers_complete()

    def declared_body_bytes(self) -> int:
        """The Content-Length of the request just parsed (0: none, or chunked: not recovered)."""
        for name, value in self.headers:
            if name == b"content-length":
                return int(value)
        return 0

    def read_skipped_body(self, data: bytes) -> bytes:
        """httptools skips the body of a request that asks to upgrade (curl --http2 sends Upgrade: h2c with
        a POST's body too) and completes it empty; uvicorn's own protocol hands the application that empty
        body. Here the body's bytes go to the request's cycle, as on_body would put them, before its task
        first reads; returns what follows the body (the next request's bytes)."""
        cycle = self.cycle
        taken, rest = data[: self.skipped_body_bytes], data[self.skipped_body_bytes :]
        self.skipped_body_bytes -= len(taken)
        if cycle is not None and not cycle.response_complete:
            cycle.body += taken
            cycle.more_body = self.skipped_body_bytes > 0
            cycle.message_event.set()
        return rest

    def parsed_head_bytes(self) -> int:
        """The URL and the headers parsed so far, each as 'name: value\r\n'."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def head_timed_out(self) -> None:
        self.head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head waits behind a response in progress (reading is paused): not the client's delay.
            self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.head_timed_out)
        elif self.reading_head:
            self.refuse(HeadTimeout(self.limits.header_timeout_s))
        elif not self.transport.is_closing():
            self.transport.close()  # not a byte yet: close as the keep-alive timeout does, with no answer to misread

    def stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def refuse(self, error: GatewayError) -> None:
        """Answer `error` in place of the request whose head this is, and close the connection."""
        self.stop_head_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.more_body:
                # A pipelined head behind a response in progress: finish that response, then close, unanswered.
                cycle.keep_alive = False
                self.flow.pause_reading()
                return
            if cycle.response_started:  # the body under way is broken, but its answer has begun: just close
                self.transport.close()
                return
            # Its body is broken (a bad chunk): answered here; the application sees the client gone.
        # The head is incomplete or not read: the client's X-Request-ID is unknown, so a new id.
        request_id = new_request_id()
        body = error_body(str(error), request_id)
        head = [
            STATUS_LINE[status_of(error)],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: %s\r\n" % request_id.encode(),
        ]
        head += [b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in error.headers.items()]
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()


def write_response(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """The infer path's whole response (status, headers, Content-Length, body) in one write, when `send`
    is uvicorn's cycle in its usual state: keep-alive, not a HEAD, nothing written yet, writes not paused,
    no access log, no `connection` header. False: nothing done, send the ASGI messages instead.

    It does what uvicorn's two send() calls do for such a response but for their per-header checks (a
    regular expression for each name and value, and lowercasing): the infer path's names are its own
    constants and its values its own numbers, words and request ids (request_id_of admits no control
    character). 3 µs of the gateway's ~95 per request at 64 clients (A/B, the gateway pinned to a core).
    tests/unit/test_http_protocol.py checks that the bytes are the ones uvicorn writes, so that a uvicorn
    that changes its cycle fails there, not in production."""
    cycle = getattr(send, "__self__", None)
    if (
        type(cycle) is not RequestResponseCycle
        or cycle.response_started
        or cycle.disconnected
        or not cycle.keep_alive
        or cycle.access_log
        or cycle.flow.write_paused
        or cycle.scope["method"] == "HEAD"
    ):
        return False
    parts = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        parts += (name, b": ", value, b"\r\n")
    for name, value in headers:
        if name == b"connection":  # (an error that closes the connection: uvicorn's send does that)
            return False
        parts += (name, b": ", value, b"\r\n")
    parts += (b"content-length: %d\r\n\r\n" % len(body), body)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.transport.write(b"".join(parts))
    cycle.response_complete = True
    cycle.message_event.set()
    cycle.on_response()
    return True
