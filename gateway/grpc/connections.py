"""What one gRPC connection may hold at once: inference calls in flight and the bytes of their requests.

HTTP/2 lets a client multiplex any number of calls on one connection, and grpcio's core serves them all:
one connection queued 18,472 unary ModelInfer calls, and with 8 MiB calls took the gateway to 3.2 GB.
Two bounds, per connection:

- calls: `grpc.max_concurrent_streams` (--grpc-max-calls-per-connection) is announced in SETTINGS, so a
  conforming client queues its further calls itself (back-pressure, nothing refused). A client that
  ignores it has the stream refused by the core (REFUSED_STREAM; with grpcio's overload protection a
  stream counts until the server has let go of it, so a rapid-reset flood is bounded too). The ledger
  counts again, for what the core let through before the client had the SETTINGS.
- bytes: the requests' wire bytes a connection's calls hold (--grpc-max-connection-bytes). A call past
  them is refused RESOURCE_EXHAUSTED at once, before it is parsed or queued; a connection holding
  nothing always takes one request, so no request under --max-request-bytes is refused on a quiet
  connection. A stream's requests count until each is answered.

The ledger lives on the loop (the servicer's methods run there); a connection is its peer address.
"""

from __future__ import annotations

from ringserve.gateway.core.errors import GatewayError, PayloadTooLarge

# HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113: at least 100 is recommended; nginx and Go's
# net/http use 128 and 250) and grpcio's default message limit, above any client that works elsewhere.
CALLS_PER_CONNECTION = 256
CONNECTION_BYTES = 256 * 1024 * 1024


class ConnectionFull(PayloadTooLarge):
    """A connection holds as many calls, or request bytes, as it may: RESOURCE_EXHAUSTED (413's gRPC code)."""

    def __init__(self, what: str, held: int, cap: int, flag: str) -> None:
        GatewayError.__init__(
            self,
            f"this connection holds {held} {what} in calls not yet answered, the most it may ({flag} {cap}): "
            "retry once some are answered, or open another connection",
        )


class ConnectionLedger:
    """Calls and request bytes each connection holds, bounded (see the module's docstring)."""

    def __init__(self, max_calls: int = CALLS_PER_CONNECTION, max_bytes: int = CONNECTION_BYTES) -> None:
        self.max_calls, self.max_bytes = max_calls, max_bytes
        self.held: dict[str, list[int]] = {}  # peer -> [calls, bytes]

    def admit(self, peer: str, nbytes: int) -> None:
        """A call (a unary request of `nbytes`, or a stream with 0) begins; ConnectionFull past a bound."""
        held = self.held.get(peer)
        if held is None:
            self.held[peer] = [1, nbytes]
            return
        if held[0] >= self.max_calls:
            raise ConnectionFull("calls", held[0], self.max_calls, "--grpc-max-calls-per-connection")
        self._check_bytes(held, nbytes)
        held[0] += 1
        held[1] += nbytes

    def charge(self, peer: str, nbytes: int) -> None:
        """A stream's request of `nbytes` (its call admitted); ConnectionFull past the bytes' bound."""
        held = self.held.setdefault(peer, [0, 0])
        self._check_bytes(held, nbytes)
        held[1] += nbytes

    def _check_bytes(self, held: list[int], nbytes: int) -> None:
        if held[1] and held[1] + nbytes > self.max_bytes:
            raise ConnectionFull("request bytes", held[1], self.max_bytes, "--grpc-max-connection-bytes")

    def release(self, peer: str, nbytes: int, calls: int = 1) -> None:
        """A call ended (calls=1), or a stream's request was answered (calls=0), giving back `nbytes`."""
        held = self.held.get(peer)
        if held is None:
            return
        held[0] -= calls
        held[1] -= nbytes
        if held[0] <= 0 and held[1] <= 0:
            del self.held[peer]
