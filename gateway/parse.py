"""KServe v2 inference requests in: request body (+ Inference-Header-Content-Length) -> InferRequest.

Runs on the gateway's hot path: one orjson parse, one numpy conversion per JSON input
(binary inputs are views over the body), no Python loop over tensor elements except for
BYTES. Every check that can refuse a request happens here, before it can reach a worker.
gRPC's ModelInferRequest comes through the same checks (grpc_codec.py builds the document
that parse_infer_doc takes). The answer goes out through gateway/encode.py.

BYTES inputs are object arrays of bytes (UTF-8: the model's string tensors hold text) and,
for the slot, the same elements serialized in KServe's binary BYTES form (`serialized`):
the size checks count that form, not the array's 8 bytes per pointer.

Choices where KServe is silent: JSON has no NaN/Infinity, so such values must come as
binary tensors; a JSON number outside the datatype's range (1e39 for FP32, 300 for
UINT8) and a non-integer for an integer type are refused, never rounded or wrapped.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import orjson

from ringserve.common.model_config import ModelConfig, TensorConfig
from ringserve.common.wire import serialize_bytes_tensor

from .binary import BinaryReader, raw_input_shape, split_body, tensor_from_buffer
from .errors import BadRequest, PayloadTooLarge
from .ragged import batch_inputs_nbytes
from .request import InferRequest, alignment_slack_bytes, serialized_extra_bytes
from .shm_regions import PARAM_REGION, OutputRegion, Region, RegionError, RegionRegistry


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
    dtype = tensor.np_dtype
    try:
        if dtype.kind == "f":
            if dtype.itemsize == 8:  # orjson refuses doubles past the FP64 range: nothing can overflow
                array = _float_array(data, dtype)
            else:
                with np.errstate(over="raise"):  # 1e39 as FP32 is an error, not inf
                    array = _float_array(data, dtype)
        elif dtype.kind == "O":
            array = _bytes_from_json(tensor, data)
        else:
            array = _exact_array(tensor, data)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise BadRequest(f"input {tensor.name!r}: data is not a {tensor.datatype} tensor ({exc})") from None
    count = math.prod(shape)
    if array.size != count:
        raise BadRequest(f"input {tensor.name!r}: shape {list(shape)} needs {count} values, data has {array.size}")
    return array.reshape(shape)


def _float_array(data: list, dtype: np.dtype) -> np.ndarray:
    """A flat list (the usual form) through np.fromiter: 5.5 vs 19.5 µs for 512 FP32 values, as np.asarray
    looks into every element for a nested sequence. The same values (float(), the same cast) and overflow
    error; what fromiter cannot take (nested lists, a dict, a word) gets np.asarray's shape or error."""
    try:
        return np.fromiter(data, dtype=dtype, count=len(data))
    except (ValueError, TypeError):
        return np.asarray(data, dtype=dtype)


def _exact_array(tensor: TensorConfig, data: list) -> np.ndarray:
    """BOOL and integer data, refused rather than rounded or wrapped when it does not fit."""
    dtype = tensor.np_dtype
    raw = np.asarray(data)
    if raw.dtype == dtype or raw.size == 0:
        return raw.astype(dtype, copy=False)
    if dtype.kind != "b" and raw.dtype.kind in "fO":
        # numpy makes [-1, 2**64 - 1] float64 (no integer type holds both) and 2**65 an object:
        # convert the JSON values directly, then make sure nothing was rounded on the way.
        exact = np.asarray(data, dtype=dtype)
        if not np.array_equal(exact.astype(np.float64), raw.astype(np.float64)):
            raise ValueError(f"{tensor.datatype} data must be JSON integers")
        return exact
    if dtype.kind == "b" or raw.dtype.kind not in "iu":
        accepted = "true/false" if dtype.kind == "b" else "integers"
        raise ValueError(f"{tensor.datatype} data must be JSON {accepted}, got {raw.dtype.kind!r}-kind values")
    if not np.can_cast(raw.dtype, dtype):
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise ValueError(f"values must lie within {info.min}..{info.max}")
    return raw.astype(dtype)


