"""Running a model of the repository from inside the worker: BLS requests and ensemble steps.

A Python model's `pb_utils.InferenceRequest(model_name=...).exec()` (Triton's Business Logic
Scripting) and each step of an ensemble (worker/ensemble.py) run here. On a model the worker's
registry serves they run in the process (the fast path): a lazy model is loaded on the spot (the
registry's acquire), and tensors never leave the process; a crash anywhere in them is this worker's
death, which the gateway handles as for any batch. A model the worker does not hold (it runs in
another lane: `--lanes model`) is asked through the gateway (worker/calls.py): one CALL per request,
all of a step's sent before the first is awaited, so that the gateway can batch them; no HTTP hop. A
decoupled model's (exec(decoupled=True)) streams its responses back as it sends them (worker/calls_stream.py).

    kind      how requests run
    onnx      joined into one batch (rows stacked), one session.run, outputs split by rows
    python    its execute(requests), one response per request
    ensemble  its steps, as for a batch of its own

A request that cannot be answered comes back as an AnswerError (its message and HTTP status);
BLS hands it to the model as an InferenceResponse with has_error(), as Triton does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator, Sequence

import numpy as np

from ringserve.common.messages import RequestInfo
from ringserve.common.repository.config import ModelConfig

from .calls import CallFailed, GatewayCalls, decode_response, encode_request
from .calls_stream import RemoteResponses
from .errors import BudgetExhausted, ModelLoadFailed, ModelNotReady, ModelNotServed
from .models import ModelRegistry
from .python import bls_stream, pb_utils
from .requests import AnswerError, Outcome

_TRITON_CODE = {
    400: pb_utils.TritonError.INVALID_ARG,
    404: pb_utils.TritonError.NOT_FOUND,
    503: pb_utils.TritonError.UNAVAILABLE,
    499: pb_utils.TritonError.CANCELLED,
    501: pb_utils.TritonError.UNSUPPORTED,
}


class Runtime:
    """The worker's models, as BLS and ensembles call them (pb_utils.set_runtime); with `calls`, the
    models of other lanes too, through the gateway. `elsewhere`: the repository's configs of the models
    other lanes hold (what an ensemble's steps are checked against), by (name, version), -1 the default."""

    def __init__(
        self,
        registry: ModelRegistry,
        calls: GatewayCalls | None = None,
        elsewhere: dict[tuple[str, int], ModelConfig] | None = None,
    ) -> None:
        self.registry = registry
        self.calls = calls
        self.elsewhere = elsewhere or {}

    def config(self, model: str, version: int = -1) -> ModelConfig:
        try:
            return self.registry.entry(model, None if version == -1 else version).config
        except ModelNotServed:
            found = self.elsewhere.get((model, version)) if self.calls is not None else None
            if found is None:
                raise
            return found

    def holds(self, model: str, version: int = -1) -> bool:
        try:
            self.registry.entry(model, None if version == -1 else version)
        except ModelNotServed:
            return False
        return True

    def run(
        self, model: str, version: int, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[RequestInfo]
    ) -> list[Outcome]:
        """Each request's outputs by name (or its AnswerError), run on `model` as one batch."""
        try:
            entry = self.registry.acquire(model, None if version == -1 else version)
        except ModelNotServed as exc:
            if self.calls is not None:
                return [self._wait(model, sent) for sent in [self._send(model, version, *r) for r in zip(feeds, infos)]]
            return [AnswerError(f"Model '{model}' is not ready: {exc}", 404)] * len(feeds)
        except (ModelLoadFailed, BudgetExhausted, ModelNotReady) as exc:
            return [AnswerError(f"Model '{model}' is not ready: {exc}", 503)] * len(feeds)
        try:
            return entry.session.run_requests(feeds, infos)
        finally:
            self.registry.release(entry)

    # -- a model of another lane, through the gateway (worker/calls.py) ---------------------------------
    def _send(
        self, model: str, version: int, feed: dict[str, np.ndarray], info: RequestInfo, stream: bool = False
    ) -> tuple[int, float] | AnswerError:
        """The CALL of one request, sent (its id and deadline), or the error that stopped it."""
        assert self.calls is not None
        outputs = info.outputs
        if not outputs and (model, version) in self.elsewhere:  # (else the gateway is told: every output)
            outputs = [t.name for t in self.elsewhere[model, version].outputs]
        try:
            body, header_length = encode_request(feed, outputs or (), info.parameters, info.id)
            return self.calls.send(model, version, body, header_length, stream)
        except CallFailed as exc:
            return AnswerError(f"Model '{model}' is not ready: {exc}", exc.status)
        except Exception as exc:  # noqa: BLE001 - a tensor no request can carry (a dtype KServe has not): its error
            return AnswerError(f"model {model!r}: {type(exc).__name__}: {exc}", 400)

    def _wait(self, model: str, sent: tuple[int, float] | AnswerError) -> Outcome:
        if isinstance(sent, AnswerError):
            return sent
        assert self.calls is not None
        try:
            reply, body = self.calls.wait(*sent)
        except CallFailed as exc:
            return AnswerError(f"Model '{model}' is not ready: {exc}", exc.status)
        if reply.status != 200:  # (404: Triton's words for a model it cannot run, as the fast path says them)
            return AnswerError(
                f"Model '{model}' is not ready: {reply.error}" if reply.status == 404 else reply.error, reply.status
            )
        return decode_response(body, reply.header_length)

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """A BLS request: the response, with the error as has_error() when it could not be answered."""
        model, version, feeds, info = self._request(request)
        (outcome,) = self.run(model, version, [feeds], [info])
        return self._response(outcome)

    async def infer_async(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """async_exec: a model of another lane is asked at once and awaited off the event loop, so that
        requests gathered together run at once there; the fast path runs here and now, as exec()."""
        model, version, feeds, info = self._request(request)
        if self.calls is None or self.holds(model, version):
            (outcome,) = self.run(model, version, [feeds], [info])
            return self._response(outcome)
        sent = self._send(model, version, feeds, info)
        outcome = await asyncio.get_running_loop().run_in_executor(None, self._wait, model, sent)
        return self._response(outcome)

    @staticmethod
    def _request(request: pb_utils.InferenceRequest) -> tuple[str, int, dict[str, np.ndarray], RequestInfo]:
        feeds = {t.name(): t.as_numpy() for t in request.inputs()}
        rows = next((a.shape[0] for a in feeds.values() if a.ndim), 1)
        info = RequestInfo(
            rows=rows,
            id=request.request_id() or None,
            outputs=request.requested_output_names() or None,
            parameters=json.loads(request.parameters() or "{}") or None,
        )
        return request.model_name, request.model_version, feeds, info

    @staticmethod
    def _response(outcome: Outcome) -> pb_utils.InferenceResponse:
        if isinstance(outcome, AnswerError):
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(
                    str(outcome), _TRITON_CODE.get(outcome.status, pb_utils.TritonError.INTERNAL)
                )
            )
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(n, a) for n, a in outcome.items()],
            parameters=getattr(outcome, "parameters", None),  # (what the called model set: Outputs)
        )

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        """A BLS request to a decoupled model (exec(decoupled=True)): its responses as they come; a model
        of another lane's through the gateway (worker/calls_stream.py)."""
        if self.calls is None or self.holds(request.model_name, request.model_version):
            return bls_stream.stream(self, request)
        model, version, feeds, info = self._request(request)
        if request.timeout() > 0:  # (the gateway ends the stream at it: KServe's schedule-policy `timeout`)
            info = dataclasses.replace(info, parameters={**(info.parameters or {}), "timeout": request.timeout()})
        sent = self._send(model, version, feeds, info, stream=True)
        return RemoteResponses(self.calls, model, sent, request.timeout())

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        try:
            entry = self.registry.entry(model_name, int(model_version) if model_version else None)
        except ValueError:
            return False
        except ModelNotServed:  # another lane's: what the repository said at this worker's start
            version = int(model_version) if model_version else -1
            return self.calls is not None and (model_name, version) in self.elsewhere
        return entry.state != "failed"
