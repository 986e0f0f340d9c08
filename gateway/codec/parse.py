"""KServe v2 inference requests in: request body (+ Inference-Header-Content-Length) -> InferRequest.

Runs on the gateway's hot path: one orjson parse, one numpy conversion per JSON input
(binary inputs are views over the body), no Python loop over tensor elements except for
BYTES. Every check that can refuse a request happens here, before it can reach a worker.
gRPC's ModelInferRequest comes through the same checks (grpc_codec.py builds the document
that parse_infer_doc takes). The answer goes out through gateway/codec/encode.py.

BYTES inputs are object arrays of bytes (any bytes in binary and gRPC tensors; UTF-8 from JSON
strings) and, for the slot, the same elements serialized in KServe's binary BYTES form
(`serialized`): the size checks count that form, not the array's 8 bytes per pointer.

Zero-sized tensors ([1, 0], [0, 4], BYTES without elements) are served as Triton serves them:
a dim may be 0, and a batching model's request of 0 rows joins a batch and gets 0 rows back.

Choices where KServe is silent: the literals NaN, Infinity and -Infinity are read in JSON,
as Triton's rapidjson reads them (kParseNanAndInfFlag), for FP tensors; a JSON number
outside the datatype's range (1e39 for FP32, 300 for UINT8) and a non-integer for an
integer type are refused, never rounded or wrapped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from ringserve.common.repository.config import ModelConfig
from ringserve.common.wire import serialize_bytes_tensor
from ringserve.gateway.batching.ragged import batch_inputs_nbytes
from ringserve.gateway.batching.steps import read_step
from ringserve.gateway.codec.binary import (
    BinaryReader,
    raw_input_shape,
    split_body,
    tensor_from_buffer,
)
from ringserve.gateway.codec.bounds import check_bounds, check_tensor_bytes
from ringserve.gateway.codec.json_body import JSON_STRUCTURE_COMMAS, WIDEST_ITEM_BYTES, JsonBudget, load_json
from ringserve.gateway.codec.outputs import check_output_room, requested_outputs
from ringserve.gateway.codec.tensors import describe_inputs, parse_input
from ringserve.gateway.core.errors import BadRequest, PayloadTooLarge, echo
from ringserve.gateway.core.phrases import names_list, say
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.regions import Region
from ringserve.gateway.core.request import InferRequest, alignment_slack_bytes, serialized_extra_bytes


def parse_infer_request(
    config: ModelConfig,
    body: bytes,
    *,
    capacity_bytes: int,
    future: asyncio.Future,
    allow_faults: bool,
    header_length: bytes | str | None = None,
    regions: RegionRegistry | None = None,
    json_counted: bool = False,
    max_tensor_bytes: int = 0,
) -> InferRequest:
    """A validated InferRequest, or BadRequest/PayloadTooLarge saying what is wrong.

    `header_length` is the Inference-Header-Content-Length header (None: the body is
    all JSON; 0: the raw form, the body is the model's single input). `regions`: the
    gateway's registered shared-memory regions (None: tensors may not name one). `max_tensor_bytes`:
    --max-tensor-bytes, the largest input tensor (0: only the slot's capacity bounds it). `json_counted`:
    a JsonBudget has already counted the JSON as it arrived.
    """
    binary = None
    if header_length is not None:
        body, binary = split_body(body, header_length, config.name)
        if len(body) == 0:
            return _parse_raw(
                config, binary, capacity_bytes=capacity_bytes, future=future, max_tensor_bytes=max_tensor_bytes
            )
    if not json_counted and len(body) > capacity_bytes // WIDEST_ITEM_BYTES + JSON_STRUCTURE_COMMAS:
        JsonBudget(config, capacity_bytes).count(body)  # (a shorter text cannot have more commas than the limit)
    return parse_infer_doc(
        config,
        load_json(body),
        binary,
        capacity_bytes=capacity_bytes,
        future=future,
        allow_faults=allow_faults,
        regions=regions,
        max_tensor_bytes=max_tensor_bytes,
    )


def parse_infer_doc(
    config: ModelConfig,
    doc: Any,
    binary: BinaryReader | None,
    *,
    capacity_bytes: int,
    future: asyncio.Future,
    allow_faults: bool,
    regions: RegionRegistry | None = None,
    max_tensor_bytes: int = 0,
) -> InferRequest:
    """The request document's checks, shared by HTTP (the JSON header) and gRPC (gateway/grpc/codec.py builds the
    same document from a ModelInferRequest). `binary` hands out the tensors whose parameters give
    binary_data_size, in order; `regions` those whose parameters name a shared-memory region."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest(
            say(
                "json_field",
                "request body must be a JSON object with an 'inputs' list (KServe v2 inference request)",
                field="inputs",
            )
        )
    inputs: dict[str, np.ndarray] = {}
    held: list[Region] | None = None  # (a list only for a request that names a region)
    forms = {} if config.bytes_inputs else None
    for item in doc["inputs"]:
        name, array, region = parse_input(config, item, binary, regions, capacity_bytes, forms, max_tensor_bytes)
        if name in inputs:
            raise BadRequest(say("input_twice", f"input {name!r} is given twice", input=name))
        inputs[name] = array
        if region is not None:
            held = [region] if held is None else [*held, region]
    if binary is not None:
        binary.finish()
    _generate_mask(config, inputs)
    if len(inputs) < len(config.inputs):
        _check_required(config, inputs)
    rows = _check_rows(config, inputs)
    serialized = _serialize_bytes_inputs(config, inputs, forms) if config.bytes_inputs else None
    if max_tensor_bytes and serialized is not None:
        for name, data in serialized.items():
            check_tensor_bytes(config.inputs_by_name[name], inputs[name].shape, len(data), max_tensor_bytes)
    _check_size(config, inputs, rows, capacity_bytes, serialized)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    priority, timeout_us = _schedule_parameters(config, params)
    step = read_step(config, params, rows) if config.sequence_batching is not None else None
    requested, binary_outputs, output_regions, classes = requested_outputs(config, doc, params, regions)
    if output_regions is not None:
        check_output_room(config, rows, output_regions)
        held = [*(held or ()), *(target.region for target in output_regions.values())]
    return InferRequest(
        priority=priority,
        timeout_us=timeout_us,
        model=config,
        inputs=inputs,
        rows=rows,
        shape_key=_shape_key(config, inputs),
        kserve_id=_kserve_id(doc),
        requested_outputs=requested,
        binary_outputs=binary_outputs,
        fault=params.get("ringserve_fault") if allow_faults else None,
        future=future,
        serialized=serialized,
        shm_regions=held,
        output_regions=output_regions,
        classes=classes,
        parameters=params or None,
        sequence=step,
    )


