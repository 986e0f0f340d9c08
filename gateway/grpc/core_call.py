"""One call on grpcio's core server (gateway/grpc/core.py runs them): its context, its request stream read
ahead, its response stream's sends in order, and what the poller thread does as each of their completions
comes (so that a stream's next read and next send need no loop turn; core.py's docstring says why).

Part of the gRPC fast path: like core.py it names grpc._cython.cygrpc (the fence in importlinter-fast-paths.ini
allows the two), and only core.py imports it, so core.surface_problem (which checks the names used here too)
runs before anything here is used.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # (no stubs: the Cython layer)

from ringserve.gateway.grpc.context import Aborted, write_through

log = logging.getLogger(__name__)

_OK = getattr(cygrpc.StatusCode, "ok", None)
_CALL_OK = getattr(getattr(cygrpc, "CallError", None), "ok", 0)
_WRITE_BUFFER_HINT = 1  # GRPC_WRITE_BUFFER_HINT (grpc/impl/grpc_types.h): the core may hold it for the next one


def refused_by_core(result: object, what: str) -> bool:
    """A returned grpc_call_error: True (and logged) when the core refused the batch, whose tag will
    never complete; the caller treats its call as over."""
    if result is None or result == _CALL_OK:  # (None: releases that return nothing)
        return False
    log.warning("gRPC core refused %s: grpc_call_error %s", what, result)
    return True


def _status_number(code: grpc.StatusCode | None) -> cygrpc.StatusCode:
    return _OK if code is None else cygrpc.StatusCode(code.value[0])


class OnPoller:
    """A tag whose completions are handled on the poller thread: `completed(event, events)` puts what the
    loop must do then into `events` (as LoopEvent). So a stream's next message is asked for, and its next
    answer started, as the one before completes, without waiting for a loop turn (~4 ms at 64 clients)."""

    __slots__ = ()

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
        raise NotImplementedError


class CoreCall(OnPoller):
    """One RPC, and the context its servicer method gets (grpc.aio's ServicerContext, the part used). It is
    the tag of its own close: the close is taken on the poller thread, and the loop is not woken for it."""

    __slots__ = (
        "call",
        "metadata",
        "arrived_ns",
        "closed",
        "_cancelled",
        "code",
        "details",
        "trailing",
        "_started",
        "serialize",
        "_sends",
        "answered",
        "on_cancel",
    )

    def __init__(self, call: cygrpc.Call, metadata: Sequence[tuple[str, Any]], arrived_ns: int) -> None:
        self.call = call
        self.metadata = metadata
        self.arrived_ns = arrived_ns  # when the poller took the call's arrival (time.perf_counter_ns)
        self.closed = False  # the core said the call is over (answered, cancelled or the client gone)
        self._cancelled = False
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()
        self._started = False  # initial metadata sent
        self.serialize: Callable[[Any], bytes] | None = None  # a response stream's messages' serializer
        self._sends: _Sends | None = None  # a response stream's messages (made by the first send)
        self.answered = False  # answer() was called: the call's status is on its way
        self.on_cancel: Callable[[], None] | None = None  # run on the loop if the client cancels (on_cancelled)

    # -- the context -------------------------------------------------------------------------------
    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self.metadata

    def peer(self) -> str:
        return self.call.peer().decode(errors="replace")

    def cancelled(self) -> bool:
        return self._cancelled

    def on_cancelled(self, callback: Callable[[], None] | None) -> None:
        """Run `callback` on the loop once the client cancels the call (or went away), at once if it has:
        a request running for it is cancelled too (worker/python/decoupled.py). It may run twice. None: no more."""
        self.on_cancel = callback
        # (the poller may have set _cancelled before this, and found no callback then: see completed)
        if self._cancelled and callback is not None:
            asyncio.get_running_loop().call_soon(callback)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing = tuple(metadata)

    async def write(self, message: Any) -> None:
        """Send one message of a response stream; returns once the core has taken it (the client's
        flow-control window). ClientGone when it could not be sent."""
        await write_through(self.send, message)

    def send(
        self,
        message: Any,
        on_sent: Callable[[bool], None] | None = None,
        on_poller: Callable[[list[Any]], None] | None = None,
    ) -> None:
        """Queue one message of a response stream (sent in order, each once the one before it is taken).
        `on_sent(True)` runs on the loop once the core has taken it, `on_sent(False)` if it never will be
        (the client went away, or cancelled); `on_poller(events)` runs on the poller thread once it is taken
        (what needs no loop turn: a stream's credit), putting what the loop must do then into `events`."""
        self._stream_sends().send((message if self.serialize is None else self.serialize(message), on_sent, on_poller))

    def send_failed(self) -> asyncio.Future:
        """Done once a message queued by `send` could not be sent (the client went away, or cancelled)."""
        sends = self._stream_sends()
        if sends.gone is None:
            sends.gone = asyncio.get_running_loop().create_future()
            if sends.failed:
                sends.gone.set_result(None)
        return sends.gone

    def _stream_sends(self) -> _Sends:
        if self._sends is None:
            self._sends = _Sends(self)
        return self._sends

    async def drained(self) -> None:
        """Once every message queued by `send` is sent (or will never be)."""
        if self._sends is not None:
            await self._sends.drained()

    # -- the core's operations -------------------------------------------------------------------
    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
        """(On the poller) the call's close: answered, cancelled or the client gone."""
        self.closed = True
        self._cancelled = event.batch_operations[0].cancelled()
        callback = self.on_cancel
        if self._cancelled and callback is not None:
            events.append(LoopEvent(lambda _: callback()))

    def _start(self, operations: tuple, tag: object) -> bool:
        """Start a batch of sends (the initial metadata with the first); False: the call is over."""
        if not self._started:
            self._started = True
            operations = (cygrpc.SendInitialMetadataOperation((), 0), *operations)
        try:
            return not refused_by_core(self.call.start_server_batch(operations, tag), "a call's sends")
        except ValueError:  # (the call is over)
            return False

    def answer(self, payload: bytes | None) -> None:
        """The call's end: its message (None: none) and its status (set_code, set_details, set_trailing_metadata).
        Once: a method that answered itself (ModelInfer, inside its statistics' span) is not answered again."""
        if self.answered:
            return
        self.answered = True
        status = cygrpc.SendStatusFromServerOperation(self.trailing, _status_number(self.code), self.details, 0)
        operations = (status,) if payload is None else (cygrpc.SendMessageOperation(payload, 0), status)
        self._start(operations, _ANSWERED)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        self.answer(None)


class LoopEvent:
    """What the poller hands the loop that is not the core's: `tag(self)` runs on the loop."""

    __slots__ = ("tag",)

    def __init__(self, tag: Callable[[Any], None]) -> None:
        self.tag = tag


class _Answered(OnPoller):
    """The tag of a call's answer: its completion needs nothing of the loop (the close says the call is over)."""

    __slots__ = ()

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
        pass


_ANSWERED = _Answered()


class RequestStream(OnPoller):
    """A request stream's messages, read ahead while the stream has credit: each message asked of the core
    takes one. `open_window(n)` gives n and `grant()` one more (the servicer's back-pressure: ModelStreamInfer
    grants one per answer sent); without a window, one per message the servicer asks for (read one at a time)."""

    __slots__ = (
        "call",
        "deserialize",
        "lock",
        "credit",
        "reading",
        "ended",
        "windowed",
        "arrived",
        "waiter",
        "arrived_ns",
    )

    def __init__(self, call: CoreCall, deserialize: Callable[[bytes], Any] | None) -> None:
        self.call, self.deserialize = call, deserialize
        self.lock = threading.Lock()  # (credit, reading, ended: the loop grants, the poller reads on)
        self.credit = 0
        self.reading = False  # a message asked of the core and not yet come
        self.ended = False  # the client's end of the stream came (or the call is over)
        self.windowed = False
        # (on the loop) messages not yet taken, each with when the poller took it; None: the end
        self.arrived: deque[tuple[bytes, int] | None] = deque()
        self.waiter: asyncio.Future | None = None  # the servicer, waiting for the next message
        self.arrived_ns = 0  # when the poller took the message __anext__ returned last (time.perf_counter_ns)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    def open_window(self, size: int) -> None:
        """Read up to `size` messages ahead of their answers; each `grant()` lets one more be read."""
        self.windowed = True
        self.grant(size)

    def grant(self, count: int = 1, events: list[cygrpc.BaseEvent | LoopEvent] | None = None) -> None:
        """`count` more messages may be read: on the loop, or on the poller with its `events`."""
        with self.lock:
            self.credit += count
            if self.reading or self.ended or self.credit <= 0:
                return
            self.credit -= 1
            self.reading = True
        if self._receive():
            return
        if events is None:
            self._arrive(None)
        else:
            events.append(LoopEvent(functools.partial(self._arrive, None)))

    def _receive(self) -> bool:
        try:
            refused = refused_by_core(
                self.call.call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), self), "a stream's receive"
            )
        except ValueError:  # (the call is over)
            refused = True
        if refused:
            with self.lock:
                self.reading, self.ended = False, True
        return not refused

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
        message = event.batch_operations[0].message() if event.success else None
        arrival = None if message is None else (message, time.perf_counter_ns())
        with self.lock:
            if message is None:  # the client's end of the stream (or the call is over)
                self.ended = True
            more = not self.ended and self.credit > 0
            if more:
                self.credit -= 1
            else:
                self.reading = False
        events.append(LoopEvent(functools.partial(self._arrive, arrival)))
        if more and not self._receive():
            events.append(LoopEvent(functools.partial(self._arrive, None)))

    def _arrive(self, arrival: tuple[bytes, int] | None, event: object = None) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            waiter.set_result(arrival)
        else:
            self.arrived.append(arrival)

    async def __anext__(self) -> Any:
        if self.arrived:
            arrival = self.arrived.popleft()
        else:
            if not self.windowed:
                self.grant()
            self.waiter = asyncio.get_running_loop().create_future()
            arrival = await self.waiter
        if arrival is None:
            self.arrived.appendleft(None)  # (every later call ends too)
            raise StopAsyncIteration
        message, self.arrived_ns = arrival
        return message if self.deserialize is None else self.deserialize(message)


