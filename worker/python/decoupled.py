"""Decoupled Python models (model_transaction_policy { decoupled: true }), and cancellation of every
Python model's requests. Both go through the worker's third thread, the courier.

    the courier            a thread with a DEALER per gateway of its own (wire.courier_identity):
                           CANCEL in; a decoupled batch's STREAM_RESPONSE and RESULT out, whichever
                           thread of the model sent them (a ZeroMQ socket belongs to one thread: the
                           others hand their messages over through a queue, and wake its poller
                           through a pipe)
    execute(requests)      each request has an InferenceResponseSender (request.get_response_sender());
                           execute returns None, and may leave senders to threads of its own
    execute returns        the batch loop answers EXECUTED and takes the next batch; the stream goes
                           on, its slot held, bounded by its requests' deadlines (the gateway's)
    sender.send(r)         r's tensors are written into the slot's output area after the ones sent
                           before (the area is the batch's until its RESULT), and STREAM_RESPONSE
                           leaves at once, from the courier
    send(flags=FINAL)      that request is done
    every request final    RESULT (after execute returned): the batch is over and its slot free
    CANCEL                 the flags that request.is_cancelled() and sender.is_cancelled() read flip
                           (a non-decoupled model polling it in execute sees it too: the courier is
                           not the thread that runs execute); a decoupled request counts as final
                           from then on and what it sends later is dropped, so its slot is freed
                           even when the model never sends FINAL

A request's responses together must fit the slot's output area (--slot-mb): one that does not
gets an error response, as does one that answers after its final response.

If the worker dies mid-stream, the responses sent are not sent again: the gateway ends each such
request's stream with an error, and requeues the batch only for the requests that had none yet.
(A response sent just before the death may not have left: ZeroMQ sends from its I/O thread.)
If its gateway dies, the batch loop ends that gateway's streams (drop_gateway) before it lets go of
the gateway's ring: a model thread's later sends are dropped, never written into a ring let go.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from ringserve.common import messages, wire
from ringserve.common.repository.config import ModelConfig
from ringserve.shm.segment import Segment

from ..errors import WorkerError
from ..requests import Answer, AnswerError, Emit, failed, response_parameters, response_tensors, write_tensors
from . import pb_utils

log = logging.getLogger(__name__)


class ExecutingModel(Protocol):
    """What a decoupled batch uses of its model (worker/python/python_model.py: PythonModel, which imports this
    module): its config, and its execute."""

    config: ModelConfig

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> Any: ...


COURIER_POLL_MS = 100  # how often the courier looks whether it is asked to stop
# CANCELs of batches not running yet (waiting in the batch loop's queue), kept until the batch runs; the
# oldest go first (a CANCEL that came after its batch's RESULT is kept too, and never used)
EARLY_CANCELS_KEPT = 1024
CANCELLED_STATUS = 499  # a cancelled request's answer in RESULT (its client had the gateway's already)
# run_on_slot's answers for a decoupled batch whose stream goes on: the batch loop answers EXECUTED
STREAMING: list[Answer] = []


class Watch:
    """One batch's requests as cancellation sees them: a flag per request (written by the courier,
    read by is_cancelled() from any thread: one byte, no lock), and its stream if it is decoupled."""

    __slots__ = ("attempt", "cancelled", "stream")

    def __init__(self, attempt: int, count: int) -> None:
        self.attempt = attempt
        self.cancelled = bytearray(count)
        self.stream: Stream | None = None

    def flag(self, k: int) -> Callable[[], bool]:
        """What request k's is_cancelled() reads."""
        cancelled = self.cancelled
        return lambda: cancelled[k] != 0


