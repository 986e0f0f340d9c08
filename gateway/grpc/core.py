"""The gRPC listener: grpcio's core server, its completion queue drained into the gateway's event loop.

Why not grpc.aio: a ModelInfer that answered at once cost grpc.aio 215-270 µs of the gateway's CPU
a call (its Cython coroutines, a future per operation, a wake-up per event), three times a whole HTTP
JSON request, and since each call woke the loop on its own, requests that arrived together reached
the batcher one at a time (1.1 inferences per execution at 64 clients, against HTTP's 15.6). Here
one thread blocks on the core's completion queue with the GIL released, takes every event that is
ready, and hands them to the loop in one callback, so a loop turn starts every call that arrived
meanwhile and they batch as HTTP's do; a call costs four completions (its arrival, its message, its
answer, its close) and one task. Only the message's reaches the loop: the poller takes the others itself
(the answer's and the close's need no loop turn; handing them over woke the loop once more per call, and
keeping them on the poller gave unary calls +4 % infer/s side by side).

The poller itself accepts each call: it asks for the call's message (and its close) as it takes the
arrival, so the message's completion is the first the loop hears of a unary call. Each hand-off to
the loop waits for the loop's turn, ~4 ms at 64 clients, and a call the loop had to accept
(arrival, then its message) waited two of them (perf_analyzer's server "overhead": 14.6 ms against
HTTP's 3.6).

A stream's reads and sends are chained on the poller thread too: the core takes one receive and one
send of a call at a time, and perf_analyzer keeps 4 requests in flight on each of its streams, so
when each next receive (and each next answer) waited for a loop turn, a request waited ~8 ms for its
stream's others to be read and answered. RequestStream reads ahead within the credit its servicer
gives (ModelStreamInfer's window: the back-pressure), CoreCall.send queues a stream's answers, and
each completion starts the next on the poller; an answer's credit comes back there as well. An answer
with another queued behind it goes with GRPC_WRITE_BUFFER_HINT, so the core may write them together (the
last one, without it, flushes): streams +4 % infer/s side by side.

No other library serves gRPC on an asyncio loop from Python (grpclib is pure Python HTTP/2, slower
still), so this module talks to `grpc._cython.cygrpc`, the layer grpcio's own servers are built on,
with the calls its synchronous server makes (grpc/_server.py).

What grpcio's core still does: HTTP/2, the message size limits and decompression (channel options),
--grpc-max-connections (`grpc.max_allowed_incoming_connections`), SO_REUSEPORT. The servicer methods
are the generated service's (gateway/grpc/server.py), called with a `CoreCall` as their context: the
part of grpc.aio's ServicerContext they use.
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

# The grpcio releases this fast path has been run on (CI, and the floor measured where its surface begins:
# docs/architecture.md): [floor, ceiling). Outside them, or when `surface_problem` finds the names below
# changed, the gateway logs why and serves gRPC on grpc.aio instead (gateway/grpc/listener.py).
GRPCIO_FLOOR = (1, 60)
GRPCIO_CEILING = (1, 86)
# Every cygrpc name this module uses; `surface_problem` checks each exists before the gateway serves on it.
SURFACE = (
    "Server",
    "CompletionQueue",
    "CompletionType.queue_timeout",
    "CompletionType.queue_shutdown",
    "StatusCode.ok",
    "CallError.ok",
    "SendInitialMetadataOperation",
    "SendMessageOperation",
    "SendStatusFromServerOperation",
    "ReceiveMessageOperation",
    "ReceiveCloseOnServerOperation",
    "Server.request_call",
    "Server.add_http2_port",
    "Server.cancel_all_calls",
    "Call.start_server_batch",
    "Call.peer",
)

# Calls asked of the core ahead of their arrival: a burst of connections' calls all arrive in one drain.
CALLS_REQUESTED_AHEAD = 64
_SHUTDOWN = object()  # the tag of the server's shutdown
_CALL = object()  # the tag of a call's arrival (the poller accepts calls: CoreServer._accept)


def surface_problem() -> str | None:
    """Why this fast path cannot serve with the grpcio installed (None: it can): a release outside the
    window, a name it uses gone, or a server that is not made and polled as it expects."""
    version = grpc.__version__
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if not GRPCIO_FLOOR <= numbers < GRPCIO_CEILING:
        window = f"{'.'.join(map(str, GRPCIO_FLOOR))} <= grpcio < {'.'.join(map(str, GRPCIO_CEILING))}"
        return f"grpcio {version} is outside the releases it was run on ({window})"
    missing = [name for name in SURFACE if not _has(cygrpc, name)]
    if missing:
        return f"grpcio {version}'s grpc._cython.cygrpc lacks {', '.join(missing)}"
    try:  # the shapes: Server(options, optimization), a queue polled with a deadline
        server, queue = cygrpc.Server((), False), cygrpc.CompletionQueue()
        server.register_completion_queue(queue)
        if queue.poll(0).completion_type != cygrpc.CompletionType.queue_timeout:
            return f"grpcio {version}'s completion queue does not time out as expected"
        server.destroy()
        queue.shutdown()
    except Exception as exc:  # noqa: BLE001 - any failure here means the fast path cannot trust this grpcio
        return f"grpcio {version}'s core server is not made as expected ({exc!r})"
    return None


def _has(root: object, dotted: str) -> bool:
    for part in dotted.split("."):
        root = getattr(root, part, None)
        if root is None:
            return False
    return True


def _refused(result: object, what: str) -> bool:
    """A returned grpc_call_error: True (and logged) when the core refused the batch, whose tag will
    never complete; the caller treats its call as over."""
    if result is None or result == _CALL_OK:  # (None: releases that return nothing)
        return False
    log.warning("gRPC core refused %s: grpc_call_error %s", what, result)
    return True


_QUEUE_TIMEOUT = getattr(cygrpc.CompletionType, "queue_timeout", None)
_QUEUE_SHUTDOWN = getattr(cygrpc.CompletionType, "queue_shutdown", None)
_OK = getattr(cygrpc.StatusCode, "ok", None)
_CALL_OK = getattr(getattr(cygrpc, "CallError", None), "ok", 0)
_WRITE_BUFFER_HINT = 1  # GRPC_WRITE_BUFFER_HINT (grpc/impl/grpc_types.h): the core may hold it for the next one


def _status_number(code: grpc.StatusCode | None) -> cygrpc.StatusCode:
    return _OK if code is None else cygrpc.StatusCode(code.value[0])


class _OnPoller:
    """A tag whose completions are handled on the poller thread: `completed(event, events)` puts what the
    loop must do then into `events` (as _LoopEvent). So a stream's next message is asked for, and its next
    answer started, as the one before completes, without waiting for a loop turn (~4 ms at 64 clients)."""

    __slots__ = ()

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
        raise NotImplementedError


class CoreCall(_OnPoller):
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
        a request running for it is cancelled too (worker/decoupled.py). It may run twice. None: no more."""
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
    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
        """(On the poller) the call's close: answered, cancelled or the client gone."""
        self.closed = True
        self._cancelled = event.batch_operations[0].cancelled()
        callback = self.on_cancel
        if self._cancelled and callback is not None:
            events.append(_LoopEvent(lambda _: callback()))

    def _start(self, operations: tuple, tag: object) -> bool:
        """Start a batch of sends (the initial metadata with the first); False: the call is over."""
        if not self._started:
            self._started = True
            operations = (cygrpc.SendInitialMetadataOperation((), 0), *operations)
        try:
            return not _refused(self.call.start_server_batch(operations, tag), "a call's sends")
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


