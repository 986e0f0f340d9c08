"""The worker's main loop: Batch in over ZeroMQ from every gateway, inference on slot views, Result out.

Runs in the worker process, beside its heartbeat and model-loader threads (worker/threads.py).

Gateways: the server runs G gateway processes (settings.gateway_count()), each with its own
ring segment and its own ROUTER (`dispatch-<k>.sock`). Per gateway k the batch loop owns one
DEALER (GatewayLink) and the loader thread another; a socket monitor on each tells of
handshakes and disconnects. Every handshake of batch socket k (the first connect, and each
reconnect to a restarted gateway k) is answered with Ready, once loader socket k is routable
too (bounded wait); gateway k answers Ready with Attach (its ring's name) before any Batch.
A disconnect of batch socket k means gateway k died: its queued batches, its unsent Results
and its segment are dropped with the socket (linger 0), and a fresh DEALER of the same
identity waits for the gateway's successor. A Result of a batch that ran while its gateway
went away is not sent. The other gateways are not disturbed.

Fairness: every message waiting on any batch socket is moved (non-blocking) into its
gateway's FIFO deque, and the next batch comes from the next gateway in turn that has one
(round-robin), so a busy gateway cannot starve another. Everything is polled with one
zmq.Poller; between messages (or every POLL_INTERVAL_MS) the loop unloads versions idle past
their TTL.

Fusion: with a batch chosen, worker/fusion.py may add batches of the same model version from
the heads of the deques (any gateway's) and run them as one execution; each batch still gets
its own Result. With no other batch waiting, a batch runs alone on the path it always had.

Models come from the registry (worker/models.py): an execution holds a reference to its
version while it runs. Load and Unload go to the loader thread, which has its own sockets
(ZeroMQ sockets are used by one thread only) and so takes them while a batch runs. Each
thread sends the model state changes it made as ModelState, on each of its sockets: every
gateway sees every change (a lazy load one gateway asked for serves all of them).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from ringserve.common import messages, tracing, vocabulary, wire
from ringserve.common.logfmt import batch_fields
from ringserve.shm.segment import Segment

from . import fusion
from .errors import BudgetExhausted, ModelLoadFailed, ModelNotServed, WorkerError
from .models import ModelRegistry
from .progress import CALLS
from .python.decoupled import STREAMING, Channel, Courier
from .requests import Emit
from .slots import check_generation
from .threads import Connection, EventOutbox, send_or_drop

log = logging.getLogger(__name__)

POLL_INTERVAL_MS = 100
READY_CHECK_MS = 5  # while a Ready waits for the loader's socket to be routable
LOADER_CONNECT_S = 10.0  # how long a Ready waits for the loader's socket of its gateway
RESULT_LINGER_MS = 1000  # at exit, the last Results still get out


# Errors of batches that never ran: the gateway answers them without blaming a request.
ERROR_KINDS: dict[type[Exception], vocabulary.ErrorKind] = {
    BudgetExhausted: "budget",
    ModelLoadFailed: "load_failed",
    ModelNotServed: "not_served",
}


class NoSegment(WorkerError):
    def __init__(self, gateway: int) -> None:
        super().__init__(f"gateway {gateway} sent a batch before attaching its ring (Attach)")


class GatewayLink:
    """Gateway k as the batch loop sees it: its DEALER, its ring, its batches waiting to run."""

    def __init__(self, gateway: int, endpoint: str) -> None:
        self.gateway, self.endpoint = gateway, endpoint
        self.connection: Connection | None = None
        self.segment: Segment | None = None
        self.queue: deque[messages.Batch] = deque()
        self.epoch = 0  # bumped by each reset: a batch of an older socket gets no Result
        self.ready_due: float | None = None  # handshake done: Ready waits for the loader until then


class WorkerLoop:
    """Serves Batch messages from every gateway until asked to stop."""

    def __init__(
        self,
        *,
        context: zmq.Context,
        dispatch_endpoints: list[str],
        index: int,
        generation: int,
        registry: ModelRegistry,
        outbox: EventOutbox,
        loader_monitors: list[zmq.Socket] | None = None,
        config_failures: dict[str, str] | None = None,
        courier: Courier | None = None,
    ) -> None:
        self.context = context
        self.courier = courier  # decoupled streams and cancellation (worker/python/decoupled.py); None in unit tests
        self.registry = registry
        self.config_failures = config_failures or {}  # model key -> why its config could not be built
        self.outbox = outbox
        self.index, self.generation = index, generation
        self.identity = wire.worker_identity(index, generation)
        self.stopping = False
        self.batches_done = 0  # batches answered (a fused execution counts each of its batches)
        self.links = [GatewayLink(k, endpoint) for k, endpoint in enumerate(dispatch_endpoints)]
        # None: nothing to wait for (a test without a loader thread)
        self.loader_monitors = loader_monitors
        self.loader_up = [loader_monitors is None] * len(self.links)
        self._greeted: list[zmq.Socket] = []  # the batch sockets that have sent Ready: ModelState goes there
        self._poller = zmq.Poller()
        self._handlers: dict[Any, Callable[[], None]] = {}
        self._next = 0  # round-robin: the gateway asked first for the next batch
        for link in self.links:
            self._connect(link)
        for k, monitor in enumerate(loader_monitors or ()):
            self._watch(monitor, lambda k=k, monitor=monitor: self._on_loader_events(k, monitor))

    # -- sockets ------------------------------------------------------------------------------
    def _watch(self, socket: zmq.Socket, handler: Callable[[], None]) -> None:
        self._poller.register(socket, zmq.POLLIN)
        self._handlers[socket] = handler

    def _unwatch(self, socket: zmq.Socket) -> None:
        self._poller.unregister(socket)
        del self._handlers[socket]

    def _connect(self, link: GatewayLink) -> None:
        link.connection = Connection(self.context, link.endpoint, self.identity, linger_ms=RESULT_LINGER_MS)
        self._watch(link.connection.socket, lambda: self._receive(link))
        self._watch(link.connection.monitor, lambda: self._on_events(link))

    def _reset(self, link: GatewayLink) -> None:
        """Gateway k is gone: drop everything of it, and wait for its successor on a fresh socket."""
        dropped = len(link.queue)
        link.queue.clear()
        link.epoch += 1
        link.ready_due = None
        connection = link.connection
        if connection.socket in self._greeted:
            self._greeted.remove(connection.socket)
        self._unwatch(connection.socket)
        self._unwatch(connection.monitor)
        connection.close(linger_ms=0)  # queued Results for the dead gateway go with it
        if self.courier is not None:  # its streams stop writing into its ring before the ring is let go
            self.courier.drop_gateway(link.gateway)
        self._detach(link)
        # Every stop of the server disconnects the gateways first: only lost work is worth a warning.
        log.log(
            logging.WARNING if dropped else logging.INFO,
            "worker %d: gateway %d disconnected; dropped %d queued batch(es), waiting for it to return",
            self.index,
            link.gateway,
            dropped,
        )
        self._connect(link)

    def _on_events(self, link: GatewayLink) -> None:
        for event in link.connection.events():
            if event == zmq.EVENT_DISCONNECTED:
                self._reset(link)
                return  # what the old monitor still holds is about the old socket
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                link.ready_due = time.monotonic() + LOADER_CONNECT_S

    def _on_loader_events(self, gateway: int, monitor: zmq.Socket) -> None:
        while monitor.get(zmq.EVENTS) & zmq.POLLIN:
            event = parse_monitor_message(monitor.recv_multipart())["event"]
            self.loader_up[gateway] = event == zmq.EVENT_HANDSHAKE_SUCCEEDED

    @property
    def announced(self) -> bool:
        """It has said Ready to a gateway (read by the heartbeat thread: one list's truth, under the GIL)."""
        return bool(self._greeted)

    def _greet_due(self) -> None:
        """Send Ready where the handshake is done and the loader's socket is routable (or waited enough)."""
        now = time.monotonic()
        for link in self.links:
            if link.ready_due is None or not (self.loader_up[link.gateway] or now >= link.ready_due):
                continue
            if not self.loader_up[link.gateway]:
                log.warning(
                    "worker %d: the model loader's socket to gateway %d is not connected yet; lazy loads may wait",
                    self.index,
                    link.gateway,
                )
            link.ready_due = None
            ready = self.ready()  # the state of every version now
            send_or_drop(link.connection.socket, ready.encode(), "Ready")
            self._greeted.append(link.connection.socket)
            log.info(
                "worker %d generation %d ready for gateway %d with %s",
                self.index,
                self.generation,
                link.gateway,
                ", ".join(f"{s.model}/{s.version} {s.state}" for s in ready.model_states or ()) or "no models",
            )

    def _receive(self, link: GatewayLink) -> None:
        """Everything waiting on gateway k's socket, into its deque (Batch) or handled (Attach)."""
        socket = link.connection.socket
        while socket.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                message = messages.decode(socket.recv_multipart(zmq.NOBLOCK))
            except messages.WireError as exc:
                log.warning("ignoring a message from gateway %d: %s", link.gateway, exc)
                continue
            if type(message) is messages.Batch:
                link.queue.append(message)
            elif type(message) is messages.Attach:
                self._attach(link, message)
            else:
                log.warning("ignoring unexpected %s message from gateway %d", message.KIND, link.gateway)

    def _attach(self, link: GatewayLink, attach: messages.Attach) -> None:
        if attach.gateway_index != link.gateway:
            log.warning(
                "gateway %d attached as gateway %d; using its socket's index", link.gateway, attach.gateway_index
            )
        if link.segment is not None and link.segment.name == attach.segment:
            return
        self._detach(link)
        try:
            link.segment = Segment.attach(attach.segment)
        except Exception as exc:  # noqa: BLE001 - gone already: the gateway died since; its disconnect comes next
            log.error("worker %d cannot attach gateway %d's ring %s: %s", self.index, link.gateway, attach.segment, exc)
            return
        log.info("worker %d: gateway %d's ring is %s", self.index, link.gateway, attach.segment)

    @staticmethod
    def _detach(link: GatewayLink) -> None:
        if link.segment is not None:
            link.segment.close()
            link.segment = None

    def _still_there(self, link: GatewayLink, epoch: int) -> bool:
        """Whether the socket a batch came from is still the current one (looks at its events first)."""
        if link.epoch == epoch:
            self._on_events(link)
        return link.epoch == epoch

    # -- the loop -----------------------------------------------------------------------------
    def ready(self) -> messages.Ready:
        states = self.registry.describe()
        keys = {(c.name, c.version): c.key for c in self.registry.entries_configs()}
        return messages.Ready(
            worker_index=self.index,
            generation=self.generation,
            pid=os.getpid(),
            # model key -> provider (None until loaded): the versions this worker may serve
            models={keys[s.model, s.version]: s.provider for s in states if s.state != "failed"},
            # ...and the ones it cannot: a failed load, or a config that could not be built (the
            # gateway keeps an older generation that serves one of those, gateway/dispatch/fleet.py)
            failed_models={
                **self.config_failures,
                **{keys[s.model, s.version]: s.reason for s in states if s.state == "failed"},
            },
            model_states=tuple(states),
            memory_budget_bytes=self.registry.budget_bytes,
            # A Python model's config as this worker read it (its model.py may have completed it): the
            # gateway serves these, as it never imports a model.py itself.
            configs=tuple(
                messages.CompletedConfig(c.key, c.version, c.model_path, c.to_json())
                for c in self.registry.entries_configs()
                if c.kind == "python"
            ),
        )

    def run(self) -> None:
        self.outbox.attach(self._greeted)
        handlers, links = self._handlers, self.links
        try:
            while not self.stopping:
                waiting = any(link.queue for link in links)
                greeting = any(link.ready_due is not None for link in links)
                timeout = 0 if waiting else READY_CHECK_MS if greeting else POLL_INTERVAL_MS
                for socket, _ in self._poller.poll(timeout):
                    handler = handlers.get(socket)
                    if handler is not None:  # None: unwatched by a reset earlier in this round
                        handler()
                if greeting:
                    self._greet_due()
                if waiting or any(link.queue for link in links):
                    self._execute_next()
        finally:
            self.close()

    def close(self) -> None:
        self._greeted.clear()  # (state changes after this, the stop's unloads, go nowhere)
        for link in self.links:
            if link.connection is not None:
                link.connection.close()
                link.connection = None
            self._detach(link)

    def _next_link(self) -> GatewayLink:
        """Round-robin over the gateways that have a batch waiting."""
        links, count = self.links, len(self.links)
        for step in range(count):
            link = links[(self._next + step) % count]
            if link.queue:
                self._next = (link.gateway + 1) % count
                return link
        raise LookupError("no batch waiting")

    def _execute_next(self) -> None:
        link = self._next_link()
        batch = link.queue.popleft()
        if link.segment is not None and self._others_wait():  # else nothing to fuse: no cost beyond this
            group = fusion.companions(batch, self._fusion_sources(link.gateway), self.registry)
            if group:
                self._execute_fused([(link, batch), *group])
                return
        epoch = link.epoch
        span = None if batch.trace is None else tracing.start_execution(batch, link.gateway)
        reply = self.handle_batch(
            batch,
            link.segment,
            link.gateway,
            emit=None if self.courier is None else Channel(self.courier, link.gateway),
        )
        if span is not None:
            tracing.end_execution(span, reply)
        self.batches_done += 1
        if self._still_there(link, epoch):
            send_or_drop(link.connection.socket, reply.encode(), reply.KIND)

    def _others_wait(self) -> bool:
        for link in self.links:
            if link.queue:
                return True
        return False

    def _fusion_sources(self, primary: int) -> list[tuple[GatewayLink, deque[messages.Batch]]]:
        """The deques fusion may take from: the next gateway's first, the primary's own last."""
        count = len(self.links)
        order = (self.links[(primary + 1 + step) % count] for step in range(count))
        return [(link, link.queue) for link in order if link.segment is not None]

    def _execute_fused(self, group: list[tuple[GatewayLink, messages.Batch]]) -> None:
        epochs = [link.epoch for link, _ in group]
        spans = [tracing.start_execution(batch, link.gateway) for link, batch in group]  # [None, ...] when off
        fused = len(group)
        replies = fusion.execute(self.registry, [(link.segment, batch) for link, batch in group])
        if replies is None:  # not as one: each alone, so that an error stays with its batch
            fused = 1
            replies = [self.handle_batch(batch, link.segment, link.gateway) for link, batch in group]
        for span, reply in zip(spans, replies):
            tracing.end_execution(span, reply, fused)
        self.batches_done += len(group)
        for (link, _), epoch, reply in zip(group, epochs, replies):
            if self._still_there(link, epoch):
                send_or_drop(link.connection.socket, reply.encode(), reply.KIND)

    # -- one batch ----------------------------------------------------------------------------
    def handle_batch(
        self, batch: messages.Batch, segment: Segment | None, gateway: int = 0, emit: Emit | None = None
    ) -> messages.Result | messages.Error | messages.Executed:
        """The batch's RESULT or ERROR; EXECUTED for a decoupled model's, whose responses and RESULT
        go out through `emit` (worker/python/decoupled.py) as the model sends them, after execute returned too."""
        try:
            if segment is None:
                raise NoSegment(gateway)
            outputs, compute_s, answers = self.run_batch(batch, segment, emit)
        except Exception as exc:  # noqa: BLE001 - a model error fails this batch, never the worker
            log.warning(
                "batch %s of model %s failed: %s",
                batch.batch_id,
                batch.model,
                exc,
                extra=batch_fields(batch.batch_id, batch.request_ids),
            )
            return messages.Error(
                batch_id=batch.batch_id, attempt=batch.attempt, error=str(exc), kind=ERROR_KINDS.get(type(exc))
            )
        if answers is STREAMING:
            return messages.Executed(batch.batch_id, batch.attempt, compute_s)
        return messages.Result(
            batch_id=batch.batch_id, attempt=batch.attempt, outputs=outputs, compute_s=compute_s, answers=answers
        )

    def run_batch(
        self, batch: messages.Batch, segment: Segment, emit: Emit | None = None
    ) -> tuple[list[list[Any]], float, list[list[Any]] | None]:
        """(the batch's outputs, compute seconds, None) for an ONNX model; ([], compute seconds, one
        answer per request) for a model that answers each request (Python, ensemble): worker/runner.py."""
        check_generation(segment, batch)
        entry = self.registry.acquire(batch.model, batch.version)
        try:
            session = entry.session
            with CALLS.call(entry.config, "execute"):  # (a bound the supervisor judges: worker/progress.py)
                return session.run_batch(segment, batch, emit)
        finally:
            self.registry.release(entry)
