"""KServe v2 inference requests in: request body (+ Inference-Header-Content-Length) -> InferRequest.

Runs on the gateway's hot path: one orjson parse, one numpy conversion per JSON input
(binary inputs are views over the body), no Python loop over tensor elements except for
BYTES. Every check that can refuse a request happens here, before it can reach a worker.
gRPC's ModelInferRequest comes through the same checks (grpc_codec.py builds the document
that parse_infer_doc takes). The answer goes out through gateway/kserve/encode.py.

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
import json
import math
from typing import Any

import numpy as np
import orjson

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.wire import BYTES_LENGTH, serialize_bytes_tensor

from ringserve.gateway.kserve.binary import (
    BinaryReader,
    bytes_input,
    little_endian,
    raw_input_shape,
    split_body,
    tensor_from_buffer,
)
from ringserve.gateway.kserve.bounds import check_bounds, check_tensor_bytes
from ringserve.gateway.kserve.classification import PARAM as CLASSIFICATION, class_count
from ringserve.gateway.core.errors import BadRequest, PayloadTooLarge, TooManyValues, echo
from ringserve.gateway.core.phrases import dims_list, names_list, say
from ringserve.gateway.batching.ragged import batch_inputs_nbytes
from ringserve.gateway.core.request import InferRequest, alignment_slack_bytes, serialized_extra_bytes
from ringserve.gateway.core.regions import PARAM_REGION, OutputRegion, Region, RegionError, RegionInput, RegionRegistry


def _describe_inputs(config: ModelConfig) -> str:
    return ", ".join(f"{t.name} ({t.datatype} {_dims_text(config, t)})" for t in config.inputs)


def _dims_text(config: ModelConfig, tensor: TensorConfig) -> str:
    return dims_list(([-1] if config.max_batch_size > 0 else []) + list(tensor.dims))


def _check_shape(config: ModelConfig, tensor: TensorConfig, shape: Any) -> tuple[int, ...]:
    if type(shape) is not list:
        raise BadRequest(
            say(
                "json_field",
                f"input {tensor.name!r}: shape must be a list of non-negative integers, got {echo(shape)}",
                field="shape",
            )
        )
    dims = tensor.dims
    batched = config.max_batch_size > 0
    if batched and not shape:
        raise BadRequest(
            say(
                "input_no_batch_dim",
                f"input {tensor.name!r}: shape [] does not match {_dims_text(config, tensor)} (-1 = any size)",
                input=tensor.name,
                model=config.name,
            )
        )
    if len(shape) != len(dims) + batched:
        raise _shape_mismatch(config, tensor, shape)
    for i, d in enumerate(shape):
        if type(d) is not int or d < 0:
            raise BadRequest(
                say(
                    "json_shape",
                    f"input {tensor.name!r}: shape must be a list of non-negative integers, got {echo(shape)}",
                )
            )
        expected = -1 if batched and i == 0 else dims[i - batched]
        if expected != -1 and expected != d:
            raise _shape_mismatch(config, tensor, shape)
    if config.max_dims:
        check_bounds(config, tensor, shape)
    return tuple(shape)


def _check_room(config: ModelConfig, tensor: TensorConfig, shape: tuple[int, ...], capacity_bytes: int) -> None:
    """What the shape alone refuses, before a value is read or converted: a batch over max_batch_size,
    and more elements than a slot holds (each takes its itemsize there, a BYTES element at least its
    4-byte length). A 4 KiB gzip body of a million empty strings took the loop seconds before its 400."""
    if config.max_batch_size > 0 and shape[0] > config.max_batch_size:
        raise BadRequest(
            say(
                "batch_size",
                f"batch dimension {shape[0]} exceeds model {config.name!r} max_batch_size {config.max_batch_size}",
                max=config.max_batch_size,
                model=config.name,
            )
        )
    least = math.prod(shape) * (BYTES_LENGTH.size if tensor.datatype == "BYTES" else tensor.np_dtype.itemsize)
    if least > capacity_bytes:
        raise PayloadTooLarge(
            least,
            capacity_bytes,
            f"input {tensor.name!r} (shape {list(shape)} {tensor.datatype})",
            at_least=tensor.datatype == "BYTES",
        )


def _shape_mismatch(config: ModelConfig, tensor: TensorConfig, shape: list) -> BadRequest:
    expected = _dims_text(config, tensor)
    return BadRequest(
        say(
            "input_shape",
            f"input {tensor.name!r}: shape {echo(shape)} does not match {expected} (-1 = any size)",
            input=tensor.name,
            model=config.name,
            expected=expected,
            got=echo(dims_list(shape), quoted=False),
        )
    )


def _to_array(tensor: TensorConfig, shape: tuple[int, ...], data: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise BadRequest(
            say("json_field", f"input {tensor.name!r}: 'data' must be a list (flat or nested, row-major)", field="data")
        )
    count = math.prod(shape)
    rows = shape[0] if shape else count
    if len(data) != count and len(data) != rows:  # (flat, or nested rows) before a value is converted
        raise BadRequest(
            f"input {tensor.name!r}: shape {list(shape)} needs {count} values, data has {len(data)}"
            + ("" if len(shape) <= 1 else f" entries (give the values flat, or as {rows} rows)")
        )
    dtype = tensor.np_dtype
    try:
        if dtype.kind == "f":
            if dtype.itemsize == 8:  # orjson refuses doubles past the FP64 range: nothing can overflow
                array = _float_array(data, dtype)
            else:
                with np.errstate(over="raise"):  # 1e39 as FP32 is an error, not inf
                    array = _float_array(data, dtype)
        elif dtype.kind == "O":
            array = _bytes_from_json(tensor, data, count)
        else:
            array = _exact_array(tensor, data)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise BadRequest(
            say(
                "json_field",
                f"input {tensor.name!r}: data is not a {tensor.datatype} tensor ({echo(str(exc), quoted=False)})",
                field="data",
            )
        ) from None
    count = math.prod(shape)
    if array.size != count:
        raise BadRequest(
            say(
                "json_data_count",
                f"input {tensor.name!r}: shape {list(shape)} needs {count} values, data has {array.size}",
            )
        )
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


def _bytes_from_json(tensor: TensorConfig, data: list, count: int) -> np.ndarray:
    array = np.array(data, dtype=np.object_)
    if array.size != count:  # before the loop below: each element costs it a Python step
        return array
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise ValueError(f"BYTES data must be JSON strings (UTF-8); element {i} is {type(item).__name__}")
        flat[i] = item.encode()
    return array


def _parse_input(
    config: ModelConfig,
    item: Any,
    binary: BinaryReader | None,
    regions: RegionRegistry | None,
    capacity_bytes: int,
    forms: dict[str, bytes] | None,
    max_tensor_bytes: int = 0,
) -> tuple[str, np.ndarray, Region | None]:
    """(name, tensor, the shared-memory region the tensor views or None). A BYTES input given as binary
    data leaves that data in `forms`: it is the slot's form already (re-making it cost a Python step an
    element, half of what a request of a million strings took)."""
    if not isinstance(item, dict) or "name" not in item:
        raise BadRequest(
            say(
                "json_field",
                "each entry of 'inputs' must be an object with name, shape, datatype and data",
                field="name" if isinstance(item, dict) else "inputs",
            )
        )
    name = item["name"]
    tensor = config.inputs_by_name.get(name) if isinstance(name, str) else None
    if tensor is None:
        raise BadRequest(
            say(
                "unexpected_input",
                f"unknown input {echo(name)}; model {config.name!r} takes: {_describe_inputs(config)}",
                input=echo(name, quoted=False),
                model=config.name,
            )
        )
    if item.get("datatype") != tensor.datatype:
        raise BadRequest(
            say(
                "input_datatype",
                f"input {name!r}: datatype {echo(item.get('datatype'))}; model "
                f"{config.name!r} expects {tensor.datatype}",
                input=name,
                got=echo(item.get("datatype"), quoted=False),
                model=config.name,
                expected=tensor.datatype,
            )
        )
    shape = _check_shape(config, tensor, item.get("shape"))
    if max_tensor_bytes and tensor.datatype != "BYTES":  # (BYTES: once serialized, in parse_infer_doc)
        check_tensor_bytes(tensor, shape, math.prod(shape) * tensor.np_dtype.itemsize, max_tensor_bytes)
    _check_room(config, tensor, shape, capacity_bytes)
    params = item.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest(say("json_field", f"input {name!r}: 'parameters' must be an object", field="parameters"))
        if PARAM_REGION in params:
            array, region = _input_from_region(config, tensor, shape, item, params, regions)
            return name, array, region
        if "binary_data_size" in params:
            if binary is None:
                raise BadRequest(
                    say(
                        "binary_without_header",
                        f"input {name!r} has binary_data_size but the "
                        "request has no binary part: send the "
                        "Inference-Header-Content-Length header with the JSON "
                        "header's length",
                    )
                )
            if "data" in item:
                raise BadRequest(
                    say(
                        "input_content",
                        f"input {name!r} has both 'data' and binary_data_size; give exactly one",
                        given="set 'data' 'binary_data_size'",
                    )
                )
            buffer = binary.take(name, params["binary_data_size"])
            array = tensor_from_buffer(tensor, shape, buffer, config.name)
            if forms is not None and tensor.datatype == "BYTES":
                forms[name] = bytes(buffer)
            return name, array, None
    if "data" not in item:
        raise BadRequest(
            say(
                "input_content",
                f"input {name!r}: no 'data'; give the values as 'data', or as binary "
                "data with parameters.binary_data_size (binary tensor extension), or "
                "in a registered shared-memory region "
                "(parameters.shared_memory_region)",
                given="no field is set",
            )
        )
    return name, _to_array(tensor, shape, item["data"]), None


def _input_from_region(
    config: ModelConfig,
    tensor: TensorConfig,
    shape: tuple[int, ...],
    item: dict,
    params: dict,
    regions: RegionRegistry | None,
) -> tuple[np.ndarray | RegionInput, Region]:
    """Where the input lies in the client's region: the batcher reads it from there straight into the
    slot (preadv). BYTES, and an input whose values group the batch, are read now (a private copy)."""
    what = f"input {tensor.name!r}"
    if "data" in item or "binary_data_size" in params:
        given = "'data'" if "data" in item else "parameters.binary_data_size"
        set_fields = (
            "set 'data' 'shared_memory_region'" if "data" in item else "set 'binary_data_size' 'shared_memory_region'"
        )
        raise BadRequest(
            say(
                "input_content",
                f"{what} has both parameters.shared_memory_region and {given}; give "
                "exactly one of 'data', binary_data_size and shared_memory_region",
                given=set_fields,
            )
        )
    if regions is None:
        raise BadRequest(f"{what}: shared-memory regions are not accepted on this endpoint")
    source, region = regions.input_tensor(
        what, params, tensor.datatype, little_endian(tensor.np_dtype), shape, input_name=tensor.name, model=config.name
    )
    if tensor.datatype == "BYTES":
        return bytes_input(tensor.name, memoryview(source.read()), shape), region
    batching = config.dynamic_batching
    if batching is not None and tensor.name in batching.separate_by_inputs:
        return source.read(), region  # (its value is part of the batching key: gateway/batching/padding.py)
    return source, region


# What a request document holds besides tensor values: its objects' members, shapes, names, ids and
# parameters. Generous: a JSON text past the values a slot can hold by more than this is refused unparsed.
JSON_STRUCTURE_COMMAS = 4096
_WIDEST_ITEM_BYTES = 8


class JsonBudget:
    """The commas of a request's JSON text, counted before orjson makes an object of every value.

    Every value of a tensor's data but the last is followed by a comma (nested rows too: E values
    in non-empty lists have E - 1), and each takes at least `least` bytes in a slot (its itemsize;
    for a BYTES input 1, as a comma inside a string takes its byte there), so a text with more than
    capacity / least + JSON_STRUCTURE_COMMAS commas cannot fit whatever it holds. Counting runs at
    memory speed (1.3 GB/s here, where orjson and numpy take 25 ns a byte and more): a 64 MiB JSON of
    zeros (64 KiB of gzip) held the loop 2.5 s before its 400. A compressed body is counted as it
    inflates (gateway/http/routes.py), so such a bomb stops a few MiB in.
    """

    def __init__(self, config: ModelConfig, capacity_bytes: int, json_bytes: int | None = None) -> None:
        least = min((1 if t.datatype == "BYTES" else t.np_dtype.itemsize for t in config.inputs), default=1)
        self.limit = capacity_bytes // least + JSON_STRUCTURE_COMMAS
        self.capacity_bytes = capacity_bytes
        self.left = json_bytes  # how much of what is still to come is JSON (None: all of it)
        self.commas = 0

    def count(self, chunk: bytes | memoryview) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            chunk = chunk[: self.left]
            self.left -= len(chunk)
        self.commas += (chunk if type(chunk) is bytes else bytes(chunk)).count(b",")
        if self.commas > self.limit:
            raise TooManyValues("the request's JSON", self.commas, self.limit, self.capacity_bytes)


def _load_json(body: bytes | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = bytes(body)  # a memoryview's `in` looks for one byte value, not a substring
        if b"NaN" in text or b"Infinity" in text:
            doc = _load_json_with_non_finite(text)
            if doc is not _NOT_JSON:
                return doc
        hint, condition = "", "json"
        if "depth" in str(exc):
            hint, condition = "; objects and arrays may nest at most 1024 deep", "json_depth"
        raise BadRequest(
            say(condition, f"request body is not valid JSON (UTF-8): {exc}{hint}", error=exc, limit=1024)
        ) from None


_NOT_JSON = object()


def _load_json_with_non_finite(text: bytes) -> Any:
    """A body orjson refused that holds NaN, Infinity or -Infinity: literals RFC 8259 lacks, which Triton's
    rapidjson reads (kParseNanAndInfFlag) and its writers put for non-finite floats (rapidjson's
    kWriteNanAndInfFlag, the Python client's python-rapidjson, perf_analyzer).

    orjson has no option for them; falling back only after orjson failed keeps every other request on
    its fast parse. orjson first checks a copy with the literals replaced by 0 (inside strings too,
    where that leaves a string a string), so that the body holds to orjson's rules otherwise (UTF-8,
    no lone surrogates, 64-bit integers, 1024 levels; _NOT_JSON when it does not, and the caller
    reports orjson's first error); then the standard library's json, which reads the literals as
    float('nan'), float('inf'), float('-inf') and refuses any other spelling, gives the values.
    Measured for 512 FP32 values: 15 to 20x orjson's parse alone (json's float() per value); only
    requests that hold such a literal pay it.
    """
    try:
        orjson.loads(text.replace(b"NaN", b"0").replace(b"Infinity", b"0"))
    except orjson.JSONDecodeError:
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # what orjson passed and json does not: -NaN, say
        raise BadRequest(
            f"request body is not valid JSON (UTF-8): {exc}; of the non-finite numbers it takes "
            "NaN, Infinity and -Infinity"
        ) from None


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
    if not json_counted and len(body) > capacity_bytes // _WIDEST_ITEM_BYTES + JSON_STRUCTURE_COMMAS:
        JsonBudget(config, capacity_bytes).count(body)  # (a shorter text cannot have more commas than the limit)
    return parse_infer_doc(
        config,
        _load_json(body),
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
        name, array, region = _parse_input(config, item, binary, regions, capacity_bytes, forms, max_tensor_bytes)
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
    requested, binary_outputs, output_regions, classes = _requested_outputs(config, doc, params, regions)
    if output_regions is not None:
        _check_output_room(config, rows, output_regions)
        held = [*(held or ()), *(target.region for target in output_regions.values())]
    return InferRequest(
        priority=priority,
        timeout_us=timeout_us,
        model=config,
        inputs=inputs,
        rows=rows,
        shape_key=_shape_key(config, inputs),
        request_id=_request_id(doc),
        requested_outputs=requested,
        binary_outputs=binary_outputs,
        fault=params.get("ringserve_fault") if allow_faults else None,
        future=future,
        serialized=serialized,
        shm_regions=held,
        output_regions=output_regions,
        classes=classes,
        parameters=params or None,
    )


def _check_required(config: ModelConfig, inputs: dict[str, np.ndarray]) -> None:
    """Every input but the optional ones (Triton's count check, in its words)."""
    missing = [name for name in config.required_inputs if name not in inputs]
    if not missing:
        return
    detail = f"missing input(s) {', '.join(missing)}; model {config.name!r} takes: {_describe_inputs(config)}"
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
                f"{_describe_inputs(config)}",
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
        request_id=None,
        requested_outputs=None,
        fault=None,
        future=future,
        serialized=serialized,
        binary_outputs=frozenset(t.name for t in config.outputs),
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
    needed = alignment_slack_bytes(config) + rows * config.fixed_output_row_bytes
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


def _request_id(doc: dict) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest(say("json_field", "'id' must be a string", field="id"))
    return rid


def _requested_outputs(
    config: ModelConfig, doc: dict, params: dict, regions: RegionRegistry | None = None
) -> tuple[list[str] | None, frozenset, dict[str, OutputRegion] | None, dict[str, int] | None]:
    """(requested output names in the order asked, or None for all; names to answer as binary;
    outputs to write into shared-memory regions, or None; outputs answered as their top K classes
    (gateway/kserve/classification.py), or None)."""
    binary_default = params.get("binary_data_output", False)
    if type(binary_default) is not bool:
        raise BadRequest(
            say(
                "json_field",
                f"parameters.binary_data_output must be true or false, got {echo(binary_default)}",
                field="binary_data_output",
            )
        )
    outs = doc.get("outputs")
    if outs is None:
        return None, frozenset(t.name for t in config.outputs) if binary_default else frozenset(), None, None
    if not isinstance(outs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outs):
        raise BadRequest(say("json_field", "'outputs' must be a list of objects with a 'name'", field="outputs"))
    known = config.outputs_by_name
    names = [o["name"] for o in outs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadRequest(
            say(
                "unexpected_output",
                f"unknown output(s) {echo(', '.join(unknown), quoted=False)}; model {config.name!r} "
                f"has: {', '.join(sorted(known))}",
                output=echo(unknown[0], quoted=False),
                model=config.name,
            )
        )
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise BadRequest(
            say(
                "output_twice",
                f"'outputs' names an output twice: {echo(names)}; name each at most once",
                output=echo(twice, quoted=False),
            )
        )
    binary = set()
    targets = classes = None
    for out in outs:
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise BadRequest(
                say("json_field", f"output {out['name']!r}: 'parameters' must be an object", field="parameters")
            )
        if PARAM_REGION in out_params:
            if targets is None:
                targets = {}
            targets[out["name"]] = _output_region(out["name"], out_params, regions)
            continue
        count = (
            class_count(config, known[out["name"]], out_params[CLASSIFICATION]) if CLASSIFICATION in out_params else 0
        )
        if count:
            classes = {**(classes or {}), out["name"]: count}
        wants_binary = out_params.get("binary_data", binary_default)
        if type(wants_binary) is not bool:
            raise BadRequest(
                say(
                    "json_field",
                    f"output {out['name']!r}: parameters.binary_data must be true or false, got {echo(wants_binary)}",
                    field="binary_data",
                )
            )
        if wants_binary:
            binary.add(out["name"])
    return names, frozenset(binary), targets, classes


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
            raise RegionError(
                say(
                    "shm_output_size",
                    f"output {name!r} will be {needed} bytes (shape {shape} "
                    f"{tensor.datatype}); shared_memory_byte_size gives it "
                    f"{target.byte_size} bytes in region {target.region.name!r}: "
                    f"give at least {needed}",
                    output=name,
                    given=target.byte_size,
                    needed=needed,
                )
            )


def _output_region(name: str, params: dict, regions: RegionRegistry | None) -> OutputRegion:
    what = f"output {name!r}"
    if CLASSIFICATION in params:
        raise BadRequest(
            say(
                "classification_shm",
                f"{what}: its classes are answered in the response, never "
                "written into a region; ask for one of the two",
            )
        )
    if params.get("binary_data") is True:
        raise BadRequest(say("binary_and_shm", f"{what}: a region holds the output's bytes; ask for one of the two"))
    if regions is None:
        raise BadRequest(f"{what}: shared-memory regions are not accepted on this endpoint")
    return regions.output_region(what, params)
