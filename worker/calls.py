"""A worker's requests to models it does not hold, through the gateways: BLS calls and ensemble steps
whose model runs in another lane (`--lanes model`: supervision/lanes.py).

    model code (any thread) -> GatewayCalls.send: CALL + the KServe v2 binary body  -> a gateway's ROUTER
        the gateway serves it as an HTTP request (gateway/calls/front.py): queued, batched, dispatched
        to a lane of the model, requeued after that lane's death, isolated by bisection, 504 at its deadline
    GatewayCalls.wait <- CALL_REPLY + the outputs in the same binary form

One DEALER per worker (identity `b<index>.g<generation>`), connected to every gateway: ZeroMQ hands
each CALL to one of them in turn, and only to those whose connection is up (IMMEDIATE). Its tensors
travel in the message's body frame, as an HTTP body carries them; the caller holds no slot of the
target's gateway, and the gateway copies them into one as it copies a client's. A model the worker
holds never comes here: worker/bls.py runs it in the process (the fast path).

Threads: a BLS call may come from the batch loop's thread (execute) or from a model's own threads (a
decoupled model's), so the socket is used under a lock; the thread that waits reads every reply that
has come and leaves the others' for them. A wait ends at the reply or at its bound (the server's
--request-timeout-s and a margin: the gateway answers 504 before that, but a gateway that died with
the call never answers).

A stream call (exec(decoupled=True) to a decoupled model: worker/calls_stream.py) is answered by several
CALL_REPLYs, kept in order per call until read; the one with `final` ends it. cancel() sends CALL_CANCEL;
abandon() drops what comes for the call from then on (up to its final reply).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import zmq

from ringserve.common import messages, wire
from ringserve.common.repository.datatypes import kserve_from_numpy, numpy_dtype

WAIT_POLL_MS = 5  # how long the waiting thread holds the socket's lock per look
SEND_RETRY_S = 0.01  # no gateway connected yet (a worker's first moments): try again this often
REPLY_MARGIN_S = 5.0  # beyond the request's own timeout, before a call is given up


class CallFailed(Exception):
    """The call was answered with an error (its HTTP status), or not at all."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class GatewayCalls:
    """The worker's one socket for requests to models in other lanes (thread-safe)."""

    def __init__(
        self, context: zmq.Context, endpoints: Sequence[str], index: int, generation: int, timeout_s: float
    ) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, wire.call_identity(index, generation))
        self.socket.setsockopt(zmq.IMMEDIATE, 1)  # never queue a call for a gateway that is not there
        self.socket.setsockopt(zmq.LINGER, 0)
        for endpoint in endpoints:
            self.socket.connect(endpoint)
        self.gateway_count = len(endpoints)
        self.timeout_s = timeout_s + REPLY_MARGIN_S
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._replies: dict[int, deque[tuple[messages.CallReply, bytes]]] = {}  # (a stream's: several)
        self._abandoned: set[int] = set()
        self._to_abandon: queue.SimpleQueue[int] = queue.SimpleQueue()  # (reentrant: safe in __del__)

    def close(self) -> None:
        with self._lock:
            self.socket.close(linger=0)

    def send(
        self, model: str, version: int, body: bytes, header_length: int, stream: bool = False
    ) -> tuple[int, float]:
        """(call id, deadline): the CALL is on its way to a gateway; CallFailed if none takes it in time."""
        call_id = next(self._ids)
        deadline = time.monotonic() + self.timeout_s
        frames = [*messages.Call(call_id, model, version, header_length, stream).encode(), body]
        while True:
            with self._lock:
                try:
                    self.socket.send_multipart(frames, zmq.NOBLOCK)
                    return call_id, deadline
                except zmq.Again:
                    pass
            if time.monotonic() >= deadline:
                raise CallFailed(f"no gateway took the request for model {model!r}", 503)
            time.sleep(SEND_RETRY_S)

    def wait(self, call_id: int, deadline: float) -> tuple[messages.CallReply, bytes]:
        """The CALL's reply and its body; CallFailed when none came by `deadline`."""
        while True:
            with self._lock:
                if call_id in self._replies:
                    return self._next_reply(call_id)
                if self.socket.poll(WAIT_POLL_MS, zmq.POLLIN):
                    self._drain()
                    if call_id in self._replies:
                        return self._next_reply(call_id)
            if time.monotonic() >= deadline:
                with self._lock:
                    if call_id in self._replies:
                        return self._next_reply(call_id)
                    self._abandoned.add(call_id)
                raise CallFailed("no answer from the gateway (it may have restarted)", 503)

    def cancel(self, call_id: int) -> None:
        """A stream call's CALL_CANCEL, once to each gateway: the DEALER hands consecutive messages to its
        connections in turn, and only the gateway serving the call finds its stream. Its replies still come."""
        frames = [*messages.CallCancel(call_id).encode(), b""]
        with self._lock:
            for _ in range(self.gateway_count):
                try:
                    self.socket.send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    return  # (no gateway connected: its stream ends at its deadline)

    def abandon(self, call_id: int) -> None:
        """Nobody will read this call's replies: those kept go, and later ones are dropped up to its final.
        Takes no lock (an iterator's __del__ calls it, maybe on a thread that holds it): the next drain does it."""
        self._to_abandon.put(call_id)

    def _abandon_dropped(self) -> None:
        while not self._to_abandon.empty():
            call_id = self._to_abandon.get()
            replies = self._replies.pop(call_id, ())
            if not any(reply.final for reply, _ in replies):
                self._abandoned.add(call_id)

    def _next_reply(self, call_id: int) -> tuple[messages.CallReply, bytes]:
        replies = self._replies[call_id]
        reply = replies.popleft()
        if not replies:
            del self._replies[call_id]
        return reply

    def _drain(self) -> None:
        self._abandon_dropped()
        while self.socket.get(zmq.EVENTS) & zmq.POLLIN:
            frames = self.socket.recv_multipart(zmq.NOBLOCK)
            try:
                reply = messages.decode(frames[:3])
            except messages.WireError:
                continue
            if not isinstance(reply, messages.CallReply):
                continue
            if reply.call_id in self._abandoned:
                if reply.final:
                    self._abandoned.discard(reply.call_id)
                continue
            body = frames[3] if len(frames) > 3 else b""
            self._replies.setdefault(reply.call_id, deque()).append((reply, body))


