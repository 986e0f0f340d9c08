"""The worker's main loop: BATCH in over ZeroMQ, inference on slot views, RESULT out.

Runs in the worker process. Heartbeats come from a separate thread with its own
socket, so a long inference does not look like a hang; a native call that holds the
GIL (or SIGSTOP) stops them, and the supervisor then kills this process.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import numpy as np
import zmq

from common import wire
from common.config import numpy_dtype
from shm.layout import pack_offsets
from shm.segment import Segment

from . import faults
from .errors import ModelNotLoaded, OutputOverflow, StaleBatch
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
        self._body = {"worker": index, "generation": generation, "pid": os.getpid()}
        self._stopped = threading.Event()
        self.loop: WorkerLoop | None = None  # once set, heartbeats carry its batch count (for recycling)

    def run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_INTERVAL_S):
            body = self._body if self.loop is None else {**self._body, "batches": self.loop.batches_done}
            try:
                self._socket.send_multipart(wire.encode("HEARTBEAT", body), zmq.NOBLOCK)
            except zmq.Again:
                pass  # supervisor busy or gone; it judges by what it receives
        self._socket.close()

    def stop(self) -> None:
        self._stopped.set()


class WorkerLoop:
    """Serves BATCH messages one at a time until asked to stop."""

    def __init__(self, *, context: zmq.Context, dispatch_endpoint: str, index: int,
                 generation: int, segment: Segment, sessions: dict[str, ModelSession],
                 failed_models: dict[str, str]) -> None:
        self.segment = segment
        self.sessions = sessions
        self.index, self.generation = index, generation
        self.stopping = False
        self.batches_done = 0
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, wire.worker_identity(index, generation))
        self._socket.setsockopt(zmq.LINGER, 1000)
        self._socket.connect(dispatch_endpoint)
        self._ready_body = {
            "worker": index, "generation": generation, "pid": os.getpid(),
            "models": {name: s.provider for name, s in sessions.items()},
            "failed_models": failed_models,
        }

    def run(self) -> None:
        self._socket.send_multipart(wire.encode("READY", self._ready_body))
        log.info("worker %d generation %d ready with %s", self.index, self.generation,
                 ", ".join(self.sessions) or "no models")
        while not self.stopping:
            if not self._socket.poll(POLL_INTERVAL_MS):
                continue
            kind, body = wire.decode(self._socket.recv_multipart())
            if kind != "BATCH":
                log.warning("ignoring unexpected %s message", kind)
                continue
            self._socket.send_multipart(self.handle_batch(body))
            self.batches_done += 1
        self._socket.close()

    def handle_batch(self, msg: dict[str, Any]) -> list[bytes]:
        reply = {"batch_id": msg["batch_id"], "attempt": msg["attempt"]}
        try:
            outputs, compute_s = self.run_batch(msg)
        except Exception as exc:  # a model error fails this batch, never the worker
            log.warning("batch %s of model %s failed: %s", msg["batch_id"], msg["model"], exc)
            return wire.encode("ERROR", {**reply, "error": str(exc)})
        return wire.encode("RESULT", {**reply, "outputs": outputs, "compute_s": compute_s})

    def run_batch(self, msg: dict[str, Any]) -> tuple[list[list[Any]], float]:
        model, slot, generation = msg["model"], msg["slot"], msg["generation"]
        session = self.sessions.get(model)
        if session is None:
            raise ModelNotLoaded(model)
        found = self.segment.generation(slot)
        if found != generation:
            raise StaleBatch(slot, generation, found)
        inputs = {}
        for item in msg["inputs"]:
            ref = wire.TensorRef.from_wire(item)
            view = self.segment.tensor(slot, ref.offset, numpy_dtype(ref.datatype), ref.shape)
            view.flags.writeable = False  # inputs are re-dispatched after a crash: never touch them
            inputs[ref.name] = view
        for kind in msg.get("faults", ()):
            faults.trigger(kind)
        started = time.perf_counter()
        results = session.run(inputs)
        compute_s = time.perf_counter() - started
        refs = self.write_outputs(session, slot, msg["output_offset"], results)
        # Outputs first, then the generation that vouches for them (see shm/layout.py).
        self.segment.set_output_generation(slot, generation)
        return refs, compute_s

    def write_outputs(self, session: ModelSession, slot: int, start: int,
                      results: list[np.ndarray]) -> list[list[Any]]:
        offsets, end = pack_offsets([r.nbytes for r in results], start)
        if end > self.segment.data_capacity:
            raise OutputOverflow(session.config.name, end - start, self.segment.data_capacity - start)
        refs = []
        for name, result, offset in zip(session.output_names, results, offsets):
            datatype = session.config.output(name).datatype
            dst = self.segment.tensor(slot, offset, result.dtype, result.shape)
            np.copyto(dst, result)
            refs.append(wire.TensorRef(name, datatype, result.shape, offset).to_wire())
        return refs