def _check_required(config: ModelConfig, inputs: dict[str, np.ndarray]) -> None:
    """Every input but the optional ones (Triton's count check, in its words)."""
    missing = [name for name in config.required_inputs if name not in inputs]
    if not missing:
        return
    detail = f"missing input(s) {', '.join(missing)}; model {config.name!r} takes: {describe_inputs(config)}"
    fields = {
        "expected": len(config.inputs),
        "got": len(inputs),
        "model": config.name,
        "given": names_list(list(inputs)),
        "missing": names_list(missing),
    }
    if len(config.required_inputs) == len(config.inputs):
        raise BadRequest(say("input_count", detail, **fields))
    raise BadRequest(say("input_count_optional", detail, required=len(config.required_inputs), **fields))


def _shape_key(config: ModelConfig, inputs: dict[str, np.ndarray]) -> tuple:
    """Requests with equal keys may share a batch (gateway/batching/padding.py). A model with optional inputs
    also keys by the names given (Triton's rule): a request that leaves one out never shares a batch
    with one that gives it."""
    if len(config.required_inputs) != len(config.inputs):
        return tuple((name, a.shape[1:] if config.max_batch_size > 0 else a.shape) for name, a in inputs.items())
    if config.max_batch_size > 0:
        return tuple(a.shape[1:] for a in inputs.values())
    return tuple(a.shape for a in inputs.values())


