"""The public-API gRPC engine: grpcio's grpc.aio server on the gateway's loop, running the same servicer
(gateway/grpc/server.py) over the same codec and data plane as the fast path (gateway/grpc/core.py).

It serves when `--grpc-engine aio` asks for it, and when the fast path cannot: a grpcio outside the
releases the fast path was run on, or one whose private names it finds changed (core.surface_problem).
It costs more CPU a call (grpc.aio's Cython coroutines, a future per operation, a wake-up per event:
docs/performance.md has both side by side), and uses no private name of grpcio.

Each of the servicer's handlers is wrapped once: its messages arrive as bytes and are decoded here
with the servicer's own deserializer (a message that is no protobuf is INVALID_ARGUMENT, as on the fast
path), its answer is the bytes the servicer made, and a failure is a status set on the call, never
grpc.aio's abort (whose AbortError would keep the handler's frames, and the received message, alive).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from ringserve.gateway.grpc.context import Aborted, write_through

log = logging.getLogger(__name__)

_Send = tuple[bytes, "Callable[[bool], None] | None", "Callable[[list], None] | None"]  # see AioCall.send


class AioCall:
    """One RPC on grpc.aio, as the servicer's context (gateway/grpc/context.py: CallContext)."""

    def __init__(self, context: grpc.aio.ServicerContext, serialize: Callable[[Any], bytes] | None = None) -> None:
        self.context = context
        self.arrived_ns = time.perf_counter_ns()
        self.serialize = serialize
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.payload: bytes | None = None
        self.answered = False
        self.sends: deque[_Send] = deque()
        self.writer: asyncio.Task | None = None
        self.failed = False
        self.gone: asyncio.Future | None = None

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return tuple(self.context.invocation_metadata() or ())

    def peer(self) -> str:
        return self.context.peer()

    def cancelled(self) -> bool:
        return self.context.cancelled()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing = tuple(metadata)

    def answer(self, payload: bytes | None) -> None:
        """A unary call's message (sent once the method returns, with its status)."""
        if not self.answered:
            self.answered, self.payload = True, payload

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details

    def finish(self) -> None:
        """The status the servicer set, onto grpc.aio's call."""
        if self.trailing:
            self.context.set_trailing_metadata(self.trailing)
        if self.code is not None and self.code != grpc.StatusCode.OK:
            self.context.set_code(self.code)
            self.context.set_details(self.details)

    # -- a response stream: its messages in order, one write at a time -----------------------------------
    async def write(self, message: Any) -> None:
        """Send one message; returns once grpc.aio has taken it. ClientGone when it could not be sent."""
        await write_through(self.send, message)

    def send(
        self,
        message: Any,
        on_sent: Callable[[bool], None] | None = None,
        on_poller: Callable[[list[Any]], None] | None = None,
    ) -> None:
        """Queue one message; `on_poller([])` then `on_sent(True)` once grpc.aio took it, `on_sent(False)`
        if it never will (the client went away)."""
        payload = message if self.serialize is None else self.serialize(message)
        self.sends.append((payload, on_sent, on_poller))
        if self.writer is None:
            self.writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self.sends:
            payload, on_sent, on_poller = self.sends.popleft()
            sent = not self.failed
            if sent:
                try:
                    await self.context.write(payload)
                except Exception:  # noqa: BLE001 - whatever grpc.aio raises, the message was not sent
                    sent = self._fail()
            if sent and on_poller is not None:
                on_poller([])  # (the fast path's poller work, here on the loop: a stream's credit)
            if on_sent is not None:
                try:
                    on_sent(sent)
                except Exception:  # (one answer's callback must not keep the others')
                    log.exception("gRPC send callback failed")
        self.writer = None

    def _fail(self) -> bool:
        self.failed = True
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
        return False

    def send_failed(self) -> asyncio.Future:
        if self.gone is None:
            self.gone = asyncio.get_running_loop().create_future()
            if self.failed:
                self.gone.set_result(None)
        return self.gone

    async def drained(self) -> None:
        while self.writer is not None:
            await asyncio.shield(self.writer)


