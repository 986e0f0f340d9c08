"""A batch's requests one by one, for the models that answer each request on its own (Python models,
ensembles): each request's input views, and each request's answer written into the slot.

Inputs: the slot holds the batch as the gateway wrote it (rows stacked, ragged inputs concatenated,
BYTES serialized). BATCH's `requests` says how many rows each request has (and a ragged input's
own shape), so each request's tensors are views of its rows: no copy on the way in (a Python
model's are writable, over a copy-on-write mapping of the slot: read_batch_inputs). BYTES inputs
are decoded into object arrays of `bytes`, as Triton's Python backend gives them.

Outputs: each answer's tensors are written once into the slot's output area, one request after
the other, and RESULT's `answers` says where (or the request's error and its HTTP status).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ringserve.common import messages, wire
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.reshape import refill
from ringserve.shm.segment import PrivateView, Segment

from .errors import OutputsDoNotFit, WorkerError
from .python import pb_utils
from .slots import read_tensor, write_packed

# Python models' inputs: copied below this, mapped copy-on-write from it (bench/private_inputs.py,
# medians per batch on the 2 loaded cores here): 4 KiB copied 6 us, mapped 16 us (mmap + munmap);
# 1 MiB read by the model: copy 141 us, mapping 164 us; 16 MiB: copy 1.5 ms before the model reads a
# byte, mapping 0.04 ms (3.7 vs 2.3 ms read once). A model that writes all of a mapped input pays a
# page fault per 4 KiB (16 MiB: 15 ms, a copy 3.2 ms): in-place writers are the rarer case.
PRIVATE_MAPPING_MIN_BYTES = 1 << 20

# [outputs (TensorRef wire forms), error or None, HTTP status (0: none)], and the response's parameters
# as a fourth item when it set any
Answer = list[Any]
# Triton's response parameter types (TRITONSERVER_PARAMETER_BOOL, INT, STRING, DOUBLE)
PARAMETER_TYPES = (bool, int, str, float)


class CancelFlags(Protocol):
    """One batch's cancellation flags (worker/python/decoupled.py: Watch, which the courier flips, and which
    imports this module): a flag per request, what request k's is_cancelled() reads, and a decoupled batch's
    stream."""

    cancelled: bytearray
    stream: Any

    def flag(self, k: int) -> Callable[[], bool]: ...


class Emit(Protocol):
    """The batch's gateway as model code reaches it from any thread (worker/python/decoupled.py: Channel, through
    the worker's courier): a decoupled stream's messages, and the flags that CANCEL flips."""

    def post(self, message: messages.Message) -> None: ...

    def watch(self, batch: messages.Batch) -> CancelFlags: ...

    def unwatch(self, batch: messages.Batch) -> None: ...


class AnswerError(WorkerError):
    """One request's answer cannot be given: its message goes to that request alone, with `status`."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


# One request's outcome of a run that answers each request (BLS, an ensemble's step): its outputs by name, or why not.
Outcome = dict[str, np.ndarray] | AnswerError


def read_batch_inputs(segment: Segment, batch: messages.Batch, *, private: bool = False) -> dict[str, np.ndarray]:
    """The batch's inputs by name; BYTES as object arrays of bytes (new objects either way).

    `private` (Python models, ensembles): writable arrays whose writes stay in this process, as
    Triton's `as_numpy()` is writable: a model that preprocesses in place (`x /= 255`) must not
    change the bytes a replay of the batch runs on after a batch-mate crashes the worker. A copy
    for inputs under PRIVATE_MAPPING_MIN_BYTES, a copy-on-write mapping of the slot from there
    (shm/segment.py: private_view; a copy where there is none). Otherwise read-only views over
    the slot (ONNX Runtime never writes its inputs).
    """
    refs = [wire.TensorRef.from_wire(item) for item in batch.inputs]
    mapped = _private_view(segment, batch.slot_index, refs) if private else None
    inputs = {}
    for ref in refs:
        if isinstance(ref, wire.BytesTensorRef):
            inputs[ref.name] = read_tensor(segment, batch.slot_index, ref, text=False)
        elif mapped is not None:
            inputs[ref.name] = mapped.tensor(ref.offset, numpy_dtype(ref.datatype), ref.shape)
        else:
            view = read_tensor(segment, batch.slot_index, ref, text=False)
            inputs[ref.name] = view.copy() if private else view
    return inputs


