"""KServe v2 JSON: request body -> InferRequest (numpy tensors), outputs -> response body.

Runs on the gateway's hot path: one orjson parse, one numpy conversion per input, no
Python loop over tensor elements.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from common.config import ModelConfig, TensorConfig
from shm.layout import ALIGN_BYTES

from .errors import BadRequest, PayloadTooLarge

_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(eq=False, slots=True)
class InferRequest:
    """One accepted inference request, from parse to its single response."""

    model: ModelConfig
    inputs: dict[str, np.ndarray]  # batched models: leading dim = this request's rows
    rows: int
    shape_key: tuple  # non-batch shapes of every input: requests batch only when equal
    request_id: str | None
    requested_outputs: list[str] | None
    fault: str | None
    future: asyncio.Future
    enqueued_at: float = 0.0
    deadline: float = 0.0
    done: bool = False  # answered (result, error or expiry); skip it wherever it still sits
    held: bool = False  # accepted while no worker was ready (hold policy): expiry means 503
    group: tuple = ()  # the batcher's group key (shape or length bucket), set when queued
    hard_deadline: float = 0.0  # the server's bound; a DELAYed request still gets 504 here
    disconnected: Any = None  # () -> bool: has the client gone away? (None: never asked)
    outcome: tuple = (None, None)  # (result, error) once finished
    priority: int = 0  # parameters.priority: 1 = highest; 0 = the model's default level
    timeout_us: int = 0  # parameters.timeout (µs); 0 = the model's default
    timer: Any = None
    extra: dict = field(default_factory=dict)


def _describe_inputs(config: ModelConfig) -> str:
    return ", ".join(f"{t.name} ({t.datatype} {_dims_text(config, t)})" for t in config.inputs)


def _dims_text(config: ModelConfig, tensor: TensorConfig) -> str:
    dims = ([-1] if config.max_batch_size > 0 else []) + list(tensor.dims)
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_shape(config: ModelConfig, tensor: TensorConfig, shape: Any) -> tuple[int, ...]:
    if type(shape) is not list:
        raise BadRequest(f"input {tensor.name!r}: shape must be a list of non-negative integers, got {shape!r}")
    dims = tensor.dims
    batched = config.max_batch_size > 0
    if len(shape) != len(dims) + batched:
        raise _shape_mismatch(config, tensor, shape)
    for i, d in enumerate(shape):
        if type(d) is not int or d < 0:
            raise BadRequest(f"input {tensor.name!r}: shape must be a list of non-negative integers, got {shape!r}")
        if d == 0:
            raise BadRequest(f"input {tensor.name!r}: shape {shape} has a zero dimension; every dimension must be >= 1")
        expected = -1 if batched and i == 0 else dims[i - batched]
        if expected != -1 and expected != d:
            raise _shape_mismatch(config, tensor, shape)
    return tuple(shape)


def _shape_mismatch(config: ModelConfig, tensor: TensorConfig, shape: list) -> BadRequest:
    return BadRequest(f"input {tensor.name!r}: shape {shape} does not match {_dims_text(config, tensor)} (-1 = any size)")


def _to_array(tensor: TensorConfig, shape: tuple[int, ...], data: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise BadRequest(f"input {tensor.name!r}: 'data' must be a list (flat or nested, row-major)")
    try:
        array = np.asarray(data, dtype=tensor.np_dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input {tensor.name!r}: data is not a {tensor.datatype} tensor ({exc})") from None
    count = math.prod(shape)
    if array.size != count:
        raise BadRequest(f"input {tensor.name!r}: shape {list(shape)} needs {count} values, data has {array.size}")
    return array.reshape(shape)


def _parse_input(config: ModelConfig, item: Any) -> tuple[str, np.ndarray]:
    if not isinstance(item, dict) or "name" not in item:
        raise BadRequest("each entry of 'inputs' must be an object with name, shape, datatype and data")
    name = item["name"]
    tensor = config.inputs_by_name.get(name) if isinstance(name, str) else None
    if tensor is None:
        raise BadRequest(f"unknown input {name!r}; model {config.name!r} takes: {_describe_inputs(config)}")
    if item.get("datatype") != tensor.datatype:
        raise BadRequest(f"input {name!r}: datatype {item.get('datatype')!r}; model {config.name!r} expects {tensor.datatype}")
    if tensor.datatype == "BYTES":
        raise BadRequest(f"input {name!r} is a BYTES tensor; this server does not take BYTES tensors yet")
    if "data" not in item:
        raise BadRequest(f"input {name!r}: no 'data' (the binary tensor extension is not enabled yet)")
    shape = _check_shape(config, tensor, item.get("shape"))
    return name, _to_array(tensor, shape, item["data"])


def parse_infer_request(config: ModelConfig, body: bytes, *, capacity_bytes: int,
                        future: asyncio.Future, allow_faults: bool) -> InferRequest:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("request body must be a JSON object with an 'inputs' list (KServe v2 inference request)")
    inputs: dict[str, np.ndarray] = {}
    for item in doc["inputs"]:
        name, array = _parse_input(config, item)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = array
    _generate_mask(config, inputs)
    missing = [t.name for t in config.inputs if t.name not in inputs]
    if missing:
        raise BadRequest(f"missing input(s) {', '.join(missing)}; model {config.name!r} takes: {_describe_inputs(config)}")
    rows = _check_rows(config, inputs)
    _check_size(config, inputs, rows, capacity_bytes)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    priority, timeout_us = _schedule_parameters(config, params)
    return InferRequest(
        priority=priority, timeout_us=timeout_us,
        model=config, inputs=inputs, rows=rows,
        shape_key=tuple(a.shape[1:] for a in inputs.values()) if config.max_batch_size > 0
        else tuple(a.shape for a in inputs.values()),
        request_id=_request_id(doc), requested_outputs=_requested_outputs(config, doc),
        fault=params.get("ringserve_fault") if allow_faults else None, future=future,
    )


def _generate_mask(config: ModelConfig, inputs: dict[str, np.ndarray]) -> None:
    """A padded model's declared mask input may be left out: it is 1 on every real position."""
    padding = config.dynamic_batching.padding if config.dynamic_batching else None
    if padding is None or padding.mask_input is None or padding.mask_input in inputs:
        return
    mask = config.inputs_by_name.get(padding.mask_input)
    like = next((a for a in inputs.values() if a.ndim == len(mask.dims) + (config.max_batch_size > 0)), None)
    if mask is not None and like is not None:
        inputs[padding.mask_input] = np.ones(like.shape, dtype=mask.np_dtype)