_Send = tuple[bytes, "Callable[[bool], None] | None", "Callable[[list], None] | None"]  # see CoreCall.send


class _Sends(OnPoller):
    """A response stream's messages, in order, one at a time (the core takes one send of a call at a time):
    the next is started on the poller thread as the one before completes."""

    __slots__ = ("call", "lock", "current", "queue", "failed", "waiter", "gone")

    def __init__(self, call: CoreCall) -> None:
        self.call = call
        self.lock = threading.Lock()  # (current, queue, failed, waiter: the loop queues, the poller sends on)
        self.current: _Send | None = None  # the message being sent
        self.queue: deque[_Send] = deque()
        self.failed = False  # a send failed: the client is gone, nothing more is sent
        self.waiter: asyncio.Future | None = None  # drained()
        self.gone: asyncio.Future | None = None  # CoreCall.send_failed()

    def send(self, item: _Send) -> None:
        with self.lock:
            if not self.failed and self.current is not None:
                self.queue.append(item)
                return
            failed = self.failed
            if not failed:
                self.current = item
        if failed:
            self._finish([item], False)
        elif not self._begin(item[0]):
            self._finish(self._fail(), False)

    def _begin(self, payload: bytes, flags: int = 0) -> bool:
        return self.call._start((cygrpc.SendMessageOperation(payload, flags),), self)

    def _fail(self) -> list[_Send]:
        with self.lock:
            self.failed = True
            items = [item for item in (self.current, *self.queue) if item is not None]
            self.current = None
            self.queue.clear()
        return items

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
        if not event.success:
            events.append(LoopEvent(functools.partial(self._finish, self._fail(), False)))
            return
        with self.lock:
            done = self.current
            self.current = self.queue.popleft() if self.queue else None
            following = self.current
            more = bool(self.queue)
            waiter = self.waiter if following is None else None
        if done is not None and done[2] is not None:
            done[2](events)
        if done is not None and done[1] is not None:  # (_finish also ends a drained() wait)
            events.append(LoopEvent(functools.partial(self._finish, [done], True)))
        elif waiter is not None:
            events.append(LoopEvent(functools.partial(self._drained, waiter)))
        if following is not None and not self._begin(following[0], _WRITE_BUFFER_HINT if more else 0):
            events.append(LoopEvent(functools.partial(self._finish, self._fail(), False)))

    def _finish(self, items: list[_Send], sent: bool, event: object = None) -> None:
        """(On the loop) `items` are sent, or never will be."""
        if not sent and self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
        for _, on_sent, _ in items:
            if on_sent is None:
                continue
            try:
                on_sent(sent)
            except Exception:  # (one answer's callback must not keep the others')
                log.exception("gRPC send callback failed")
        with self.lock:
            waiter = self.waiter if self.current is None else None
        if waiter is not None:
            self._drained(waiter)

    def _drained(self, waiter: asyncio.Future, event: object = None) -> None:
        if self.waiter is waiter:
            self.waiter = None
        if not waiter.done():
            waiter.set_result(None)

    async def drained(self) -> None:
        with self.lock:
            if self.current is None:
                return
            self.waiter = waiter = asyncio.get_running_loop().create_future()
        await waiter