class _LoopEvent:
    """What the poller hands the loop that is not the core's: `tag(self)` runs on the loop."""

    __slots__ = ("tag",)

    def __init__(self, tag: Callable[[Any], None]) -> None:
        self.tag = tag


class _Answered(_OnPoller):
    """The tag of a call's answer: its completion needs nothing of the loop (the close says the call is over)."""

    __slots__ = ()

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
        pass


_ANSWERED = _Answered()


class RequestStream(_OnPoller):
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

    def grant(self, count: int = 1, events: list[cygrpc.BaseEvent | _LoopEvent] | None = None) -> None:
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
            events.append(_LoopEvent(functools.partial(self._arrive, None)))

    def _receive(self) -> bool:
        try:
            refused = _refused(
                self.call.call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), self), "a stream's receive"
            )
        except ValueError:  # (the call is over)
            refused = True
        if refused:
            with self.lock:
                self.reading, self.ended = False, True
        return not refused

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
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
        events.append(_LoopEvent(functools.partial(self._arrive, arrival)))
        if more and not self._receive():
            events.append(_LoopEvent(functools.partial(self._arrive, None)))

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


class _Sends(_OnPoller):
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

    def completed(self, event: cygrpc.BaseEvent, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
        if not event.success:
            events.append(_LoopEvent(functools.partial(self._finish, self._fail(), False)))
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
            events.append(_LoopEvent(functools.partial(self._finish, [done], True)))
        elif waiter is not None:
            events.append(_LoopEvent(functools.partial(self._drained, waiter)))
        if following is not None and not self._begin(following[0], _WRITE_BUFFER_HINT if more else 0):
            events.append(_LoopEvent(functools.partial(self._finish, self._fail(), False)))

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


class CoreServer:
    """grpcio's core server on the running loop, serving `handlers` ({"/service/Method": handler} with
    coroutine behaviours, as grpc.unary_unary_rpc_method_handler and the generated code make them)."""

    loop: asyncio.AbstractEventLoop  # (these three from start())
    stopped: asyncio.Future  # the shutdown's completion
    poller: threading.Thread

    def __init__(self, options: Sequence[tuple[str, Any]], handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server = cygrpc.Server(tuple(options), False)
        self.queue = cygrpc.CompletionQueue()
        self.server.register_completion_queue(self.queue)
        # (typed Any: grpc's stubs type a handler's behaviours as synchronous and each one optional)
        self.handlers: dict[bytes, Any] = {method.encode(): handler for method, handler in handlers.items()}
        self.tasks: set[asyncio.Task] = set()
        self.serving = False

    def add_port(self, address: str) -> int:
        """Bind; the port (0: not bound). grpcio >= 1.60 raises RuntimeError instead of 0."""
        return self.server.add_http2_port(address.encode())

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = self.loop.create_future()
        self.server.start()
        self.serving = True
        for _ in range(CALLS_REQUESTED_AHEAD):
            _refused(self.server.request_call(self.queue, self.queue, _CALL), "a call's request")
        self.poller = threading.Thread(target=self._poll, name="grpc-poller", daemon=True)
        self.poller.start()

    async def stop(self, grace_s: float) -> None:
        """New calls refused at once; running ones get `grace_s`, then are cancelled."""
        if not self.serving:
            return
        self.serving = False
        self.server.shutdown(self.queue, _SHUTDOWN)
        try:
            await asyncio.wait_for(asyncio.shield(self.stopped), grace_s)
        except TimeoutError:
            self.server.cancel_all_calls()
            await self.stopped
        if self.tasks:  # (cancelled calls' servicers see their calls cancelled and end)
            await asyncio.wait(list(self.tasks), timeout=max(grace_s, 0.1))
        self.queue.shutdown()
        await asyncio.get_running_loop().run_in_executor(None, self.poller.join)
        self.server.destroy()

    # -- the poller thread -------------------------------------------------------------------------
    def _poll(self) -> None:
        """Wait for an event (GIL released), take every event ready with it, hand them all to the loop;
        a call's arrival is accepted here (`_accept`)."""
        queue, loop = self.queue, self.loop
        while True:
            event = queue.poll()
            now = time.perf_counter_ns()
            events: list[cygrpc.BaseEvent | _LoopEvent] = []
            while event.completion_type != _QUEUE_TIMEOUT:  # (poll(0): nothing more ready)
                if event.completion_type == _QUEUE_SHUTDOWN:
                    loop.call_soon_threadsafe(self._on_events, events)
                    return
                tag = event.tag
                if tag is _CALL:
                    try:
                        self._accept(event, now, events)
                    except Exception:  # (a bug here must not stop the poller)
                        log.exception("gRPC call accept failed")
                elif isinstance(tag, _OnPoller):
                    try:
                        tag.completed(event, events)
                    except Exception:
                        log.exception("gRPC stream event handling failed")
                else:
                    events.append(event)
                event = queue.poll(0)
            if not events:  # (calls accepted, nothing yet for the loop)
                continue
            try:
                loop.call_soon_threadsafe(self._on_events, events)
            except RuntimeError:  # the loop closed under a gateway that exits
                return

    def _on_events(self, events: list[cygrpc.BaseEvent | _LoopEvent]) -> None:
        for event in events:
            tag = event.tag
            if tag is _SHUTDOWN:
                if not self.stopped.done():
                    self.stopped.set_result(None)
                continue
            try:
                tag(event)
            except Exception:  # (a bug here must not stop the other calls' events)
                log.exception("gRPC event handling failed")

    # -- a call ------------------------------------------------------------------------------------
    def _accept(
        self, event: cygrpc.RequestCallEvent, arrived_ns: int, events: list[cygrpc.BaseEvent | _LoopEvent]
    ) -> None:
        """On the poller thread: a call's arrival. The next call asked for, the call's close and (unary)
        its message asked for at once; a stream's start goes to the loop (in `events`)."""
        if not event.success:  # (asked for before the shutdown)
            return
        if self.serving:
            try:
                _refused(self.server.request_call(self.queue, self.queue, _CALL), "a call's request")
            except ValueError:  # (the loop began the shutdown meanwhile)
                pass
        call = CoreCall(event.call, event.invocation_metadata, arrived_ns)
        if _refused(call.call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), call), "a call's close"):
            call.closed = call._cancelled = True  # (no close will come: the call is treated as over)
        handler = self.handlers.get(event.call_details.method)
        if handler is None:
            call.fail(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        elif handler.request_streaming:
            events.append(_LoopEvent(functools.partial(self._start_stream, call, handler)))
        elif _refused(
            call.call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(0),), functools.partial(self._on_message, call, handler)
            ),
            "a call's receive",
        ):
            call.fail(grpc.StatusCode.INTERNAL, "the server could not receive the request")

    def _start_stream(self, call: CoreCall, handler: Any, event: _LoopEvent) -> None:
        self._run(self._stream(call, handler))

    def _on_message(self, call: CoreCall, handler: Any, event: cygrpc.BaseEvent) -> None:
        message = event.batch_operations[0].message() if event.success else None
        if message is None:  # the client cancelled before its message came (nothing to answer)
            call.fail(grpc.StatusCode.CANCELLED, "no request message")
            return
        self._run(self._unary(call, handler, message))

    def _run(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _unary(self, call: CoreCall, handler: Any, message: bytes) -> None:
        try:
            request = message if handler.request_deserializer is None else handler.request_deserializer(message)
        except Exception as exc:  # noqa: BLE001 - any deserializer's failure is the client's message's fault
            call.fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the message is not this method's request in protobuf's encoding ({exc})",
            )
            return
        del message
        try:
            response = await handler.unary_unary(request, call)
        except Aborted as exc:
            call.fail(exc.code, exc.details)
            return
        except Exception:
            log.exception("gRPC method failed")
            call.fail(grpc.StatusCode.UNKNOWN, "Unexpected error in the server")
            return
        if call.answered:  # (the method answered itself)
            return
        if response is None:  # (the method set its status instead)
            call.answer(None)
        else:
            serialize = handler.response_serializer
            call.answer(response if serialize is None else serialize(response))

    async def _stream(self, call: CoreCall, handler: Any) -> None:
        call.serialize = handler.response_serializer
        code, details = None, ""
        try:
            await handler.stream_stream(RequestStream(call, handler.request_deserializer), call)
        except Aborted as exc:
            code, details = exc.code, exc.details
        except Exception:
            log.exception("gRPC stream failed")
            code, details = grpc.StatusCode.UNKNOWN, "Unexpected error in the server"
        await call.drained()  # (the status goes after every message the servicer sent)
        if code is None:
            call.answer(None)
        else:
            call.fail(code, details)