def _private_view(segment: Segment, slot: int, refs: Sequence[wire.TensorRef]) -> PrivateView | None:
    """One copy-on-write mapping over every fixed-size input of the batch (they lie packed in the
    slot); None (copy them) when they span less than PRIVATE_MAPPING_MIN_BYTES."""
    spans = [
        (ref.offset, ref.offset + math.prod(ref.shape) * numpy_dtype(ref.datatype).itemsize)
        for ref in refs
        if not isinstance(ref, wire.BytesTensorRef)
    ]
    if not spans or max(e for _, e in spans) - min(s for s, _ in spans) < PRIVATE_MAPPING_MIN_BYTES:
        return None
    return segment.private_view(slot, min(s for s, _ in spans), max(e for _, e in spans))


def split_requests(
    config: ModelConfig, inputs: dict[str, np.ndarray], infos: Sequence[messages.RequestInfo]
) -> list[dict[str, np.ndarray]]:
    """Each request's own tensors, as views of its rows of the batch's tensors."""
    if config.max_batch_size == 0 or len(infos) == 1 and not config.ragged_inputs:
        return [model_shaped(config, inputs)]  # one request: the batch's tensors are its own
    per_request: list[dict[str, np.ndarray]] = [{} for _ in infos]
    for name, tensor in inputs.items():
        start = 0
        ragged = name in config.ragged_inputs
        for own, info in zip(per_request, infos):
            if ragged:
                shape = tuple((info.shapes or {}).get(name, (info.rows,)))
                size = math.prod(shape)
                own[name] = tensor[start : start + size].reshape(shape)
                start += size
            else:
                own[name] = tensor[start : start + info.rows]
                start += info.rows
    return [model_shaped(config, own) for own in per_request]


def model_shaped(config: ModelConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request's inputs as the model takes them: Triton's `reshape` applied (views; core's Normalize does
    it for every backend, common/repository/reshape.py), the others as they are."""
    batched = config.max_batch_size > 0
    for tensor in config.inputs:
        array = tensors.get(tensor.name)
        if tensor.reshape is not None and array is not None and not tensor.allow_ragged_batch:
            tensors = {**tensors, tensor.name: array.reshape(refill(array.shape, tensor.dims, tensor.reshape, batched))}
    return tensors


def join_requests(pieces: list[dict[str, np.ndarray]], batched: bool) -> dict[str, np.ndarray]:
    """The requests' tensors as one batch again (rows stacked): what an ONNX step of an ensemble takes."""
    if len(pieces) == 1 or not batched:
        return pieces[0]
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def check_tensor(config: ModelConfig, name: str, array: Any) -> str:
    """The KServe datatype of output `name`, once `array` is a numpy array of that type; AnswerError otherwise."""
    tensor = config.outputs_by_name.get(name) or _state_output(config, name)
    if tensor is None:
        raise AnswerError(
            f"model {config.name!r} answered output {name!r}, which its config does not declare "
            f"(outputs: {sorted(config.outputs_by_name)})"
        )
    if not isinstance(array, np.ndarray):
        raise AnswerError(f"model {config.name!r}: output {name!r} is a {type(array).__name__}, not a numpy array")
    if tensor.datatype == "BYTES":
        if not (array.dtype.hasobject or array.dtype.kind in "SU"):
            raise AnswerError(
                f"model {config.name!r}: output {name!r} is {array.dtype}; the config declares "
                "BYTES (an object array of bytes or str)"
            )
    elif array.dtype != tensor.np_dtype:
        raise AnswerError(
            f"model {config.name!r}: output {name!r} is {array.dtype}; the config declares "
            f"{tensor.datatype} ({tensor.np_dtype})"
        )
    return tensor.datatype


def _state_output(config: ModelConfig, name: str) -> TensorConfig | None:
    """A sequence model's state output as an output tensor (its dims are the state's)."""
    for state in config.sequence_batching.states if config.sequence_batching is not None else ():
        if state.output_name == name:
            return TensorConfig(name, state.datatype, state.dims)
    return None


def write_tensors(
    segment: Segment, slot: int, start: int, tensors: Sequence[tuple[str, str, np.ndarray]]
) -> tuple[list[list[Any]], int]:
    """(name, datatype, array) each into the slot from `start`, packed (worker/slots.py: write_packed); their
    refs' wire forms and the end; AnswerError when they do not fit. The caller sets the output generation
    once every answer is written."""
    try:
        return write_packed(segment, slot, start, tensors)
    except OutputsDoNotFit as exc:
        raise AnswerError(
            f"the outputs need {exc.needed_bytes} bytes; the slot has {exc.left_bytes} "
            "left (start the server with a larger --slot-mb)"
        ) from None


def request_of(
    tensors: dict[str, Any], info: messages.RequestInfo, cancelled: Callable[[], bool] | None = None
) -> pb_utils.InferenceRequest:
    """A client's request as execute gets it; `cancelled` is what its is_cancelled() reads (CANCEL flips it)."""
    request = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor(name, array) for name, array in tensors.items()],
        requested_output_names=info.outputs,
        request_id=info.id or "",
        parameters=info.parameters,
        correlation_id=info.correlation_id,
        flags=info.flags,
        timeout=_timeout_us(info.parameters),
    )
    request._cancelled = cancelled
    return request