# -- the body: KServe v2's binary tensor extension, as an HTTP client writes and reads it ---------------
def encode_request(
    feeds: dict[str, np.ndarray], outputs: Sequence[str], parameters: dict[str, Any] | None, request_id: str | None
) -> tuple[bytes, int]:
    """(body, JSON header length) of an infer request with every input binary and every output asked binary."""
    inputs, parts = [], []
    for name, array in feeds.items():
        if array.dtype.hasobject or array.dtype.kind in "SU":
            datatype, data = "BYTES", wire.serialize_bytes_tensor(np.asarray(array, dtype=object))
        else:
            datatype = kserve_from_numpy(array.dtype)
            data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        inputs.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(data)},
            }
        )
        parts.append(data)
    doc: dict[str, Any] = {"inputs": inputs}
    if request_id:
        doc["id"] = request_id
    params = dict(parameters or {})
    if outputs:
        doc["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
    else:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    header = orjson.dumps(doc)
    return header + b"".join(parts), len(header)


class Outputs(dict):
    """A response's outputs by name, and the parameters the model set on it (a BLS caller's response has both)."""

    parameters: dict[str, Any] | None = None


def decode_response(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """Each output of a binary response body, by name (and the response's parameters)."""
    doc = orjson.loads(body[:header_length])
    view, offset = memoryview(body), header_length
    outputs = Outputs()
    outputs.parameters = doc.get("parameters")
    for item in doc.get("outputs", ()):
        shape = tuple(item["shape"])
        size = item["parameters"]["binary_data_size"]
        data = view[offset : offset + size]
        offset += size
        if item["datatype"] == "BYTES":
            outputs[item["name"]] = wire.deserialize_bytes_tensor(data, shape)
        else:
            dtype = numpy_dtype(item["datatype"]).newbyteorder("<")
            outputs[item["name"]] = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    return outputs