def _bytes_from_json(tensor: TensorConfig, data: list) -> np.ndarray:
    array = np.array(data, dtype=np.object_)
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise ValueError(f"BYTES data must be JSON strings (UTF-8); element {i} is {type(item).__name__}")
        flat[i] = item.encode()
    return array


def _parse_input(config: ModelConfig, item: Any, binary: BinaryReader | None,
                 regions: RegionRegistry | None) -> tuple[str, np.ndarray, Region | None]:
    """(name, tensor, the shared-memory region the tensor views or None)."""
    if not isinstance(item, dict) or "name" not in item:
        raise BadRequest("each entry of 'inputs' must be an object with name, shape, datatype and data")
    name = item["name"]
    tensor = config.inputs_by_name.get(name) if isinstance(name, str) else None
    if tensor is None:
        raise BadRequest(f"unknown input {name!r}; model {config.name!r} takes: {_describe_inputs(config)}")
    if item.get("datatype") != tensor.datatype:
        raise BadRequest(f"input {name!r}: datatype {item.get('datatype')!r}; model {config.name!r} expects {tensor.datatype}")
    shape = _check_shape(config, tensor, item.get("shape"))
    params = item.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest(f"input {name!r}: 'parameters' must be an object")
        if PARAM_REGION in params:
            array, region = _input_from_region(tensor, shape, item, params, regions)
            return name, array, region
        if "binary_data_size" in params:
            if binary is None:
                raise BadRequest(f"input {name!r} has binary_data_size but the request has no binary part: send "
                                 "the Inference-Header-Content-Length header with the JSON header's length")
            if "data" in item:
                raise BadRequest(f"input {name!r} has both 'data' and binary_data_size; give exactly one")
            return name, tensor_from_buffer(tensor, shape, binary.take(name, params["binary_data_size"])), None
    if "data" not in item:
        raise BadRequest(f"input {name!r}: no 'data'; give the values as 'data', or as binary data with "
                         "parameters.binary_data_size (binary tensor extension), or in a registered "
                         "shared-memory region (parameters.shared_memory_region)")
    return name, _to_array(tensor, shape, item["data"]), None


def _input_from_region(tensor: TensorConfig, shape: tuple[int, ...], item: dict, params: dict,
                       regions: RegionRegistry | None) -> tuple[np.ndarray, Region]:
    """A view over the client's region (no copy; the batcher copies it once into the slot)."""
    what = f"input {tensor.name!r}"
    if "data" in item or "binary_data_size" in params:
        given = "'data'" if "data" in item else "parameters.binary_data_size"
        raise BadRequest(f"{what} has both parameters.shared_memory_region and {given}; give exactly one of "
                         "'data', binary_data_size and shared_memory_region")
    if regions is None:
        raise BadRequest(f"{what}: shared-memory regions are not accepted on this endpoint")
    buffer, region = regions.input_buffer(what, params)
    if tensor.datatype != "BYTES":
        needed = math.prod(shape) * tensor.np_dtype.itemsize
        if len(buffer) != needed:
            raise RegionError(f"{what}: shared_memory_byte_size is {len(buffer)} bytes but shape {list(shape)} of "
                              f"{tensor.datatype} needs {math.prod(shape)} x {tensor.np_dtype.itemsize} = {needed} bytes")
    return tensor_from_buffer(tensor, shape, buffer), region


