"""The worker's main loop: Batch in over ZeroMQ, inference on slot views, Result out.

Runs in the worker process. Heartbeats come from a separate thread with its own
socket, so a long inference does not look like a hang; a native call that holds the
GIL (or SIGSTOP) stops them, and the supervisor then kills this process.

Models come from the registry (worker/models.py): a batch holds a reference to its
version while it runs. Load and Unload go to the loader thread, which has its own socket
(ZeroMQ sockets are used by one thread only) and so takes them while a batch runs. Each
thread sends the model state changes it made as ModelState. Between messages the batch
loop unloads versions idle past their TTL.

String tensors: a BYTES input lies in the slot in KServe's binary BYTES form; it reaches
ONNX Runtime as an object array of str (ORT takes str elements; it would turn bytes
elements into their repr, "b'...'"). The gateway admits only UTF-8, so decoding is
strict. A string output, an object array of str, is written back in the same form.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from ringserve.common import messages, wire
from ringserve.common.datatypes import numpy_dtype
from ringserve.shm.layout import pack_offsets
from ringserve.shm.segment import Segment

from . import faults
from .errors import BudgetExhausted, ModelLoadFailed, ModelNotServed, OutputOverflow, StaleBatch, WorkerError
from .models import ModelRegistry
from .session import ModelSession

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 0.25
POLL_INTERVAL_MS = 100


class Heartbeat(threading.Thread):
    def __init__(self, context: zmq.Context, endpoint: str, index: int, generation: int) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._socket = context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)
        self._socket.connect(endpoint)
        self.index, self.generation, self.pid = index, generation, os.getpid()
        self._stopped = threading.Event()
        self.loop: WorkerLoop | None = None  # once set, heartbeats carry its batch count (for recycling)

    def run(self) -> None:
        while True:  # the first one at once: until it comes the supervisor allows for a slow start
            beat = messages.Heartbeat(worker=self.index, generation=self.generation, pid=self.pid,
                                      batches=0 if self.loop is None else self.loop.batches_done)
            try:
                self._socket.send_multipart(messages.encode(beat), zmq.NOBLOCK)
            except zmq.Again:
                pass  # supervisor busy or gone; it judges by what it receives
            if self._stopped.wait(HEARTBEAT_INTERVAL_S):
                break
        self._socket.close()

    def stop(self) -> None:
        self._stopped.set()


class EventOutbox:
    """Model state changes go out at once, each on the socket of the thread that made it.

    A thread that has not attached its socket yet (the batch loop while it loads the eager
    models, before Ready) drops them: Ready carries those states anyway.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def attach(self, socket: zmq.Socket) -> None:
        """From now on, this thread's changes are sent on `socket`."""
        self._local.socket = socket

    def put(self, event: messages.ModelState) -> None:
        socket = getattr(self._local, "socket", None)
        if socket is not None:
            socket.send_multipart(messages.encode(event))


class ModelLoader(threading.Thread):
    """Takes Load and Unload on its own DEALER, so they run while the batch loop runs a batch.

    A load that needs room evicts only versions no batch holds; with every one held, it is
    refused at once (the gateway answers 503 with the numbers) instead of waiting.
    """

    def __init__(self, registry: ModelRegistry, outbox: EventOutbox, *, context: zmq.Context, endpoint: str,
                 index: int, generation: int, prime: Callable[[], None] | None = None) -> None:
        super().__init__(name="model-loader", daemon=True)
        self.registry, self.outbox, self.prime = registry, outbox, prime
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, wire.control_identity(index, generation))
        self._socket.setsockopt(zmq.LINGER, 0)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._socket.connect(endpoint)  # here, not in run(): see wait_connected
        self._stopped = threading.Event()

    def wait_connected(self, timeout_s: float) -> bool:
        """Before Ready: the gateway can route Load to this socket only once its handshake is done."""
        try:
            return bool(self._monitor.poll(int(timeout_s * 1000)))
        finally:
            self._close_monitor()

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        self.outbox.attach(self._socket)
        if self.prime is not None:
            self.prime()
        try:
            while not self._stopped.is_set():
                if self._socket.poll(POLL_INTERVAL_MS):
                    self.handle(messages.decode(self._socket.recv_multipart()))
        finally:
            self._close_monitor()
            self._socket.close()

    def handle(self, message: messages.Message) -> None:
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
        except Exception:
            log.exception("model loader: %s of model %s version %s failed unexpectedly", message.KIND,
                          message.model, message.version)


# Errors of batches that never ran: the gateway answers them without blaming a request.
ERROR_KINDS: dict[type[Exception], messages.ErrorKind] = {
    BudgetExhausted: "budget", ModelLoadFailed: "load_failed", ModelNotServed: "not_served"}


