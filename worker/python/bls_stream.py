"""BLS to a decoupled model: `pb_utils.InferenceRequest(...).exec(decoupled=True)`, an iterator of its responses.

As in Triton (python_backend's README, "Using BLS with Decoupled Models"): the target model's execute
runs at once, in this worker, on a request whose response sender hands each response to the caller's
iterator, from execute or from the model's own threads; the iterator ends with the response sent with
TRITONSERVER_RESPONSE_COMPLETE_FINAL, an empty one when the final flag came alone (Triton's examples
skip a response without outputs). An error (the model not served, execute raising, the request's
`timeout` passing between two responses) is one response with has_error() that ends the iterator; so is
cancel() (CANCELLED), which the target's request.is_cancelled() and sender.is_cancelled() see. A
model that is not decoupled answers with one response, as exec() would.

A decoupled model of another lane (`--lanes model`) streams through the gateway instead
(worker/calls_stream.py), with the same iterator's behaviour.

The registry's reference to the target is released once its execute has returned: a decoupled model's
threads go on sending into the iterator, and a model unloaded meanwhile is finalized as at any unload.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Protocol

from ringserve.common.messages import RequestInfo

from ..errors import BudgetExhausted, ModelLoadFailed, ModelNotReady, ModelNotServed
from ..models import ModelRegistry
from ..requests import request_of
from . import pb_utils
from .python_model import PythonModel


class BlsRuntime(Protocol):
    """What a streaming BLS request uses of the worker's BLS runtime (worker/bls.py: Runtime, which imports
    this module): its registry, and its unary path for a model that is not decoupled."""

    registry: ModelRegistry

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse: ...


class ResponseIterator:
    """The responses of one BLS request to a decoupled model, as they come."""

    def __init__(self, timeout_us: int) -> None:
        self._queue: queue.SimpleQueue[tuple[pb_utils.InferenceResponse | None, bool]] = queue.SimpleQueue()
        self._timeout_s = timeout_us / 1e6 if timeout_us > 0 else None
        self._done = False
        self.cancelled = False  # what the target's request.is_cancelled() and sender.is_cancelled() read

    def put(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        self._queue.put((response, final))

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        if self._done:
            raise StopIteration
        if self.cancelled:  # (as the gateway answers a cancelled stream of another lane: worker/calls_stream.py)
            self._done = True
            return error_response("the BLS request was cancelled: its caller cancelled it", 499)
        try:
            response, final = self._queue.get(timeout=self._timeout_s)
        except queue.Empty:
            self._done = True
            return error_response(f"the request's timeout ({self._timeout_s} s) passed before its next response", 503)
        self._done = final
        return pb_utils.InferenceResponse() if response is None else response

    def cancel(self) -> None:
        """Triton's ResponseIterator.cancel(): the target's is_cancelled() turns true, and the iterator ends
        with a CANCELLED error response (what the model sends afterwards is dropped)."""
        self.cancelled = True


def error_response(message: str, status: int) -> pb_utils.InferenceResponse:
    codes = {
        400: pb_utils.TritonError.INVALID_ARG,
        404: pb_utils.TritonError.NOT_FOUND,
        499: pb_utils.TritonError.CANCELLED,
        503: pb_utils.TritonError.UNAVAILABLE,
    }
    code = codes.get(status, pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def stream(runtime: BlsRuntime, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
    """Run `request` on its (decoupled) model; its responses as they come (see the module's docstring)."""
    model, version = request.model_name, request.model_version
    try:
        entry = runtime.registry.acquire(model, None if version == -1 else version)
    except ModelNotServed as exc:
        return iter([error_response(f"Model '{model}' is not ready: {exc}", 404)])
    except (ModelLoadFailed, BudgetExhausted, ModelNotReady) as exc:
        return iter([error_response(f"Model '{model}' is not ready: {exc}", 503)])
    try:
        session = entry.session
        if not (isinstance(session, PythonModel) and entry.config.decoupled):
            return iter([runtime.infer(request)])
        responses = ResponseIterator(request.timeout())
        feeds = {t.name(): t.as_numpy() for t in request.inputs()}
        info = RequestInfo(
            rows=next((a.shape[0] for a in feeds.values() if a.ndim), 1),
            id=request.request_id() or None,
            outputs=request.requested_output_names() or None,
            parameters=json.loads(request.parameters() or "{}") or None,
        )
        target = request_of(feeds, info)
        target._cancelled = lambda: responses.cancelled
        target._sender = pb_utils.InferenceResponseSender(responses.put, target._cancelled)
        try:
            session.execute([target])
        except Exception as exc:  # noqa: BLE001 - the target's execute may raise anything: the caller's error response
            responses.put(error_response(f"{type(exc).__name__}: {exc}", pb_utils.http_status(exc)), True)
        return responses
    finally:
        runtime.registry.release(entry)