def _load_json(body: bytes | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        hint, text = "", bytes(body)  # a memoryview's `in` looks for one byte value, not a substring
        if b"NaN" in text or b"Infinity" in text:
            hint = "; JSON has no NaN or Infinity: send such values as binary tensors"
        elif "depth" in str(exc):
            hint = "; objects and arrays may nest at most 1024 deep"
        raise BadRequest(f"request body is not valid JSON (UTF-8): {exc}{hint}") from None


def parse_infer_request(config: ModelConfig, body: bytes, *, capacity_bytes: int,
                        future: asyncio.Future, allow_faults: bool,
                        header_length: bytes | str | None = None,
                        regions: RegionRegistry | None = None) -> InferRequest:
    """A validated InferRequest, or BadRequest/PayloadTooLarge saying what is wrong.

    `header_length` is the Inference-Header-Content-Length header (None: the body is
    all JSON; 0: the raw form, the body is the model's single input). `regions`: the
    gateway's registered shared-memory regions (None: tensors may not name one).
    """
    binary = None
    if header_length is not None:
        body, binary = split_body(body, header_length)
        if len(body) == 0:
            return _parse_raw(config, binary, capacity_bytes=capacity_bytes, future=future)
    return parse_infer_doc(config, _load_json(body), binary, capacity_bytes=capacity_bytes, future=future,
                           allow_faults=allow_faults, regions=regions)


def parse_infer_doc(config: ModelConfig, doc: Any, binary: BinaryReader | None, *, capacity_bytes: int,
                    future: asyncio.Future, allow_faults: bool,
                    regions: RegionRegistry | None = None) -> InferRequest:
    """The request document's checks, shared by HTTP (the JSON header) and gRPC (gateway/grpc_codec.py builds the
    same document from a ModelInferRequest). `binary` hands out the tensors whose parameters give
    binary_data_size, in order; `regions` those whose parameters name a shared-memory region."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("request body must be a JSON object with an 'inputs' list (KServe v2 inference request)")
    inputs: dict[str, np.ndarray] = {}
    held: list[Region] | None = None  # (a list only for a request that names a region)
    for item in doc["inputs"]:
        name, array, region = _parse_input(config, item, binary, regions)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = array
        if region is not None:
            held = [region] if held is None else [*held, region]
    if binary is not None:
        binary.finish()
    _generate_mask(config, inputs)
    missing = [t.name for t in config.inputs if t.name not in inputs]
    if missing:
        raise BadRequest(f"missing input(s) {', '.join(missing)}; model {config.name!r} takes: {_describe_inputs(config)}")
    rows = _check_rows(config, inputs)
    serialized = _serialize_bytes_inputs(config, inputs) if config.bytes_inputs else None
    _check_size(config, inputs, rows, capacity_bytes, serialized)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    priority, timeout_us = _schedule_parameters(config, params)
    requested, binary_outputs, output_regions = _requested_outputs(config, doc, params, regions)
    if output_regions is not None:
        _check_output_room(config, rows, output_regions)
        held = [*(held or ()), *(target.region for target in output_regions.values())]
    return InferRequest(
        priority=priority, timeout_us=timeout_us,
        model=config, inputs=inputs, rows=rows,
        shape_key=tuple(a.shape[1:] for a in inputs.values()) if config.max_batch_size > 0
        else tuple(a.shape for a in inputs.values()),
        request_id=_request_id(doc), requested_outputs=requested, binary_outputs=binary_outputs,
        fault=params.get("ringserve_fault") if allow_faults else None, future=future, serialized=serialized,
        shm_regions=held, output_regions=output_regions, parameters=params or None,
    )


def _parse_raw(config: ModelConfig, binary: BinaryReader, *, capacity_bytes: int,
               future: asyncio.Future) -> InferRequest:
    """Raw binary request (header length 0): the body is the single input; outputs come back binary."""
    if len(config.inputs) != 1:
        raise BadRequest(f"a raw request (Inference-Header-Content-Length: 0) is for models with one input; "
                         f"model {config.name!r} takes: {_describe_inputs(config)}")
    (tensor,) = config.inputs
    batched = config.max_batch_size > 0
    shape = raw_input_shape(tensor, batched, len(binary.data))
    inputs = {tensor.name: tensor_from_buffer(tensor, shape, binary.take(tensor.name, len(binary.data)))}
    rows = _check_rows(config, inputs)
    _check_size(config, inputs, rows, capacity_bytes)
    return InferRequest(model=config, inputs=inputs, rows=rows, shape_key=(shape[1:] if batched else shape,),
                        request_id=None, requested_outputs=None, fault=None, future=future,
                        binary_outputs=frozenset(t.name for t in config.outputs))


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
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(rows)}; all inputs must have the same first dim")
    (n,) = rows
    if n > config.max_batch_size:
        raise BadRequest(f"batch dimension {n} exceeds model {config.name!r} max_batch_size {config.max_batch_size}")
    return n


def _check_size(config: ModelConfig, inputs: dict[str, np.ndarray], rows: int, capacity_bytes: int,
                serialized: dict[str, bytes] | None = None) -> None:
    """413 when this request alone cannot fit a slot (inputs + fixed-size outputs, aligned).

    The batcher's max_rows and _fits use the same rule, so an accepted request always fits a batch.
    """
    needed = alignment_slack_bytes(config) + rows * config.fixed_output_row_bytes
    for array in inputs.values():
        needed += array.nbytes
    if config.batch_inputs:
        needed += batch_inputs_nbytes(config, [inputs])
    if serialized is not None:
        needed += serialized_extra_bytes(inputs, serialized)
    if needed > capacity_bytes:
        raise PayloadTooLarge(needed, capacity_bytes)


def _serialize_bytes_inputs(config: ModelConfig, inputs: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {name: serialize_bytes_tensor(inputs[name]) for name in config.bytes_inputs}


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


def _requested_outputs(config: ModelConfig, doc: dict, params: dict, regions: RegionRegistry | None = None
                       ) -> tuple[list[str] | None, frozenset, dict[str, OutputRegion] | None]:
    """(requested output names in the order asked, or None for all; names to answer as binary;
    outputs to write into shared-memory regions, or None)."""
    binary_default = params.get("binary_data_output", False)
    if type(binary_default) is not bool:
        raise BadRequest(f"parameters.binary_data_output must be true or false, got {binary_default!r}")
    outs = doc.get("outputs")
    if outs is None:
        return None, frozenset(t.name for t in config.outputs) if binary_default else frozenset(), None
    if not isinstance(outs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outs):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    known = config.outputs_by_name
    names = [o["name"] for o in outs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadRequest(f"unknown output(s) {', '.join(unknown)}; model {config.name!r} has: {', '.join(sorted(known))}")
    if len(set(names)) != len(names):
        raise BadRequest(f"'outputs' names an output twice: {names}; name each at most once")
    binary = set()
    targets = None
    for out in outs:
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise BadRequest(f"output {out['name']!r}: 'parameters' must be an object")
        if out_params.get("classification"):
            raise BadRequest(f"output {out['name']!r}: the classification extension is not supported; "
                             "ask for the raw output")
        if PARAM_REGION in out_params:
            if targets is None:
                targets = {}
            targets[out["name"]] = _output_region(out["name"], out_params, regions)
            continue
        wants_binary = out_params.get("binary_data", binary_default)
        if type(wants_binary) is not bool:
            raise BadRequest(f"output {out['name']!r}: parameters.binary_data must be true or false, got {wants_binary!r}")
        if wants_binary:
            binary.add(out["name"])
    return names, frozenset(binary), targets


def _check_output_room(config: ModelConfig, rows: int, targets: dict[str, OutputRegion]) -> None:
    """400 before running the model when a fixed-size output cannot fit the region room it was given
    (an output with a variable dim is checked once its size is known: shm_regions.write_outputs)."""
    for name, target in targets.items():
        tensor = config.outputs_by_name[name]
        if tensor.datatype == "BYTES" or any(d < 0 for d in tensor.dims):
            continue
        shape = ([rows] if config.max_batch_size > 0 else []) + list(tensor.dims)
        needed = math.prod(shape) * tensor.np_dtype.itemsize
        if needed > target.byte_size:
            raise RegionError(f"output {name!r} will be {needed} bytes (shape {shape} {tensor.datatype}); "
                              f"shared_memory_byte_size gives it {target.byte_size} bytes in region "
                              f"{target.region.name!r}: give at least {needed}")


def _output_region(name: str, params: dict, regions: RegionRegistry | None) -> OutputRegion:
    what = f"output {name!r}"
    if params.get("binary_data") is True:
        raise BadRequest(f"{what}: Output can't set both 'shared_memory_region' and 'binary_data'")
    if regions is None:
        raise BadRequest(f"{what}: shared-memory regions are not accepted on this endpoint")
    return regions.output_region(what, params)
