"""BLS to a decoupled model of another lane: `exec(decoupled=True)` through the gateway (worker/calls.py).

    Runtime.stream       CALL(stream) with the request's body, and its `timeout` (µs) as the KServe
                         `timeout` parameter (the gateway ends the stream at it where the model's queue
                         policy lets a request lower its timeout, as for any client)
    gateway              the target's stream through the data plane, as a gRPC stream's (gateway/calls/stream.py)
    RemoteResponses      one CALL_REPLY per response the model sends, read as the caller iterates; the one
                         with `final` ends the iterator (a final flag sent alone: an empty response)

Errors come as Triton's: one response with has_error(), after which the iterator ends (the model not
served, 404; its lane killed mid-stream, the stream broken; the deadline, 504; no gateway answering by
the call's bound, 503; the request's `timeout` passing between two responses, 503, as in the caller's
own worker: worker/python/bls_stream.py, and the target is told it is cancelled).

cancel() is Triton's ResponseIterator.cancel(): the target's request is cancelled (its is_cancelled()
turns true and its slot is freed), and the iterator ends with the CANCELLED error the gateway answers.
An iterator dropped before its end drops what still comes (Triton's reads it to the end).
"""

from __future__ import annotations

import time

from .calls import CallFailed, GatewayCalls, decode_response
from .python import pb_utils
from .python.bls_stream import error_response
from .requests import AnswerError


class RemoteResponses:
    """The responses of one BLS stream call, as their CALL_REPLYs come (thread-safe as GatewayCalls is)."""

    def __init__(
        self, calls: GatewayCalls, model: str, sent: tuple[int, float] | AnswerError, timeout_us: int = 0
    ) -> None:
        self._calls, self._model = calls, model
        self._timeout_s = timeout_us / 1e6 if timeout_us > 0 else None
        self._first: pb_utils.InferenceResponse | None = None
        self._call_id, self._deadline = 0, 0.0
        if isinstance(sent, AnswerError):  # (never sent: its one error response)
            self._first = error_response(str(sent), sent.status)
        else:
            self._call_id, self._deadline = sent
        self._done = False

    def __iter__(self) -> RemoteResponses:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        if self._done:
            raise StopIteration
        if self._first is not None:
            self._done = True
            return self._first
        deadline = self._deadline
        if self._timeout_s is not None:
            deadline = min(deadline, time.monotonic() + self._timeout_s)
        try:
            reply, body = self._calls.wait(self._call_id, deadline)
        except CallFailed as exc:
            self._done = True
            if deadline == self._deadline:
                return error_response(f"Model '{self._model}' is not ready: {exc}", exc.status)
            self._calls.cancel(self._call_id)  # (what still comes is dropped: wait gave the call up)
            return error_response(f"the request's timeout ({self._timeout_s} s) passed before its next response", 503)
        self._done = reply.final
        if reply.status != 200:  # (404: Triton's words for a model it cannot run, as the fast path says them)
            message = f"Model '{self._model}' is not ready: {reply.error}" if reply.status == 404 else reply.error
            return error_response(message, reply.status)
        if not reply.header_length:
            return pb_utils.InferenceResponse()
        outputs = decode_response(body, reply.header_length)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in outputs.items()])

    def cancel(self) -> None:
        """Triton's ResponseIterator.cancel(): the target's request is cancelled; iterate on to its end."""
        if not self._done and self._first is None:
            self._calls.cancel(self._call_id)

    def __del__(self) -> None:
        if not self._done and self._first is None:
            self._calls.abandon(self._call_id)
