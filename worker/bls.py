"""Running a model of the repository from inside the worker: BLS requests and ensemble steps.

A Python model's `pb_utils.InferenceRequest(model_name=...).exec()` (Triton's Business Logic
Scripting) and each step of an ensemble (worker/ensemble.py) run here. On a model the worker's
registry serves they run in the process (the fast path): a lazy model is loaded on the spot (the
registry's acquire), and tensors never leave the process; a crash anywhere in them is this worker's
death, which the gateway handles as for any batch. A model the worker does not hold (it runs in
another lane: `--lanes model`) is asked through the gateway (worker/calls.py): one CALL per request,
all of a step's sent before the first is awaited, so that the gateway can batch them; no HTTP hop.

    kind      how requests run
    onnx      joined into one batch (rows stacked), one session.run, outputs split by rows
    python    its execute(requests), one response per request
    ensemble  its steps, as for a batch of its own

A request that cannot be answered comes back as an AnswerError (its message and HTTP status);
BLS hands it to the model as an InferenceResponse with has_error(), as Triton does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence

import numpy as np

from ringserve.common.messages import RequestInfo
from ringserve.common.repository.config import ModelConfig

from .calls import CallFailed, GatewayCalls, decode_response, encode_request
from .errors import BudgetExhausted, ModelLoadFailed, ModelNotReady, ModelNotServed
from .models import ModelRegistry
from .python import bls_stream, pb_utils
from .python.python_model import PythonModel
from .requests import AnswerError, join_requests, model_shaped, request_of, response_tensors
from .session import ModelSession

Outcome = dict[str, np.ndarray] | AnswerError
_TRITON_CODE = {
    400: pb_utils.TritonError.INVALID_ARG,
    404: pb_utils.TritonError.NOT_FOUND,
    503: pb_utils.TritonError.UNAVAILABLE,
    499: pb_utils.TritonError.CANCELLED,
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
            session = entry.session
            if isinstance(session, ModelSession):
                return run_onnx(entry.config, session, feeds, infos)
            if isinstance(session, PythonModel):
                return run_python(entry.config, session, feeds, infos)
            return session.run_requests(feeds, infos)
        finally:
            self.registry.release(entry)

    # -- a model of another lane, through the gateway (worker/calls.py) ---------------------------------
    def _send(
        self, model: str, version: int, feed: dict[str, np.ndarray], info: RequestInfo
    ) -> tuple[int, float] | AnswerError:
        """The CALL of one request, sent (its id and deadline), or the error that stopped it."""
        assert self.calls is not None
        outputs = info.outputs
        if not outputs and (model, version) in self.elsewhere:  # (else the gateway is told: every output)
            outputs = [t.name for t in self.elsewhere[model, version].outputs]
        try:
            body, header_length = encode_request(feed, outputs or (), info.parameters, info.id)
            return self.calls.send(model, version, body, header_length)
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
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in outcome.items()])

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        """A BLS request to a decoupled model (exec(decoupled=True)): its responses as they come."""
        return bls_stream.stream(self, request)

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        try:
            entry = self.registry.entry(model_name, int(model_version) if model_version else None)
        except ValueError:
            return False
        except ModelNotServed:  # another lane's: what the repository said at this worker's start
            version = int(model_version) if model_version else -1
            return self.calls is not None and (model_name, version) in self.elsewhere
        return entry.state != "failed"


def check_feeds(config: ModelConfig, feeds: dict[str, np.ndarray]) -> None:
    """AnswerError (400) unless `feeds` are the model's inputs, each of its datatype."""
    for name, array in feeds.items():
        tensor = config.inputs_by_name.get(name)
        if tensor is None:
            raise AnswerError(
                f"model {config.name!r} has no input {name!r} (inputs: {sorted(config.inputs_by_name)})", 400
            )
        if not isinstance(array, np.ndarray) or (
            array.dtype != tensor.np_dtype
            and not (tensor.datatype == "BYTES" and (array.dtype.hasobject or array.dtype.kind in "SU"))
        ):
            found = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
            raise AnswerError(f"model {config.name!r}: input {name!r} is {found}, it takes {tensor.datatype}", 400)
    missing = sorted(set(config.inputs_by_name) - set(feeds))
    if missing:
        raise AnswerError(f"model {config.name!r} also needs input(s) {missing}", 400)


def _as_text(array: np.ndarray) -> np.ndarray:
    """BYTES for ONNX Runtime: it takes str elements (bytes elements would become "b'...'")."""
    flat = [x.decode() if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    flat = [x.encode() if isinstance(x, str) else x for x in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def run_onnx(
    config: ModelConfig, session: ModelSession, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[RequestInfo]
) -> list[Outcome]:
    try:
        if config.batch_inputs or config.ragged_inputs:
            raise AnswerError(
                f"model {config.name!r} has batch_input or ragged inputs, which a model's own requests cannot give it",
                400,
            )
        for feed in feeds:
            check_feeds(config, feed)
        batched = config.max_batch_size > 0
        joined = join_requests(list(feeds), batched)
        joined = {n: _as_text(a) if a.dtype.hasobject or a.dtype.kind in "SU" else a for n, a in joined.items()}
        try:
            results = dict(zip(session.output_names, session.run(joined)))
        except Exception as exc:  # noqa: BLE001 - ORT's refusal of these tensors: the requests' fault
            raise AnswerError(f"model {config.name!r}: {type(exc).__name__}: {exc}", 400) from None
    except AnswerError as exc:
        return [exc] * len(feeds)
    results = {n: _as_bytes(a) if a.dtype.hasobject else a for n, a in results.items()}
    if len(feeds) == 1:
        return [_requested(config, results, infos[0])]
    rows = [info.rows for info in infos]
    starts = np.cumsum([0, *rows])
    if any(a.ndim == 0 or a.shape[0] != starts[-1] for a in results.values()):
        error = AnswerError(f"model {config.name!r}: its outputs do not have one row per input row", 500)
        return [error] * len(feeds)
    return [
        _requested(config, {n: a[starts[k] : starts[k + 1]] for n, a in results.items()}, info)
        for k, info in enumerate(infos)
    ]


def _requested(config: ModelConfig, results: dict[str, np.ndarray], info: RequestInfo) -> Outcome:
    names = info.outputs or [t.name for t in config.outputs]
    missing = [n for n in names if n not in results]
    if missing:
        return AnswerError(f"model {config.name!r} has no output(s) {missing} (outputs: {sorted(results)})", 400)
    return {n: results[n] for n in names}


def run_python(
    config: ModelConfig, model: PythonModel, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[RequestInfo]
) -> list[Outcome]:
    requests = [request_of(model_shaped(config, feed), info) for feed, info in zip(feeds, infos)]
    try:
        responses = model.execute(requests)
    except Exception as exc:  # noqa: BLE001 - a model's execute may raise anything: that batch's error, never the worker's
        return [AnswerError(f"{type(exc).__name__}: {exc}", pb_utils.http_status(exc))] * len(feeds)
    if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
        return [AnswerError(f"model {config.name!r}: execute did not return one response per request", 500)] * len(
            feeds
        )
    outcomes: list[Outcome] = []
    for info, response in zip(infos, responses):
        try:
            outcomes.append({name: array for name, _, array in response_tensors(config, info, response)})
        except AnswerError as exc:
            outcomes.append(exc)
    return outcomes
