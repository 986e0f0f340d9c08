"""Request ids and the access log: what every answer of the gateway carries, HTTP or gRPC.

Request ids. A client's `X-Request-ID` is kept when it is 1 to 128 characters of
`A-Z a-z 0-9 - . _ : + / = @` (UUIDs, ULIDs, base64, nginx's $request_id, AWS/GCP trace
ids). Any other (empty, longer, spaces, quotes, control characters, non-ASCII) is replaced by
one the gateway makes, never refused: the id is a tracing aid, and a proxy that sends a long
one must not fail inference. The bound and the character set keep it out of reach of log
and header injection (it is written into log lines, JSON and a response header).

Made ids: 12 random hex digits per gateway process, '-', then a counter ('3f9c0a1b2d4e-17').
48 random bits make two processes' prefixes collide with odds of 1 in 2^48 per pair, and one
costs ~0.1 µs where uuid4 cost ~3 µs here (a getrandom() call per request).

The KServe body's `id` (InferRequest.kserve_id) is a different thing: the protocol's own
field, echoed in the response body as the protocol says and nothing else. A client that wants
one id everywhere sends the same value in both.

The access log (--access-log, off by default): one line per answered request, on the logger
`ringserve.access` at INFO, in the process's --log-format; the JSON object has the fields
method, path, status, bytes, latency_ms, model, batch_size and request_id. Off, nothing here
runs: the callers test for `None`.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from contextvars import ContextVar

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID_CHARS = 128
_ID_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._:+/=@"
_PREFIX = secrets.token_hex(6) + "-"
_COUNTER = itertools.count(1)

# The id of the request a Starlette route is answering (set per request task by GatewayApp), for
# error bodies written deep in a handler. The raw infer path passes its id explicitly.
current_request_id: ContextVar[str | None] = ContextVar("ringserve_request_id", default=None)


def new_request_id() -> str:
    return f"{_PREFIX}{next(_COUNTER)}"


def request_id_of(value: bytes | str | None) -> str:
    """The request's id: the client's X-Request-ID (bytes from HTTP, str from gRPC metadata) when
    it is acceptable (see the module doc), else a new one. The hook for every protocol."""
    if value:
        if type(value) is str:
            if not value.isascii():
                return new_request_id()
            value = value.encode()
        if len(value) <= MAX_REQUEST_ID_CHARS and not value.translate(None, _ID_CHARS):
            return value.decode()
    return new_request_id()


def header_request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """request_id_of the X-Request-ID among raw ASGI headers (routes other than the infer path)."""
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            return request_id_of(value)
    return new_request_id()


class AccessLog:
    """Writes the access log's lines; exists only with --access-log."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("ringserve.access")
        self.logger.setLevel(logging.INFO)  # asked for by its own flag: shown even under --log-level WARNING

    def write(
        self,
        method: str,
        path: str,
        status: int,
        nbytes: int,
        started_ns: int,
        request_id: str,
        model: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        """One request, answered now; `started_ns` is when it started (time.perf_counter_ns()).
        `batch_size`: the rows of the batch it ran in (None: it ran in none)."""
        latency_ms = round((time.perf_counter_ns() - started_ns) / 1e6, 3)
        fields = {
            "method": method,
            "path": path,
            "status": status,
            "bytes": nbytes,
            "latency_ms": latency_ms,
            "model": model,
            "batch_size": batch_size,
            "request_id": request_id,
        }
        self.logger.info(
            "%s %s %d %dB %.3fms model=%s batch_size=%s request_id=%s",
            method,
            path,
            status,
            nbytes,
            latency_ms,
            model or "-",
            batch_size or "-",
            request_id,
            extra={"access": fields},
        )