def _parse_raw(
    config: ModelConfig, binary: BinaryReader, *, capacity_bytes: int, future: asyncio.Future, max_tensor_bytes: int = 0
) -> InferRequest:
    """Raw binary request (header length 0): the body is the single input; outputs come back binary."""
    if len(config.inputs) != 1:
        raise BadRequest(
            say(
                "raw_input_count",
                "a raw request (Inference-Header-Content-Length: 0) is for models "
                f"with one input; model {config.name!r} takes: "
                f"{describe_inputs(config)}",
                got=len(config.inputs),
                model=config.name,
            )
        )
    (tensor,) = config.inputs
    batched = config.max_batch_size > 0
    shape = raw_input_shape(tensor, batched, len(binary.data))
    if config.max_dims:
        check_bounds(config, tensor, list(shape))
    if max_tensor_bytes:
        check_tensor_bytes(tensor, shape, len(binary.data), max_tensor_bytes)
    data = binary.take(tensor.name, len(binary.data))
    serialized = None
    if tensor.datatype == "BYTES":  # the body is the one element's bytes (Triton prepends its length)
        element = bytes(data)
        array = np.empty(1, dtype=np.object_)
        array[0] = element
        inputs = {tensor.name: array.reshape(shape)}
        serialized = {tensor.name: serialize_bytes_tensor(array)}
    else:
        inputs = {tensor.name: tensor_from_buffer(tensor, shape, data, config.name)}
    rows = _check_rows(config, inputs)
    _check_size(config, inputs, rows, capacity_bytes, serialized)
    return InferRequest(
        model=config,
        inputs=inputs,
        rows=rows,
        shape_key=(shape[1:] if batched else shape,),
        kserve_id=None,
        requested_outputs=None,
        fault=None,
        future=future,
        serialized=serialized,
        binary_outputs=frozenset(t.name for t in config.outputs),
        sequence=read_step(config, {}, rows) if config.sequence_batching is not None else None,
    )


def _generate_mask(config: ModelConfig, inputs: dict[str, np.ndarray]) -> None:
    """A padded model's declared mask input may be left out: it is 1 on every real position."""
    padding = config.dynamic_batching.padding if config.dynamic_batching else None
    if padding is None or padding.mask_input is None or padding.mask_input in inputs:
        return
    mask = config.inputs_by_name.get(padding.mask_input)
    if mask is None:
        return
    like = next((a for a in inputs.values() if a.ndim == len(mask.dims) + (config.max_batch_size > 0)), None)
    if like is not None:
        inputs[padding.mask_input] = np.ones(like.shape, dtype=mask.np_dtype)


def _check_rows(config: ModelConfig, inputs: dict[str, np.ndarray]) -> int:
    if config.max_batch_size == 0:
        return 1
    rows = {a.shape[0] for a in inputs.values()}
    if len(rows) != 1:
        first = next(iter(inputs.values())).shape[0]
        odd = next(name for name, a in inputs.items() if a.shape[0] != first)
        raise BadRequest(
            say(
                "batch_mismatch",
                f"inputs disagree on the batch dimension: {sorted(rows)}; all inputs must have the same first dim",
                input=odd,
                model=config.name,
            )
        )
    (n,) = rows
    if n > config.max_batch_size:
        raise BadRequest(
            say(
                "batch_size",
                f"batch dimension {n} exceeds model {config.name!r} max_batch_size {config.max_batch_size}",
                max=config.max_batch_size,
                model=config.name,
            )
        )
    return n


def _check_size(
    config: ModelConfig,
    inputs: dict[str, np.ndarray],
    rows: int,
    capacity_bytes: int,
    serialized: dict[str, bytes] | None = None,
) -> None:
    """413 when this request alone cannot fit a slot (inputs + fixed-size outputs, aligned).

    The batcher's max_rows and _fits use the same rule, so an accepted request always fits a batch.
    """
    needed = alignment_slack_bytes(config) + rows * config.fixed_row_bytes
    for array in inputs.values():
        needed += array.nbytes
    if config.batch_inputs:
        needed += batch_inputs_nbytes(config, [inputs])
    if serialized is not None:
        needed += serialized_extra_bytes(inputs, serialized)
    if needed > capacity_bytes:
        raise PayloadTooLarge(needed, capacity_bytes)


def _serialize_bytes_inputs(
    config: ModelConfig, inputs: dict[str, np.ndarray], forms: dict[str, bytes]
) -> dict[str, bytes]:
    return {
        name: forms[name] if name in forms else serialize_bytes_tensor(inputs[name]) for name in config.bytes_inputs
    }


def _schedule_parameters(config: ModelConfig, params: dict) -> tuple[int, int]:
    """KServe schedule-policy extension: `priority` (1 = highest) and `timeout` in microseconds."""
    priority, timeout_us = params.get("priority", 0), params.get("timeout", 0)
    for name, value in (("priority", priority), ("timeout", timeout_us)):
        if type(value) is not int or value < 0:
            raise BadRequest(
                say("json_field", f"parameters.{name} must be a non-negative integer, got {echo(value)}", field=name)
            )
    levels = config.dynamic_batching.priority_levels if config.dynamic_batching else 0
    if priority > levels:
        raise BadRequest(
            f"parameters.priority {priority} is out of range; model {config.name!r} has "
            f"{levels} priority level(s) (1 = highest, 0 = the model's default)"
        )
    return priority, timeout_us


def _kserve_id(doc: dict) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest(say("json_field", "'id' must be a string", field="id"))
    return rid