class Courier(threading.Thread):
    """The worker's thread for what must move while the batch loop runs model code: CANCEL in, and a
    decoupled batch's messages out (in the order they were posted, so RESULT follows the last response).

    Started before the batch loop; its sockets are connected here, so each gateway can route a
    CANCEL to it by the time a batch runs."""

    def __init__(self, context: zmq.Context, endpoints: list[str], index: int, generation: int) -> None:
        super().__init__(name="courier", daemon=True)
        identity = wire.courier_identity(index, generation)
        self.sockets: list[zmq.Socket] = []
        for endpoint in endpoints:
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoint)
            self.sockets.append(socket)
        self._posted: queue.SimpleQueue[tuple[int, list[bytes], str]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._watches: dict[tuple[int, int], Watch] = {}  # (gateway, batch id) -> its requests' flags
        self._early: OrderedDict[tuple[int, int], tuple[int, list[int]]] = OrderedDict()  # -> (attempt, indexes)
        self._lock = threading.Lock()
        self._stopped = False

    # -- from any thread ----------------------------------------------------------------------
    def post(self, gateway: int, message: messages.Message) -> None:
        """Send `message` to gateway `gateway` from the courier, at once."""
        self._posted.put((gateway, message.encode(), message.KIND))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the courier is awake already

    def watch(self, gateway: int, batch: messages.Batch) -> Watch:
        watch = Watch(batch.attempt, len(batch.requests or ()) or 1)
        with self._lock:
            self._watches[gateway, batch.batch_id] = watch
            early = self._early.pop((gateway, batch.batch_id), None)
        if early is not None and early[0] == batch.attempt:
            for k in early[1]:
                if 0 <= k < len(watch.cancelled):
                    watch.cancelled[k] = 1
        return watch

    def unwatch(self, gateway: int, batch_id: int) -> None:
        with self._lock:
            self._watches.pop((gateway, batch_id), None)

    def drop_gateway(self, gateway: int) -> None:
        """Gateway `gateway` is gone (on the batch loop's thread, before it lets go of that gateway's ring):
        its streams end here, and nothing more is written into its ring."""
        with self._lock:
            gone = [key for key in self._watches if key[0] == gateway]
            watches = [self._watches.pop(key) for key in gone]
        for watch in watches:
            watch.cancelled[:] = b"\1" * len(watch.cancelled)
            if watch.stream is not None:
                watch.stream.abandon()

    def stop(self) -> None:
        self._stopped = True
        self._wake()

    # -- the courier's thread -----------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        for socket in self.sockets:
            poller.register(socket, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            while not self._stopped:
                ready = dict(poller.poll(COURIER_POLL_MS))
                if self._wake_read in ready:
                    self._drain_wake()
                self._send_posted()
                for gateway, socket in enumerate(self.sockets):
                    if socket in ready:
                        self._receive(gateway, socket)
            self._send_posted()  # what the last batches posted
        finally:
            for socket in self.sockets:  # (the pipe stays open: a model's thread may still post, to no one)
                socket.close(linger=0)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _send_posted(self) -> None:
        while True:
            try:
                gateway, frames, kind = self._posted.get_nowait()
            except queue.Empty:
                return
            try:
                self.sockets[gateway].send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:  # its gateway is gone or wedged (as threads.send_or_drop)
                log.warning("gateway %d takes no messages from the courier: %s dropped", gateway, kind)

    def _receive(self, gateway: int, socket: zmq.Socket) -> None:
        while socket.poll(0, zmq.POLLIN):
            try:
                message = messages.decode(socket.recv_multipart(zmq.NOBLOCK))
            except messages.WireError as exc:
                log.warning("courier: ignoring a message from gateway %d: %s", gateway, exc)
                continue
            if type(message) is messages.Cancel:
                self.cancel(gateway, message)
            else:
                log.warning("courier: ignoring unexpected %s message from gateway %d", message.KIND, gateway)

    def cancel(self, gateway: int, cancel: messages.Cancel) -> None:
        key = (gateway, cancel.batch_id)
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:  # not running yet (or over already): its watch takes it when it runs
                self._early[key] = (cancel.attempt, list(cancel.request_indexes))
                while len(self._early) > EARLY_CANCELS_KEPT:
                    self._early.popitem(last=False)
                return
        if watch.attempt != cancel.attempt:
            return  # another attempt's
        indexes = [k for k in cancel.request_indexes if 0 <= k < len(watch.cancelled)]
        for k in indexes:
            watch.cancelled[k] = 1
        if watch.stream is not None:
            watch.stream.cancel(indexes)


class Channel:
    """One gateway as a batch's model code reaches it, from any thread: through the courier."""

    __slots__ = ("courier", "gateway")

    def __init__(self, courier: Courier, gateway: int) -> None:
        self.courier, self.gateway = courier, gateway

    def post(self, message: messages.Message) -> None:
        self.courier.post(self.gateway, message)

    def watch(self, batch: messages.Batch) -> Watch:
        return self.courier.watch(self.gateway, batch)

    def unwatch(self, batch: messages.Batch) -> None:
        self.courier.unwatch(self.gateway, batch.batch_id)


class Stream:
    """The responses of one decoupled batch, from whichever thread the model sends them; its RESULT
    once execute has returned and every request is final (or cancelled)."""

    def __init__(self, model: ExecutingModel, segment: Segment, batch: messages.Batch, channel: Emit) -> None:
        self.model, self.segment, self.batch, self.channel = model, segment, batch, channel
        self.infos = batch.requests or (messages.RequestInfo(rows=1),)
        self.finals = [False] * len(self.infos)
        self.answers: list[Answer] = [[[], None, 0] for _ in self.infos]  # RESULT's, per request
        self.offset = batch.output_offset
        self.executed = False
        self.ended = False  # RESULT posted, or its gateway gone: nothing more is written or sent
        self.compute_s = 0.0
        self._lock = threading.Lock()
        self.watch = channel.watch(batch)
        self.watch.stream = self

    def sender(self, k: int) -> pb_utils.InferenceResponseSender:
        return pb_utils.InferenceResponseSender(
            lambda response, final: self.send(k, response, final), self.watch.flag(k)
        )

    def send(self, k: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        with self._lock:
            if self.ended or self.watch.cancelled[k]:
                return  # cancelled (the client has had its answer from the gateway): dropped, as Triton does
            if self.finals[k]:
                raise pb_utils.TritonModelException(f"request {k} of this batch has had its final response")
            self.channel.post(self._written(k, response, final))
            if final:
                self.finals[k] = True
                self._end_if_done()

    def _written(self, k: int, response: pb_utils.InferenceResponse | None, final: bool) -> messages.StreamResponse:
        batch = self.batch
        if response is None:
            return messages.StreamResponse(batch.batch_id, batch.attempt, k, [], final=final)
        try:
            tensors = response_tensors(self.model.config, self.infos[k], response)
            parameters = response_parameters(self.model.config, response)
            refs, self.offset = write_tensors(self.segment, batch.slot_index, self.offset, tensors)
        except AnswerError as exc:
            return messages.StreamResponse(batch.batch_id, batch.attempt, k, [], str(exc), exc.status, final)
        # The bytes first, then the generation that vouches for them (see shm/layout.py).
        self.segment.set_output_generation(batch.slot_index, batch.generation)
        return messages.StreamResponse(batch.batch_id, batch.attempt, k, refs, final=final, parameters=parameters)

    def cancel(self, indexes: list[int]) -> None:
        """(The courier's thread) these requests are over: final from now on, whatever the model does."""
        with self._lock:
            for k in indexes:
                if not self.finals[k]:
                    self.finals[k] = True
                    self.answers[k] = failed("the request was cancelled", CANCELLED_STATUS)
            self._end_if_done()

    def returned(self, compute_s: float, error: BaseException | None = None) -> None:
        """(The batch loop) execute returned, or raised `error`: that ends every request not final yet."""
        with self._lock:
            self.executed, self.compute_s = True, compute_s
            for k, cancelled in enumerate(self.watch.cancelled):  # (cancelled before it ran)
                if cancelled and not self.finals[k]:
                    self.finals[k] = True
                    self.answers[k] = failed("the request was cancelled", CANCELLED_STATUS)
            if error is not None:
                message, status = f"{type(error).__name__}: {error}", pb_utils.http_status(error)
                for k, final in enumerate(self.finals):
                    if not final:
                        self.finals[k] = True
                        self.answers[k] = failed(message, status)
            self._end_if_done()

    def _end_if_done(self) -> None:
        """(Under the lock) RESULT once execute returned and every request is final; it frees the slot."""
        if self.ended or not self.executed or not all(self.finals):
            return
        self.ended = True
        batch = self.batch
        # The gateway reads a RESULT's slot only when its output generation vouches for it (shm/layout.py).
        self.segment.set_output_generation(batch.slot_index, batch.generation)
        self.channel.post(
            messages.Result(batch.batch_id, batch.attempt, [], compute_s=self.compute_s, answers=self.answers)
        )
        self.channel.unwatch(batch)

    def abandon(self) -> None:
        """Its gateway is gone: nothing more is written into the slot, nor sent."""
        with self._lock:
            self.ended = True


class NoCourier(WorkerError):
    def __init__(self, model: str) -> None:
        super().__init__(f"decoupled model {model!r} needs the worker's courier to stream its responses")


def run_decoupled(
    model: ExecutingModel,
    segment: Segment,
    batch: messages.Batch,
    requests: list[pb_utils.InferenceRequest],
    channel: Emit | None,
) -> tuple[list[Answer], float]:
    """execute with a sender per request; (STREAMING, compute seconds) once it returned: the stream
    goes on from the courier (responses, then RESULT), and the batch loop answers EXECUTED."""
    if channel is None:
        raise NoCourier(model.config.name)
    stream = Stream(model, segment, batch, channel)
    for k, request in enumerate(requests):
        request._sender = stream.sender(k)
        request._cancelled = stream.watch.flag(k)
    started = time.perf_counter()
    try:
        returned = model.execute(requests)
        if returned is not None:
            raise pb_utils.TritonModelException(
                f"a decoupled model's execute returns None (it answers through "
                f"its response senders), got {type(returned).__name__}"
            )
    except Exception as exc:  # noqa: BLE001 - a decoupled model's execute may raise anything: its open requests end with the error
        stream.returned(time.perf_counter() - started, exc)
        return STREAMING, time.perf_counter() - started
    stream.returned(time.perf_counter() - started)
    return STREAMING, time.perf_counter() - started
