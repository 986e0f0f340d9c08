"""What the gRPC servicer (gateway/grpc/server.py) asks of the engine that runs it, whichever it is: the
fast path on grpcio's core (gateway/grpc/core.py) or grpcio's public grpc.aio (gateway/grpc/aio.py).

A call's context is the part of grpc.aio's ServicerContext the servicer uses, plus what the fast path
added for speed: `answer` (a unary call answered inside its statistics' span), `send` (a stream's answers
queued in order, `on_poller` run once one is taken), `send_failed` and `drained`. A request stream
reads ahead within a window its servicer opens (`open_window`, `grant`). Neither engine's module is
imported here, so the servicer runs on either, and one that cannot start (a grpcio whose private names
moved) never keeps the other from serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc


class Aborted(Exception):
    """What `CallContext.abort` raises: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ClientGone(Exception):
    """A message could not be sent: the client went away (or cancelled)."""


async def write_through(send: Callable[..., None], message: Any) -> None:
    """A stream's `write` on either engine: `send(message, on_sent)` queues it, and this returns once the engine
    has taken it; ClientGone when it never will be (the client went away)."""
    future = asyncio.get_running_loop().create_future()

    def on_sent(sent: bool) -> None:
        if not future.done():
            future.set_result(sent)

    send(message, on_sent)
    if not await future:
        raise ClientGone()


class CallContext(Protocol):
    """One RPC, as its servicer method sees it."""

    arrived_ns: int  # when the engine took the call (time.perf_counter_ns)

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]: ...
    def peer(self) -> str: ...
    def cancelled(self) -> bool: ...
    async def abort(self, code: grpc.StatusCode, details: str = "") -> None: ...
    def set_code(self, code: grpc.StatusCode) -> None: ...
    def set_details(self, details: str) -> None: ...
    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None: ...
    def answer(self, payload: bytes | None) -> None: ...

    def send(
        self,
        message: Any,
        on_sent: Callable[[bool], None] | None = None,
        on_poller: Callable[[list[Any]], None] | None = None,
    ) -> None: ...

    def send_failed(self) -> asyncio.Future: ...
    async def drained(self) -> None: ...


class RequestMessages(Protocol):
    """A request stream's messages, read ahead within the window its servicer opens."""

    arrived_ns: int  # when the engine took the message __anext__ returned last

    def __aiter__(self) -> AsyncIterator[Any]: ...
    async def __anext__(self) -> Any: ...
    def open_window(self, size: int) -> None: ...
    def grant(self, count: int = 1, events: list[Any] | None = None) -> None: ...