def _timeout_us(parameters: dict[str, Any] | None) -> int:
    """The client's `timeout` parameter (µs, checked by the gateway), as Triton's request.timeout() gives it."""
    timeout = (parameters or {}).get("timeout", 0)
    return timeout if type(timeout) is int else 0


def response_tensors(config: ModelConfig, info: messages.RequestInfo, response: Any) -> list[tuple[str, str, Any]]:
    """(name, datatype, array) of the outputs the request asked for; AnswerError for its error or a fault."""
    if not isinstance(response, pb_utils.InferenceResponse):
        raise AnswerError(
            f"model {config.name!r}: execute answered a request with {type(response).__name__}, "
            "not a pb_utils.InferenceResponse"
        )
    if response.has_error():
        error = response.error()
        raise AnswerError(error.message() if hasattr(error, "message") else str(error), pb_utils.http_status(error))
    given = {t.name(): t.as_numpy() for t in response.output_tensors()}
    wanted = info.outputs or [t.name for t in config.outputs]
    if config.sequence_batching is not None:  # its next state, for the gateway to keep (never the client's)
        wanted = list(dict.fromkeys([*wanted, *(s.output_name for s in config.sequence_batching.states)]))
    missing = [name for name in wanted if name not in given]
    if missing:
        raise AnswerError(
            f"model {config.name!r}: its response has no output {', '.join(map(repr, missing))} "
            f"(it gave {sorted(given)})"
        )
    exact = {name: client_shaped(config, name, exactly_as_declared(config, name, given[name])) for name in wanted}
    return [(name, check_tensor(config, name, exact[name]), exact[name]) for name in wanted]


def client_shaped(config: ModelConfig, name: str, array: Any) -> Any:
    """An output given in its `reshape` as the client gets it, in its dims (core's Output::Reshape)."""
    tensor = config.outputs_by_name.get(name)
    if tensor is None or tensor.reshape is None or not isinstance(array, np.ndarray):
        return array
    try:
        return array.reshape(refill(array.shape, tensor.reshape, tensor.dims, config.max_batch_size > 0))
    except ValueError:
        raise AnswerError(
            f"model {config.name!r}: output {name!r} has shape {list(array.shape)}, which its reshape "
            f"{list(tensor.reshape)} does not describe"
        ) from None


def exactly_as_declared(config: ModelConfig, name: str, array: Any) -> Any:
    """A numeric output of another dtype than its config's, converted when every value stays the same
    (Triton answers with the model's own dtype: its bls_decoupled example sums INT32 responses into an
    int64 array for an INT32 output); anything else unchanged, for check_tensor to judge."""
    tensor = config.outputs_by_name.get(name)
    if tensor is not None and isinstance(array, np.ndarray) and array.size == 0 and array.dtype != tensor.np_dtype:
        # No values to change: an empty answer in any dtype is the declared one (Triton's mock_llm answers a
        # BYTES output with np.array([]), float64, when its LLM stops at the first step).
        return np.empty(array.shape, object if tensor.datatype == "BYTES" else tensor.np_dtype)
    if (
        tensor is None
        or tensor.datatype == "BYTES"
        or not isinstance(array, np.ndarray)
        or array.dtype == tensor.np_dtype
        or array.dtype.kind not in "biuf"
    ):
        return array
    converted = array.astype(tensor.np_dtype)
    return converted if np.array_equal(converted, array) else array


def response_parameters(config: ModelConfig, response: Any) -> dict[str, Any] | None:
    """The parameters a model set on its response (a dict, or its JSON as pb_utils keeps a string), None for
    none; AnswerError for a value that is none of Triton's four types (bool, int, string, double)."""
    raw = response._parameters  # (pb_utils keeps them as the model gave them: a dict or its JSON)
    if not raw:
        return None
    try:
        params = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise AnswerError(f"model {config.name!r}: its response's parameters are not JSON ({exc})") from None
    if not isinstance(params, dict):
        raise AnswerError(f"model {config.name!r}: its response's parameters must be an object of name: value")
    for name, value in params.items():
        if not isinstance(value, PARAMETER_TYPES):
            raise AnswerError(
                f"model {config.name!r}: response parameter {name!r} is {type(value).__name__}; "
                "a response parameter is a bool, an int, a string or a float"
            )
    return params or None


def answered(refs: list, parameters: dict[str, Any] | None) -> Answer:
    return [refs, None, 0] if parameters is None else [refs, None, 0, parameters]


def failed(message: str, status: int) -> Answer:
    return [[], message, status]
