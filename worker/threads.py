"""The worker's two threads beside the batch loop (worker/loop.py), each with its own sockets
(a ZeroMQ socket is used by one thread only): heartbeats to the supervisor, and the model loader.

Heartbeats come from their own thread, so a long inference does not look like a hang; a native call
that holds the GIL (or SIGSTOP) stops them, and the supervisor then kills this process. Each beat
carries the calls into model code running then (worker/progress.py), so a call past its bound (a
Python loop, which lets the beats go on) is judged too. The loader takes Load and Unload while a
batch runs, and unloads what `ttl_s` (or a deferred API unload) makes due, so that a finalize is
never in the batches' way; every thread's model state changes go out as ModelState on each of its
sockets (EventOutbox): every gateway sees every change.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

import zmq
from zmq.utils.monitor import parse_monitor_message

from ringserve.common import messages, runtime_settings, supervisor_messages, wire
from ringserve.common.runtime_settings import RuntimeSettings

from .errors import WorkerError
from .models import ModelRegistry
from .progress import CALLS

log = logging.getLogger(__name__)


class BatchCounts(Protocol):
    """What the heartbeat reads of the batch loop (worker/loop.py: WorkerLoop, which imports this module)."""

    @property
    def announced(self) -> bool: ...

    batches_done: int


HEARTBEAT_INTERVAL_S = 0.25
READY_BEAT_S = 0.01  # the heartbeat's interval while the loop runs but has said Ready to no gateway yet
LOADER_POLL_MS = 100  # how often the loader looks whether it is asked to stop
MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class HeartbeatThread(threading.Thread):
    def __init__(self, context: zmq.Context, endpoint: str, index: int, generation: int) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._socket = context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)
        self._socket.connect(endpoint)
        self.index, self.generation, self.pid = index, generation, os.getpid()
        self._stopped = threading.Event()
        self.loop: BatchCounts | None = None  # once set, heartbeats carry its batch count (for recycling)

    def run(self) -> None:
        while True:  # the first one at once: until it comes the supervisor allows for a slow start
            loop = self.loop
            ready = loop is not None and loop.announced
            beat = supervisor_messages.Heartbeat(
                worker_index=self.index,
                generation=self.generation,
                pid=self.pid,
                batches=0 if loop is None else loop.batches_done,
                ready=ready,
                calls=tuple(CALLS.running()),
            )
            try:
                self._socket.send_multipart(beat.encode(), zmq.NOBLOCK)
            except zmq.Again:
                pass  # supervisor busy or gone; it judges by what it receives
            # From the eager loads' end to the first Ready (milliseconds), look often: the supervisor
            # starts the next warm spare on the first beat that says ready.
            if self._stopped.wait(HEARTBEAT_INTERVAL_S if ready or loop is None else READY_BEAT_S):
                break
        self._socket.close()

    def stop(self) -> None:
        self._stopped.set()


class Connection:
    """One DEALER connected to one gateway's ROUTER, and a monitor of its handshakes and disconnects.

    The monitor (an inproc PAIR) may be read by another thread than the one that uses the
    DEALER: the batch loop reads the loader's monitors, to know when a Ready may go out.
    """

    def __init__(self, context: zmq.Context, endpoint: str, identity: bytes, *, linger_ms: int) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.setsockopt(zmq.LINGER, linger_ms)
        self.monitor = self.socket.get_monitor_socket(MONITOR_EVENTS)
        self.socket.connect(endpoint)  # after the monitor: its first handshake is seen

    def events(self) -> list[int]:
        """The monitor's events since the last call, oldest first (never blocks)."""
        found = []
        while self.monitor.get(zmq.EVENTS) & zmq.POLLIN:
            found.append(parse_monitor_message(self.monitor.recv_multipart())["event"])
        return found

    def close(self, linger_ms: int | None = None) -> None:
        """From the thread that uses the DEALER."""
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=linger_ms)


