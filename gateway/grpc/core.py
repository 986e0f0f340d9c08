"""The gRPC listener: grpcio's core server, its completion queue drained into the gateway's event loop.

Why not grpc.aio: a ModelInfer that answered at once cost grpc.aio 215-270 µs of the gateway's CPU
a call (its Cython coroutines, a future per operation, a wake-up per event), three times a whole HTTP
JSON request, and since each call woke the loop on its own, requests that arrived together reached
the batcher one at a time (1.1 inferences per execution at 64 clients, against HTTP's 15.6). Here
one thread blocks on the core's completion queue with the GIL released, takes every event that is
ready, and hands them to the loop in one callback, so a loop turn starts every call that arrived
meanwhile and they batch as HTTP's do; a call costs four completions (its arrival, its message, its
answer, its close) and one task.

The poller itself accepts each call: it asks for the call's message (and its close) as it takes the
arrival, so the message's completion is the first the loop hears of a unary call. Each hand-off to
the loop waits for the loop's turn, ~4 ms at 64 clients, and a call the loop had to accept
(arrival, then its message) waited two of them (perf_analyzer's server "overhead": 14.6 ms against
HTTP's 3.6).

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
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # (no stubs: the Cython layer)

log = logging.getLogger(__name__)

# Calls asked of the core ahead of their arrival: a burst of connections' calls all arrive in one drain.
CALLS_REQUESTED_AHEAD = 64
_SHUTDOWN = object()  # the tag of the server's shutdown
_CALL = object()  # the tag of a call's arrival (the poller accepts calls: CoreServer._accept)
_QUEUE_TIMEOUT = cygrpc.CompletionType.queue_timeout
_QUEUE_SHUTDOWN = cygrpc.CompletionType.queue_shutdown
_OK = cygrpc.StatusCode.ok


class Aborted(Exception):
    """What `CoreCall.abort` raises: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ClientGone(Exception):
    """A message could not be sent: the client went away (or cancelled)."""


def _status_number(code: grpc.StatusCode | None) -> cygrpc.StatusCode:
    return _OK if code is None else cygrpc.StatusCode(code.value[0])


class CoreCall:
    """One RPC, and the context its servicer method gets (grpc.aio's ServicerContext, the part used)."""

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

    # -- the context -------------------------------------------------------------------------------
    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self.metadata

    def peer(self) -> str:
        return self.call.peer().decode(errors="replace")

    def cancelled(self) -> bool:
        return self._cancelled

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
        payload = message if self.serialize is None else self.serialize(message)
        event = await self._batch((cygrpc.SendMessageOperation(payload, 0),))
        if not event.success:
            raise ClientGone()

    # -- the core's operations -------------------------------------------------------------------
    def _on_close(self, event: cygrpc.BaseEvent) -> None:
        self.closed = True
        self._cancelled = event.batch_operations[0].cancelled()

    def _start(self, operations: tuple, tag: Callable[[cygrpc.BaseEvent], None], sends: bool = True) -> bool:
        if sends and not self._started:
            self._started = True
            operations = (cygrpc.SendInitialMetadataOperation((), 0), *operations)
        try:
            self.call.start_server_batch(operations, tag)
        except ValueError:  # (the call is over)
            return False
        return True

    def _batch(self, operations: tuple, sends: bool = True) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()

        def done(event: cygrpc.BaseEvent) -> None:
            if not future.done():
                future.set_result(event)

        if not self._start(operations, done, sends):
            future.set_result(_FailedEvent)
        return future

    def answer(self, payload: bytes | None) -> None:
        """The call's end: its message (None: none) and its status (set_code, set_details, set_trailing_metadata)."""
        status = cygrpc.SendStatusFromServerOperation(self.trailing, _status_number(self.code), self.details, 0)
        operations = (status,) if payload is None else (cygrpc.SendMessageOperation(payload, 0), status)
        self._start(operations, _ignore)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        self.answer(None)


class _FailedEvent:
    success = False


class _LoopEvent:
    """What the poller hands the loop that is not the core's: `tag(self)` runs on the loop."""

    __slots__ = ("tag",)

    def __init__(self, tag: Callable[[Any], None]) -> None:
        self.tag = tag


def _ignore(event: cygrpc.BaseEvent) -> None:
    pass


class _Requests:
    """A request stream's messages, read one at a time as the servicer asks (its back-pressure)."""

    def __init__(self, call: CoreCall, deserialize: Callable[[bytes], Any] | None) -> None:
        self.call, self.deserialize = call, deserialize

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        event = await self.call._batch((cygrpc.ReceiveMessageOperation(0),), sends=False)
        message = event.batch_operations[0].message() if event.success else None
        if message is None:  # the client's end of the stream (or the call is over)
            raise StopAsyncIteration
        return message if self.deserialize is None else self.deserialize(message)


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
            self.server.request_call(self.queue, self.queue, _CALL)
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
                if event.tag is _CALL:
                    try:
                        self._accept(event, now, events)
                    except Exception:  # (a bug here must not stop the poller)
                        log.exception("gRPC call accept failed")
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
                self.server.request_call(self.queue, self.queue, _CALL)
            except ValueError:  # (the loop began the shutdown meanwhile)
                pass
        call = CoreCall(event.call, event.invocation_metadata, arrived_ns)
        call.call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), call._on_close)
        handler = self.handlers.get(event.call_details.method)
        if handler is None:
            call.fail(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        elif handler.request_streaming:
            events.append(_LoopEvent(functools.partial(self._start_stream, call, handler)))
        else:
            call.call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(0),), functools.partial(self._on_message, call, handler)
            )

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
        if response is None:  # (the method set its status instead)
            call.answer(None)
        else:
            serialize = handler.response_serializer
            call.answer(response if serialize is None else serialize(response))

    async def _stream(self, call: CoreCall, handler: Any) -> None:
        call.serialize = handler.response_serializer
        try:
            await handler.stream_stream(_Requests(call, handler.request_deserializer), call)
        except Aborted as exc:
            call.fail(exc.code, exc.details)
            return
        except Exception:
            log.exception("gRPC stream failed")
            call.fail(grpc.StatusCode.UNKNOWN, "Unexpected error in the server")
            return
        call.answer(None)
