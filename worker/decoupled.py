"""Decoupled Python models (model_transaction_policy { decoupled: true }): any number of responses
per request, each sent to the gateway as the model sends it.

    execute(requests)      each request has an InferenceResponseSender (request.get_response_sender());
                           execute returns None, and may leave senders to threads of its own
    sender.send(r)         r's tensors are written into the slot's output area, after the ones sent
                           before (the area is the batch's until its RESULT), then STREAM_RESPONSE says
                           where; the gateway copies them out at once and passes them to the client
    send(flags=FINAL)      that request is done (STREAM_RESPONSE with final)
    every request final    RESULT: the batch is over and its slot free

Only the batch loop's thread uses the gateway's socket (a ZeroMQ socket belongs to one thread):
what execute sends from that thread goes out at once; what the model's own threads send is
queued, and the batch loop forwards it once execute has returned, until every request is final.
So a model that blocks in execute until its threads are done has those responses sent when it
returns; a model whose senders never send FINAL holds its worker (bounded by --batch-timeout-s).
A request's responses together must fit the slot's output area (--slot-mb): one that does not
gets an error response, as does one that answers after its final response.

If the worker dies mid-stream, the responses sent are not sent again: the gateway ends each such
request's stream with an error, and requeues the batch only for the requests that had none yet.
(A response sent just before the death may not have left: ZeroMQ sends from its I/O thread.)
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

from ringserve.common import messages
from ringserve.shm.segment import Segment

from . import pb_utils
from .requests import Answer, AnswerError, Emit, failed, response_tensors, write_tensors

if TYPE_CHECKING:
    from .python_model import PythonModel

FORWARD_POLL_S = 0.05  # how often the batch loop looks for responses the model's threads sent


class Stream:
    """The responses of one decoupled batch, from whichever thread the model sends them."""

    def __init__(self, model: PythonModel, segment: Segment, batch: messages.Batch, emit: Emit | None) -> None:
        self.model, self.segment, self.batch, self.emit = model, segment, batch, emit
        self.infos = batch.requests or (messages.RequestInfo(rows=1),)
        self.finals = [False] * len(self.infos)
        self.offset = batch.output_offset
        self._lock = threading.Lock()
        self._queued: queue.SimpleQueue[messages.StreamResponse] = queue.SimpleQueue()
        self._loop_thread = threading.get_ident()

    def sender(self, k: int) -> pb_utils.InferenceResponseSender:
        return pb_utils.InferenceResponseSender(lambda response, final: self.send(k, response, final))

    def send(self, k: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        with self._lock:
            if self.finals[k]:
                raise pb_utils.TritonModelException(f"request {k} of this batch has had its final response")
            message = self._written(k, response, final)
            self.finals[k] = final
            if threading.get_ident() != self._loop_thread:
                self._queued.put(message)  # (under the lock: once all are final, all are queued)
                return
        self._emit(message)

    def _written(self, k: int, response: pb_utils.InferenceResponse | None, final: bool) -> messages.StreamResponse:
        batch = self.batch
        if response is None:
            return messages.StreamResponse(batch.batch_id, batch.attempt, k, [], final=final)
        try:
            tensors = response_tensors(self.model.config, self.infos[k], response)
            refs, self.offset = write_tensors(self.segment, batch.slot_index, self.offset, tensors)
        except AnswerError as exc:
            return messages.StreamResponse(batch.batch_id, batch.attempt, k, [], str(exc), exc.status, final)
        # The bytes first, then the generation that vouches for them (see shm/layout.py).
        self.segment.set_output_generation(batch.slot_index, batch.generation)
        return messages.StreamResponse(batch.batch_id, batch.attempt, k, refs, final=final)

    def _emit(self, message: messages.StreamResponse) -> None:
        if self.emit is not None:
            self.emit(message)

    def forward_until_final(self) -> None:
        """On the batch loop's thread, once execute returned: what other threads send goes out."""
        while True:
            with self._lock:
                complete = all(self.finals)
            try:
                while True:
                    self._emit(self._queued.get_nowait())
            except queue.Empty:
                pass
            if complete:
                return
            time.sleep(FORWARD_POLL_S)  # (a condition would need the lock in send's hot path too)

    def close(self) -> list[int]:
        """No more responses: the requests that had no final one yet (their senders refuse from now on)."""
        with self._lock:
            open_requests = [k for k, final in enumerate(self.finals) if not final]
            self.finals = [True] * len(self.finals)
        return open_requests


def run_decoupled(
    model: PythonModel,
    segment: Segment,
    batch: messages.Batch,
    requests: list[pb_utils.InferenceRequest],
    emit: Emit | None,
) -> tuple[list[Answer], float]:
    """execute with a sender per request; its responses streamed; one answer per request for RESULT
    ([] when it streamed to its final response, else the error that ended it)."""
    stream = Stream(model, segment, batch, emit)
    for k, request in enumerate(requests):
        request._sender = stream.sender(k)
    started = time.perf_counter()
    try:
        returned = model.execute(requests)
        if returned is not None:
            raise pb_utils.TritonModelException(
                f"a decoupled model's execute returns None (it answers through "
                f"its response senders), got {type(returned).__name__}"
            )
    except Exception as exc:  # noqa: BLE001 - a decoupled model's execute may raise anything: its stream ends with the error
        message = f"{type(exc).__name__}: {exc}"
        cut = set(stream.close())
        stream.forward_until_final()  # what was sent before the exception
        return (
            [failed(message, pb_utils.http_status(exc)) if k in cut else [[], None, 0] for k in range(len(requests))],
            time.perf_counter() - started,
        )
    stream.forward_until_final()
    return [[[], None, 0] for _ in requests], time.perf_counter() - started