def send_or_drop(socket: zmq.Socket, frames: list[bytes], what: str) -> None:
    """Never block the worker on one gateway: a socket whose queue is full (its gateway is gone or
    wedged; the queue holds 1000 messages) drops the message, and the gateway's restart resets it."""
    try:
        socket.send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        log.warning("a gateway takes no messages: %s dropped", what)


class EventOutbox:
    """Model state changes go out at once, each on every socket of the thread that made it.

    A thread that has attached no sockets yet (the batch loop while it loads the eager models,
    before Ready) drops them: Ready carries those states anyway. The batch loop's list holds
    only the sockets that have sent Ready, so a gateway never hears of a change before it
    knows the worker.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def attach(self, sockets: list[zmq.Socket]) -> None:
        """From now on, this thread's changes are sent on each socket of `sockets`, a list this
        thread may change."""
        self._local.sockets = sockets

    def put(self, event: messages.ModelState) -> None:
        sockets = getattr(self._local, "sockets", None)
        if sockets:
            frames = event.encode()
            for socket in sockets:
                send_or_drop(socket, frames, "a model state change")


class ModelLoader(threading.Thread):
    """Takes Load and Unload on its own DEALER per gateway, so they run while the batch loop runs a batch.

    A load that needs room evicts only versions no batch holds; with every one held, it is
    refused at once (the gateway answers 503 with the numbers) instead of waiting. One thread
    takes every gateway's loads in turn, so two gateways asking for the same lazy version cause
    one load: the second Load finds it ready (or failed) and only reports that state.

    The sockets are connected here, not in run(): the batch loop reads their monitors
    (`connections[k].monitor`) to send Ready on gateway k only once the gateway can route a
    Load to this thread. ZeroMQ reconnects them by itself after a gateway restarts.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        outbox: EventOutbox,
        *,
        context: zmq.Context,
        endpoints: list[str],
        index: int,
        generation: int,
        prime: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="model-loader", daemon=True)
        self.registry, self.outbox, self.prime = registry, outbox, prime
        self.connections = [
            Connection(context, endpoint, wire.control_identity(index, generation), linger_ms=0)
            for endpoint in endpoints
        ]
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def close_monitors(self) -> None:
        """From the thread that reads the monitors, once it no longer does."""
        for connection in self.connections:
            connection.monitor.close(linger=0)

    def run(self) -> None:
        sockets = [c.socket for c in self.connections]
        self.outbox.attach(sockets)
        if self.prime is not None:
            self.prime()
        poller = zmq.Poller()
        for socket in sockets:
            poller.register(socket, zmq.POLLIN)
        try:
            while not self._stopped.is_set():
                for socket, _ in poller.poll(LOADER_POLL_MS):
                    try:
                        message = messages.decode(socket.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        continue
                    except messages.WireError as exc:
                        log.warning("model loader: ignoring a message: %s", exc)
                        continue
                    self.handle(message)
                self.reap()
        finally:
            for socket in sockets:
                socket.close(linger=0)

    def reap(self) -> None:
        """Unload what ttl_s (or an API unload that waited for its batches) made due: here, not in the
        batch loop, so that a finalize that takes long (up to its bound) holds no other model's batch."""
        try:
            self.registry.reap()
        except BaseException:  # noqa: BLE001 - nothing an unload runs may end this thread
            log.exception("model loader: an unload failed unexpectedly")

    def handle(self, message: messages.Message) -> None:
        if isinstance(message, RuntimeSettings):  # (a client changed the log or trace settings: every gateway says so)
            runtime_settings.adopt(message)
            return
        if not isinstance(message, (messages.Load, messages.Unload)):
            log.warning("model loader: ignoring unexpected %s message", message.KIND)
            return
        try:
            if isinstance(message, messages.Load):
                self.registry.load(message.model, message.version, message.cause)
            else:
                self.registry.unload(message.model, message.version, "api")
        except WorkerError as exc:
            log.debug("model loader: %s", exc)  # logged by the registry and reported as a state
        except BaseException:  # noqa: BLE001 - nothing a load runs may end this thread: every later load would wait forever
            log.exception(
                "model loader: %s of model %s version %s failed unexpectedly",
                message.KIND,
                message.model,
                message.version,
            )