class WorkerLoop:
    """Serves Batch messages one at a time until asked to stop."""

    def __init__(self, *, context: zmq.Context, dispatch_endpoint: str, index: int,
                 generation: int, segment: Segment, registry: ModelRegistry, outbox: EventOutbox,
                 config_failures: dict[str, str] | None = None) -> None:
        self.segment = segment
        self.registry = registry
        self.config_failures = config_failures or {}  # model key -> why its config could not be built
        self.outbox = outbox
        self.index, self.generation = index, generation
        self.stopping = False
        self.batches_done = 0
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, wire.worker_identity(index, generation))
        self._socket.setsockopt(zmq.LINGER, 1000)
        self._socket.connect(dispatch_endpoint)

    def ready(self) -> messages.Ready:
        states = self.registry.describe()
        keys = {(c.name, c.version): c.key for c in self.registry.entries_configs()}
        return messages.Ready(
            worker=self.index, generation=self.generation, pid=os.getpid(),
            # model key -> provider (None until loaded): the versions this worker may serve
            models={keys[s.model, s.version]: s.provider for s in states if s.state != "failed"},
            # ...and the ones it cannot: a failed load, or a config that could not be built (the
            # gateway keeps an older generation that serves one of those, gateway/fleet.py)
            failed_models={**self.config_failures,
                           **{keys[s.model, s.version]: s.reason for s in states if s.state == "failed"}},
            model_states=tuple(states), memory_budget_bytes=self.registry.budget_bytes)

    def run(self) -> None:
        ready = self.ready()  # the state of every version, the eager loads' included
        self._socket.send_multipart(messages.encode(ready))
        self.outbox.attach(self._socket)
        log.info("worker %d generation %d ready with %s", self.index, self.generation,
                 ", ".join(f"{s.model}/{s.version} {s.state}" for s in ready.model_states or ()) or "no models")
        while not self.stopping:
            if self._socket.poll(POLL_INTERVAL_MS):
                match messages.decode(self._socket.recv_multipart()):
                    case messages.Batch() as batch:
                        self._socket.send_multipart(messages.encode(self.handle_batch(batch)))
                        self.batches_done += 1
                    case other:
                        log.warning("ignoring unexpected %s message", other.KIND)
            self.registry.reap()
        self._socket.close()

    def handle_batch(self, batch: messages.Batch) -> messages.Result | messages.Error:
        try:
            outputs, compute_s = self.run_batch(batch)
        except Exception as exc:  # a model error fails this batch, never the worker
            log.warning("batch %s of model %s failed: %s", batch.batch_id, batch.model, exc)
            return messages.Error(batch_id=batch.batch_id, attempt=batch.attempt, error=str(exc),
                                  kind=ERROR_KINDS.get(type(exc)))
        return messages.Result(batch_id=batch.batch_id, attempt=batch.attempt, outputs=outputs, compute_s=compute_s)

    def run_batch(self, batch: messages.Batch) -> tuple[list[list[Any]], float]:
        found = self.segment.generation(batch.slot)
        if found != batch.generation:
            raise StaleBatch(batch.slot, batch.generation, found)
        entry = self.registry.acquire(batch.model, batch.version)
        try:
            return self._run(entry.session, batch)
        finally:
            self.registry.release(entry)

    def _run(self, session: ModelSession, batch: messages.Batch) -> tuple[list[list[Any]], float]:
        slot, generation = batch.slot, batch.generation
        inputs = {}
        for item in batch.inputs:
            ref = wire.TensorRef.from_wire(item)
            if isinstance(ref, wire.BytesTensorRef):  # decoded into new str objects: the slot stays as it is
                inputs[ref.name] = self.read_strings(slot, ref)
                continue
            view = self.segment.tensor(slot, ref.offset, numpy_dtype(ref.datatype), ref.shape)
            view.flags.writeable = False  # inputs are re-dispatched after a crash: never touch them
            inputs[ref.name] = view
        for kind in batch.faults or ():
            faults.trigger(kind)
        started = time.perf_counter()
        results = session.run(inputs)
        compute_s = time.perf_counter() - started
        refs = self.write_outputs(session, slot, batch.output_offset, results)
        # Outputs first, then the generation that vouches for them (see shm/layout.py).
        self.segment.set_output_generation(slot, generation)
        return refs, compute_s

    def read_strings(self, slot: int, ref: wire.BytesTensorRef) -> np.ndarray:
        view = self.segment.tensor(slot, ref.offset, np.uint8, (ref.nbytes,))
        return wire.deserialize_bytes_tensor(view, ref.shape, text=True)

    def write_outputs(self, session: ModelSession, slot: int, start: int,
                      results: list[np.ndarray]) -> list[list[Any]]:
        # A string output (object array) goes into the slot serialized: only then is its size known.
        data = [r if not r.dtype.hasobject else np.frombuffer(wire.serialize_bytes_tensor(r), np.uint8)
                for r in results]
        offsets, end = pack_offsets([d.nbytes for d in data], start)
        if end > self.segment.data_capacity:
            raise OutputOverflow(session.config.name, end - start, self.segment.data_capacity - start)
        refs = []
        for name, result, payload, offset in zip(session.output_names, results, data, offsets):
            datatype = session.config.output(name).datatype
            dst = self.segment.tensor(slot, offset, payload.dtype, payload.shape)
            np.copyto(dst, payload)
            ref = (wire.TensorRef(name, datatype, result.shape, offset) if payload is result
                   else wire.BytesTensorRef(name, datatype, result.shape, offset, payload.nbytes))
            refs.append(ref.to_wire())
        return refs
