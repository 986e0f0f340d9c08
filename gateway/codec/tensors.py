"""A KServe request's input tensors: shape checks, room in the slot, JSON data -> numpy, BYTES,
inputs read from a client's shared-memory region. parse.py calls these for each input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.wire import BYTES_LENGTH
from ringserve.gateway.codec.binary import (
    BinaryReader,
    bytes_input,
    little_endian,
    tensor_from_buffer,
)
from ringserve.gateway.codec.bounds import check_bounds, check_tensor_bytes
from ringserve.gateway.core.errors import BadRequest, PayloadTooLarge, echo
from ringserve.gateway.core.phrases import dims_list, say
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.regions import PARAM_REGION, Region, RegionInput

INT64_MAX = 2**63 - 1
MAX_DATA_NESTING = 100  # Triton's HTTP_MAX_JSON_NESTING_DEPTH for an input's 'data'


def describe_inputs(config: ModelConfig) -> str:
    return ", ".join(f"{t.name} ({t.datatype} {dims_text(config, t)})" for t in config.inputs)


def dims_text(config: ModelConfig, tensor: TensorConfig) -> str:
    return dims_list(([-1] if config.max_batch_size > 0 else []) + list(tensor.dims))


def check_shape(config: ModelConfig, tensor: TensorConfig, shape: Any) -> tuple[int, ...]:
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
                f"input {tensor.name!r}: shape [] does not match {dims_text(config, tensor)} (-1 = any size)",
                input=tensor.name,
                model=config.name,
            )
        )
    for d in shape:
        if type(d) is not int or d < 0:
            raise BadRequest(
                say(
                    "json_shape",
                    f"input {tensor.name!r}: shape must be a list of non-negative integers, got {echo(shape)}",
                )
            )
    check_element_count(tensor, shape)
    if len(shape) != len(dims) + batched:
        raise shape_mismatch(config, tensor, shape)
    for i, d in enumerate(shape):
        expected = -1 if batched and i == 0 else dims[i - batched]
        if expected != -1 and expected != d:
            raise shape_mismatch(config, tensor, shape)
    if config.max_dims:
        check_bounds(config, tensor, shape)
    return tuple(shape)


def check_element_count(tensor: TensorConfig, shape: list[int]) -> None:
    """Triton's overflow checks of a shape (server http_server.cc, before the model's dims are compared):
    more elements than an int64 counts, or more bytes (count x itemsize; not for BYTES)."""
    count = math.prod(shape)
    if count <= INT64_MAX // 8:  # (every shape a slot could hold: one comparison)
        return
    if count > INT64_MAX:
        raise BadRequest(
            say(
                "shape_overflow",
                f"input {tensor.name!r}: the shape's product is {count}",
                input=tensor.name,
                shape=dims_list(shape),
                max=INT64_MAX,
            )
        )
    itemsize = tensor.np_dtype.itemsize
    if tensor.datatype != "BYTES" and itemsize > 1 and count > INT64_MAX // itemsize:
        raise BadRequest(
            say("byte_size_overflow", "", input=tensor.name, count=count, itemsize=itemsize, max=INT64_MAX)
        )


def check_room(config: ModelConfig, tensor: TensorConfig, shape: tuple[int, ...], capacity_bytes: int) -> None:
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


def shape_mismatch(config: ModelConfig, tensor: TensorConfig, shape: list) -> BadRequest:
    expected = dims_text(config, tensor)
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


def to_array(tensor: TensorConfig, shape: tuple[int, ...], data: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise BadRequest(
            say("json_field", f"input {tensor.name!r}: 'data' must be a list (flat or nested, row-major)", field="data")
        )
    if data and type(data[0]) is list:
        check_nesting(tensor, data)
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
                array = float_array(data, dtype)
            else:
                with np.errstate(over="raise"):  # 1e39 as FP32 is an error, not inf
                    array = float_array(data, dtype)
        elif dtype.kind == "O":
            array = bytes_from_json(tensor, data, count)
        else:
            array = exact_array(tensor, data)
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


def check_nesting(tensor: TensorConfig, data: list) -> None:
    """Triton's limit on nested 'data' (server http_server.cc: HTTP_MAX_JSON_NESTING_DEPTH): a value inside
    100 lists or more is refused. Rows nest alike, so the first row's first value tells the depth."""
    lists, item = 0, data
    while type(item) is list and item:
        lists, item = lists + 1, item[0]
    if lists >= MAX_DATA_NESTING:
        raise BadRequest(
            say(
                "json_depth",
                f"input {tensor.name!r}: 'data' nests {lists} lists deep (a tensor's rank is at most 64)",
                limit=MAX_DATA_NESTING,
            )
        )


def float_array(data: list, dtype: np.dtype) -> np.ndarray:
    """A flat list (the usual form) through np.fromiter: 5.5 vs 19.5 µs for 512 FP32 values, as np.asarray
    looks into every element for a nested sequence. The same values (float(), the same cast) and overflow
    error; what fromiter cannot take (nested lists, a dict, a word) gets np.asarray's shape or error."""
    try:
        return np.fromiter(data, dtype=dtype, count=len(data))
    except (ValueError, TypeError):
        return np.asarray(data, dtype=dtype)


def exact_array(tensor: TensorConfig, data: list) -> np.ndarray:
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


def bytes_from_json(tensor: TensorConfig, data: list, count: int) -> np.ndarray:
    array = np.array(data, dtype=np.object_)
    if array.size != count:  # before the loop below: each element costs it a Python step
        return array
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise ValueError(f"BYTES data must be JSON strings (UTF-8); element {i} is {type(item).__name__}")
        flat[i] = item.encode()
    return array


def parse_input(
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
                f"unknown input {echo(name)}; model {config.name!r} takes: {describe_inputs(config)}",
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
    shape = check_shape(config, tensor, item.get("shape"))
    if max_tensor_bytes and tensor.datatype != "BYTES":  # (BYTES: once serialized, in parse_infer_doc)
        check_tensor_bytes(tensor, shape, math.prod(shape) * tensor.np_dtype.itemsize, max_tensor_bytes)
    check_room(config, tensor, shape, capacity_bytes)
    params = item.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest(say("json_field", f"input {name!r}: 'parameters' must be an object", field="parameters"))
        if PARAM_REGION in params:
            array, region = input_from_region(config, tensor, shape, item, params, regions)
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
    return name, to_array(tensor, shape, item["data"]), None


def input_from_region(
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
        return bytes_input(tensor.name, memoryview(source.read()), shape, config.name), region
    batching = config.dynamic_batching
    if batching is not None and tensor.name in batching.separate_by_inputs:
        return source.read(), region  # (its value is part of the batching key: gateway/batching/padding.py)
    return source, region