def _check_rows(config: ModelConfig, inputs: dict[str, np.ndarray]) -> int:
    if config.max_batch_size == 0:
        return 1
    rows = {a.shape[0] for a in inputs.values()}
    if len(rows) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(rows)}; all inputs must have the same first dim")
    (n,) = rows
    if n > config.max_batch_size:
        raise BadRequest(f"batch dimension {n} exceeds model {config.name!r} max_batch_size {config.max_batch_size}")
    return n


def alignment_slack_bytes(config: ModelConfig) -> int:
    """Most bytes lost to 64-byte alignment in one batch: one per tensor (inputs + outputs)."""
    return ALIGN_BYTES * (len(config.inputs) + len(config.outputs))


def _check_size(config: ModelConfig, inputs: dict[str, np.ndarray], rows: int, capacity_bytes: int) -> None:
    """413 when this request alone cannot fit a slot (inputs + fixed-size outputs, aligned).

    The batcher's max_rows uses the same rule, so an accepted request always fits a batch.
    """
    needed = alignment_slack_bytes(config) + rows * config.fixed_output_row_bytes
    for array in inputs.values():
        needed += array.nbytes
    if needed > capacity_bytes:
        raise PayloadTooLarge(needed, capacity_bytes)


def _schedule_parameters(config: ModelConfig, params: dict) -> tuple[int, int]:
    """KServe schedule-policy extension: `priority` (1 = highest) and `timeout` in microseconds."""
    priority, timeout_us = params.get("priority", 0), params.get("timeout", 0)
    for name, value in (("priority", priority), ("timeout", timeout_us)):
        if type(value) is not int or value < 0:
            raise BadRequest(f"parameters.{name} must be a non-negative integer, got {value!r}")
    levels = config.dynamic_batching.priority_levels if config.dynamic_batching else 0
    if priority > levels:
        raise BadRequest(f"parameters.priority {priority} is out of range; model {config.name!r} has "
                         f"{levels} priority level(s) (1 = highest, 0 = the model's default)")
    return priority, timeout_us


def _request_id(doc: dict) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("'id' must be a string")
    return rid


def _requested_outputs(config: ModelConfig, doc: dict) -> list[str] | None:
    outs = doc.get("outputs")
    if outs is None:
        return None
    if not isinstance(outs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outs):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    known = {t.name for t in config.outputs}
    names = [o["name"] for o in outs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadRequest(f"unknown output(s) {', '.join(unknown)}; model {config.name!r} has: {', '.join(sorted(known))}")
    return names


def encode_infer_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> bytes:
    config = request.model
    names = request.requested_outputs or [t.name for t in config.outputs]
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.request_id is not None:
        doc["id"] = request.request_id
    doc["outputs"] = [
        {"name": n, "datatype": config.output(n).datatype, "shape": list(outputs[n].shape),
         "data": outputs[n].reshape(-1)}
        for n in names
    ]
    return orjson.dumps(doc, option=_NUMPY_OPTS)
