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
part of grpc.aio's ServicerContext they use. This module is the server, its poller thread and the
surface check; one call's context and streams are gateway/grpc/core_call.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # (no stubs: the Cython layer)

from ringserve.gateway.grpc.context import Aborted
from ringserve.gateway.grpc.core_call import CoreCall, LoopEvent, OnPoller, RequestStream, refused_by_core

log = logging.getLogger(__name__)

# The grpcio releases this fast path has been run on (CI, and the floor measured where its surface begins:
# docs/architecture.md): [floor, ceiling). Outside them, or when `surface_problem` finds the names below
# changed, the gateway logs why and serves gRPC on grpc.aio instead (gateway/grpc/listener.py).
GRPCIO_FLOOR = (1, 60)
GRPCIO_CEILING = (1, 86)
# Every cygrpc name this module and core_call.py use; `surface_problem` checks each exists before the gateway
# serves on it.
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


_QUEUE_TIMEOUT = getattr(cygrpc.CompletionType, "queue_timeout", None)
_QUEUE_SHUTDOWN = getattr(cygrpc.CompletionType, "queue_shutdown", None)


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
            refused_by_core(self.server.request_call(self.queue, self.queue, _CALL), "a call's request")
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
            events: list[cygrpc.BaseEvent | LoopEvent] = []
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
                elif isinstance(tag, OnPoller):
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

    def _on_events(self, events: list[cygrpc.BaseEvent | LoopEvent]) -> None:
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
        self, event: cygrpc.RequestCallEvent, arrived_ns: int, events: list[cygrpc.BaseEvent | LoopEvent]
    ) -> None:
        """On the poller thread: a call's arrival. The next call asked for, the call's close and (unary)
        its message asked for at once; a stream's start goes to the loop (in `events`)."""
        if not event.success:  # (asked for before the shutdown)
            return
        if self.serving:
            try:
                refused_by_core(self.server.request_call(self.queue, self.queue, _CALL), "a call's request")
            except ValueError:  # (the loop began the shutdown meanwhile)
                pass
        call = CoreCall(event.call, event.invocation_metadata, arrived_ns)
        if refused_by_core(
            call.call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), call), "a call's close"
        ):
            call.closed = call._cancelled = True  # (no close will come: the call is treated as over)
        handler = self.handlers.get(event.call_details.method)
        if handler is None:
            call.fail(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        elif handler.request_streaming:
            events.append(LoopEvent(functools.partial(self._start_stream, call, handler)))
        elif refused_by_core(
            call.call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(0),), functools.partial(self._on_message, call, handler)
            ),
            "a call's receive",
        ):
            call.fail(grpc.StatusCode.INTERNAL, "the server could not receive the request")

    def _start_stream(self, call: CoreCall, handler: Any, event: LoopEvent) -> None:
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
