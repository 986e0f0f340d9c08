"""The other gateways of this server, asked over their Unix sockets for their own numbers.

Gateway k serves the same app on TCP and on `wire.gateway_http_path(runtime_dir, k)`. For
/metrics, /admin/status and the statistics extension, the gateway that a client reached asks
every other one for `?scope=gateway` (its own share) and merges the answers (gateway/cluster/merge.py),
so that whichever gateway answers, it answers for the whole server.

Every peer is asked at once and given PEER_TIMEOUT_S in all: a peer that is restarting
(no socket file, nobody listening on it, or no answer in time) is reported as unreachable,
never as an error to the client, and the client gets exactly one answer.

Changes that every gateway must hold (the system shared-memory regions a client registers or
unregisters, gateway/core/regions.py) are POSTed the same way with `?scope=gateway`.

Trust: a peer call is one that arrived on this gateway's own Unix socket (`is_peer_call`), which
only the server's user can reach (the runtime dir is 0700). So `?scope=gateway` is accepted there
only (gateway/http/responses.py: scope_of), and the API key is neither needed there nor ever sent: a
socket file that is not ours (a runtime dir someone else could write to) must not receive it.

The HTTP client is hand-written on `asyncio.open_unix_connection` (one GET or POST with
`Connection: close`, a Content-Length body): no HTTP client is a runtime dependency of the
server (httpx is a test extra), and these are our own responses over a socket in our own 0700
runtime dir, so a small strict reader is enough.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson

from ringserve.common import wire

PEER_TIMEOUT_S = 0.5  # for all the peers together: they are asked at once
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a /metrics text is ~100 KiB; anything near this is not ours
MAX_HEAD_BYTES = 64 * 1024
SCOPE_GATEWAY = "gateway"  # `?scope=gateway`: one gateway's own numbers, never merged


@dataclass(frozen=True)
class PeerAnswer:
    """What gateway `gateway_index` answered, or why there is no answer (`error`)."""

    gateway_index: int
    status: int = 0
    body: bytes = b""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    def problem(self) -> str:
        """Why this answer cannot be merged ('' when it can)."""
        if self.error is not None:
            return self.error
        return "" if self.status == 200 else f"answered HTTP {self.status}"

    def json_object(self) -> dict | str:
        """The JSON object this peer answered, or why there is none."""
        problem = self.problem()
        if problem:
            return problem
        try:
            doc = orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            return f"answered with invalid JSON: {exc}"
        return doc if isinstance(doc, dict) else "answered with JSON that is not an object"


class Peers:
    """Gateways 0..count-1 other than `index`, on their Unix sockets in `runtime_dir`."""

    def __init__(self, runtime_dir: str, index: int = 0, count: int = 1, timeout_s: float = PEER_TIMEOUT_S) -> None:
        self.runtime_dir = runtime_dir
        self.index = index
        self.count = count
        self.timeout_s = timeout_s
        # ASGI's `server` of a request on this gateway's own Unix socket: (its path, no port).
        self._own_server = (self.path_of(index), None)

    def others(self) -> list[int]:
        return [k for k in range(self.count) if k != self.index]

    def is_peer_call(self, scope: dict) -> bool:
        """Did this request come in on this gateway's own Unix socket (from a peer, or the server's user)?"""
        server = scope.get("server")
        return server is not None and tuple(server) == self._own_server

    def path_of(self, index: int) -> str:
        return wire.gateway_http_path(self.runtime_dir, index)

    async def get(self, path: str) -> list[PeerAnswer]:
        """GET `path` (path and query) from every other gateway at once; one PeerAnswer each, in index order."""
        return await self._ask_all("GET", path, None)

    async def post(self, path: str, body: bytes = b"") -> list[PeerAnswer]:
        """POST `body` (JSON) to `path` at every other gateway at once (a change each must apply too,
        with `?scope=gateway` so that it goes no further); one PeerAnswer each, in index order."""
        return await self._ask_all("POST", path, body)

    async def _ask_all(self, method: str, path: str, body: bytes | None) -> list[PeerAnswer]:
        others = self.others()
        if not others:
            return []
        request = f"{method} {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n".encode("latin-1")
        if body is not None:
            request += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode("latin-1") + body
        else:
            request += b"\r\n"
        return list(await asyncio.gather(*(self._ask(k, request) for k in others)))

    async def _ask(self, index: int, request: bytes) -> PeerAnswer:
        try:
            async with asyncio.timeout(self.timeout_s):
                status, body = await _exchange(self.path_of(index), request)
        except TimeoutError:
            return PeerAnswer(index, error=f"no answer within {self.timeout_s:g} s")
        except FileNotFoundError:
            return PeerAnswer(index, error="not running (no socket)")
        except ConnectionRefusedError:
            return PeerAnswer(index, error="not running (connection refused)")
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError) as exc:
            return PeerAnswer(index, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return PeerAnswer(index, status, body)


async def _exchange(path: str, request: bytes) -> tuple[int, bytes]:
    """One request on a new connection: (status, body). ValueError for an answer that is not HTTP we can read."""
    reader, writer = await asyncio.open_unix_connection(path, limit=MAX_HEAD_BYTES)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP status line: {lines[0][:80]!r}")
        status = int(rest[:3])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "transfer-encoding":
                raise ValueError(f"transfer-encoding {value.strip()} is not read here")
        if length is None:  # (connection: close) the body runs to the end
            body = await reader.read(MAX_ANSWER_BYTES + 1)
            while len(body) <= MAX_ANSWER_BYTES and (more := await reader.read(MAX_ANSWER_BYTES + 1 - len(body))):
                body += more
        elif length > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of {length} bytes")
        else:
            body = await reader.readexactly(length)
        if len(body) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer over {MAX_ANSWER_BYTES} bytes")
        return status, body
    finally:
        writer.close()