class AioRequests:
    """A request stream's messages, read while the window its servicer opened has credit
    (gateway/grpc/context.py: RequestMessages); without a window, one per message asked for."""

    def __init__(self, messages: AsyncIterator[bytes], deserialize: Callable[[bytes], Any] | None) -> None:
        self.messages, self.deserialize = messages, deserialize
        self.windowed = False
        self.credit = 0
        self.room = asyncio.Event()
        self.arrived_ns = 0

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    def open_window(self, size: int) -> None:
        self.windowed = True
        self.grant(size)

    def grant(self, count: int = 1, events: list[Any] | None = None) -> None:
        self.credit += count
        if self.credit > 0:
            self.room.set()

    async def __anext__(self) -> Any:
        if self.windowed:
            while self.credit <= 0:
                self.room.clear()
                await self.room.wait()
            self.credit -= 1
        message = await self.messages.__anext__()
        self.arrived_ns = time.perf_counter_ns()
        return message if self.deserialize is None else self.deserialize(message)


def _running(tasks: set[asyncio.Task]) -> None:
    task = asyncio.current_task()
    if task is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def _unary(handler: Any, tasks: set[asyncio.Task]) -> grpc.RpcMethodHandler:
    deserialize, serialize = handler.request_deserializer, handler.response_serializer

    async def behaviour(message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        _running(tasks)
        call = AioCall(context)
        try:
            request = message if deserialize is None else deserialize(message)
        except Exception as exc:  # noqa: BLE001 - any deserializer's failure is the client's message's fault
            call.fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the message is not this method's request in protobuf's encoding ({exc})",
            )
        else:
            del message
            try:
                response = await handler.unary_unary(request, call)
                if not call.answered:
                    call.answer(None if response is None else response if serialize is None else serialize(response))
            except Aborted as exc:
                call.fail(exc.code, exc.details)
            except Exception:
                log.exception("gRPC method failed")
                call.fail(grpc.StatusCode.UNKNOWN, "Unexpected error in the server")
        call.finish()
        return call.payload or b""  # (grpc.aio sends no message with a status other than OK)

    return grpc.unary_unary_rpc_method_handler(behaviour)


def _stream(handler: Any, tasks: set[asyncio.Task]) -> grpc.RpcMethodHandler:
    async def behaviour(messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        _running(tasks)
        call = AioCall(context, handler.response_serializer)
        try:
            await handler.stream_stream(AioRequests(messages, handler.request_deserializer), call)
        except Aborted as exc:
            call.fail(exc.code, exc.details)
        except Exception:
            log.exception("gRPC stream failed")
            call.fail(grpc.StatusCode.UNKNOWN, "Unexpected error in the server")
        await call.drained()  # (the status goes after every message the servicer sent)
        call.finish()

    return grpc.stream_stream_rpc_method_handler(behaviour)


class _Methods(grpc.GenericRpcHandler):
    def __init__(self, methods: dict[str, grpc.RpcMethodHandler]) -> None:
        self.methods = methods

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.methods.get(handler_call_details.method)


class AioServer:
    """grpc.aio's server on the running loop, serving `handlers` ({"/service/Method": handler} with
    coroutine behaviours, as core.CoreServer takes them)."""

    def __init__(self, options: Sequence[tuple[str, Any]], handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server = grpc.aio.server(options=tuple(options))
        self.tasks: set[asyncio.Task] = set()  # the calls running (each call's handler is a task of grpc.aio's)
        methods = {
            name: _stream(handler, self.tasks) if handler.request_streaming else _unary(handler, self.tasks)
            for name, handler in handlers.items()
        }
        self.server.add_generic_rpc_handlers((_Methods(methods),))

    def add_port(self, address: str) -> int:
        """Bind; the port. RuntimeError when it cannot be bound."""
        return self.server.add_insecure_port(address)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        """New calls refused at once; running ones get `grace_s`, then are cancelled."""
        await self.server.stop(grace_s)
