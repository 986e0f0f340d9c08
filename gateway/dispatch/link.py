"""The gateway's ZeroMQ sockets, read from the event loop: the only gateway module that imports zmq.

    dispatch-<k>.sock  ROUTER (bind)  <-> each worker's batch loop and loader thread (DEALERs)
    events-<k>.sock    PULL (bind)    <-  the supervisor's WORKER_STARTED, WORKER_EXITED, SNAPSHOT, ...
    control.sock       PUSH (connect) ->  the supervisor (shared by every gateway): KILL_WORKER,
                                          WORKER_RETIRED, QUARANTINE_MODEL, UNQUARANTINE, RELOAD_WORKERS

k is this gateway's index (--index; 0 with one gateway).

Frames are decoded into common/messages.py's dataclasses here and handed on; what to do
with them is the dispatcher's business. `Link` is the scheduler's WorkerPort (gateway/dispatch/worker_port.py).

Sockets are read with `loop.add_reader` on the socket's fd and drained until EAGAIN, with no
asyncio future per message. The ZMQ fd is edge-triggered and also fires on send, so the
router is drained again after each send: a reply that arrived meanwhile would wait otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

from ringserve.common import messages, wire
from ringserve.gateway.dispatch.worker_port import LoaderMessage, SupervisorMessage, WorkerMessage

log = logging.getLogger(__name__)

# The hot path's flags as plain ints. pyzmq's flags are IntFlag members, and an int meeting one
# (`events & zmq.POLLIN`, send_multipart's `zmq.SNDMORE | flags`) goes through enum's operators, which
# make a new member each time: ~0.6 µs a time, 6 a request at 1 client. (recv_multipart stays: receiving
# zero-copy frames and reading their `more`, not RCVMORE, was quicker alone and 5 % slower at 64 clients.)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)


def send_frames(socket: zmq.Socket, frames: list[bytes], flags: int = 0) -> None:
    """send_multipart(frames, flags): SNDMORE on every frame but the last."""
    more = flags | _SNDMORE
    for frame in frames[:-1]:
        socket.send(frame, more)
    socket.send(frames[-1], flags)


WorkerHandler = Callable[[int, int, messages.Message], None]  # (index, generation, message)
CallHandler = Callable[[bytes, messages.Message, bytes], None]  # (the caller's identity, CALL, its body)
EventHandler = Callable[[messages.Message], None]


class SocketReader:
    """Drains a ZeroMQ socket from the event loop without a future per message."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, socket: zmq.Socket, handle: Callable[[list[bytes]], None]
    ) -> None:
        self.loop, self.socket, self.handle = loop, socket, handle
        loop.add_reader(socket.getsockopt(zmq.FD), self.drain)

    def drain(self) -> None:
        while self.socket.getsockopt(zmq.EVENTS) & _POLLIN:  # type: ignore[operator]  # (EVENTS is an int)
            try:
                frames = self.socket.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            try:
                self.handle(frames)
            except Exception:
                log.exception("failed to handle a control message")

    def close(self) -> None:
        self.loop.remove_reader(self.socket.getsockopt(zmq.FD))
        self.socket.close(linger=0)


class Link:
    """Gateway k's end of dispatch-k.sock, events-k.sock and control.sock."""

    def __init__(
        self,
        runtime_dir: str,
        on_worker: WorkerHandler,
        on_event: EventHandler,
        gateway: int = 0,
        on_call: CallHandler | None = None,
    ) -> None:
        self.runtime_dir = runtime_dir
        self.gateway = gateway
        self.on_worker, self.on_event, self.on_call = on_worker, on_event, on_call
        self._context = zmq.Context.instance()
        self._readers: list[SocketReader] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.router = self._context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown identity raises instead of dropping
        # A worker busy with a batch when this gateway's predecessor died handles the disconnect only
        # after it: meanwhile ZeroMQ has reconnected its old socket here, and the fresh socket it then
        # opens has the same identity. Without handover that connection was refused while the old
        # pipe lingered, and its READY was lost: this gateway never heard of the worker.
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.router.bind(wire.gateway_endpoint(self.runtime_dir, "dispatch", self.gateway))
        events = self._context.socket(zmq.PULL)
        events.bind(wire.gateway_endpoint(self.runtime_dir, "events", self.gateway))
        self.control = self._context.socket(zmq.PUSH)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.connect(wire.endpoint(self.runtime_dir, "control"))
        self._router_reader = SocketReader(loop, self.router, self._from_worker)
        self._readers = [self._router_reader, SocketReader(loop, events, self._from_supervisor)]

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        self.control.close(linger=0)

    # -- in ---------------------------------------------------------------------------------
    def _from_worker(self, frames: list[bytes]) -> None:
        identity, *rest = frames
        if len(rest) == 4 and self.on_call is not None:  # a CALL: its body (tensors, as HTTP's) in a frame of its own
            self.on_call(identity, messages.decode(rest[:3]), rest[3])
            return
        index, generation = wire.parse_worker_identity(identity)
        self.on_worker(index, generation, messages.decode(rest))

    def _from_supervisor(self, frames: list[bytes]) -> None:
        self.on_event(messages.decode(frames))

    # -- out: the WorkerPort ----------------------------------------------------------------
    def send_batch(self, index: int, generation: int, batch: messages.Batch) -> bool:
        return self._send(wire.worker_identity(index, generation), batch)

    def send_to_worker(self, index: int, generation: int, message: WorkerMessage) -> bool:
        return self._send(wire.worker_identity(index, generation), message)

    def send_to_loader(self, index: int, generation: int, message: LoaderMessage) -> bool:
        return self._send(wire.control_identity(index, generation), message)

    def send_to_courier(self, index: int, generation: int, message: messages.Cancel) -> bool:
        return self._send(wire.courier_identity(index, generation), message)

    def send_call_reply(self, identity: bytes, reply: messages.CallReply, body: bytes) -> bool:
        """A worker's CALL answered (a caller that died meanwhile is gone: the reply is dropped)."""
        return self._send(identity, reply, body)

    def _send(self, identity: bytes, message: messages.Message, *body: bytes) -> bool:
        try:
            send_frames(self.router, [identity, *message.encode(), *body])
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: no such peer (gone, or not connected yet)
            log.info("cannot send %s to %s: %s", message.KIND, identity.decode(), exc)
            return False
        finally:
            self.loop.call_soon(self._router_reader.drain)  # the fd is edge-triggered and fires on send too

    def tell_supervisor(self, message: SupervisorMessage) -> None:
        """Never blocks the loop: a message the supervisor cannot take now is logged and dropped."""
        try:
            send_frames(self.control, message.encode(), _NOBLOCK)
        except zmq.ZMQError as exc:
            log.error("cannot send %s to the supervisor: %s", message, exc)
