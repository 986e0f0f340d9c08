"""The window of one gRPC ModelStreamInfer: its requests read and not yet answered back.

A stream is read only while its window has room (--grpc-stream-max-in-flight); an answer frees its
place once grpcio has sent it, which waits for the client's HTTP/2 flow-control window. So a client
that writes and never reads its answers is held back by flow control after that many requests,
where it used to have the gateway queue every request it could write (20,000 in 30 s, +345 MiB).
gateway/grpc/server.py: ModelStreamInfer says why back-pressure rather than refusals.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge
from tritonclient.grpc import service_pb2 as pb


class StreamWindow:
    """One stream's requests read and not yet answered back: at most `cap` (`room`), counted in the
    gauge ringserve_grpc_stream_requests_in_flight (every stream of the gateway together)."""

    def __init__(self, cap: int, gauge: Gauge) -> None:
        self.room = asyncio.Semaphore(cap)
        # (answer, whether it ends its request: a decoupled model's responses before its last do not; an answer
        # of None only ends one), then None when the stream is over
        self.answers: asyncio.Queue[tuple[pb.ModelStreamInferResponse | None, bool] | None] = asyncio.Queue()
        self.gauge = gauge
        self.held = 0

    def read_one(self) -> None:
        """A request was read (after taking room)."""
        self.held += 1
        self.gauge.inc()

    def answered_back(self) -> None:
        """An answer was sent: its room goes to the next request."""
        self.held -= 1
        self.gauge.dec()
        self.room.release()

    def close(self) -> None:
        """The stream is over: what it still held (answers never sent, the client gone) is let go."""
        self.gauge.dec(self.held)
        self.held = 0
