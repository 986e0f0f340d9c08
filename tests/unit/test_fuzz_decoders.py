"""Property-based fuzzing of the request decoders: any input is a request or a 4xx, never a crash.

Bounded and derandomized (a fixed example sequence per test), so the suite stays fast and
reproducible: a failure here is a bug, not bad luck. Each property would fail if a decoder
raised anything but a GatewayError with a 4xx status, or accepted a tensor whose dtype or
shape disagrees with the model.
"""
from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringserve.common.repository.datatypes import KSERVE_DATATYPES
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.wire import deserialize_bytes_tensor, serialize_bytes_tensor
from ringserve.gateway.codec.binary import decode_content, tensor_from_buffer
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.errors import GatewayError, status_of

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
CAPACITY_BYTES = 1 << 20

MODELS = [
    ModelConfig(name="mixed", max_batch_size=4,
                inputs=(TensorConfig("a", "FP32", (3,)), TensorConfig("b", "INT64", (-1,)),
                        TensorConfig("c", "BOOL", (2,))),
                outputs=(TensorConfig("y", "FP32", (3,)), TensorConfig("z", "UINT8", (2,))),
                dynamic_batching=DynamicBatching(), version=1, model_path="/m/mixed/1/model.onnx"),
    ModelConfig(name="single", max_batch_size=0, inputs=(TensorConfig("x", "FP16", (2, -1)),),
                outputs=(TensorConfig("y", "FP64", (2,)),), dynamic_batching=None, version=2,
                model_path="/m/single/2/model.onnx"),
    ModelConfig(name="strings", max_batch_size=2, inputs=(TensorConfig("s", "BYTES", (2,)),),
                outputs=(TensorConfig("t", "BYTES", (2,)),), dynamic_batching=DynamicBatching(), version=1,
                model_path="/m/strings/1/model.onnx"),
]


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=24)
shapes = st.one_of(st.lists(st.integers(-2, 5), max_size=4), st.just([1, 10**20]), values)


@st.composite
def tensor_entries(draw, model: ModelConfig):
    names = [t.name for t in model.inputs] + ["nope"]
    entry = {"name": draw(st.sampled_from(names) | st.integers()),
             "datatype": draw(st.sampled_from(sorted(KSERVE_DATATYPES)) | st.just("FP31")),
             "shape": draw(shapes)}
    kind = draw(st.sampled_from(["data", "binary", "both", "neither"]))
    if kind in ("data", "both"):
        entry["data"] = draw(values)
    if kind in ("binary", "both"):
        entry["parameters"] = {"binary_data_size": draw(st.integers(-1, 64) | scalars)}
    return entry


@st.composite
def requests(draw):
    model = draw(st.sampled_from(MODELS))
    doc = {"inputs": draw(st.lists(tensor_entries(model), max_size=4))}
    if draw(st.booleans()):
        outs = [t.name for t in model.outputs] + ["ghost"]
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(outs)},
            optional={"parameters": st.fixed_dictionaries({}, optional={"binary_data": scalars})})))
    if draw(st.booleans()):
        doc["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_output", "priority", "timeout", "other"]), scalars, max_size=3))
    if draw(st.booleans()):
        doc["id"] = draw(scalars)
    header = json.dumps(doc).encode()  # not orjson: ints past 64 bits must reach the parser too
    tail = draw(st.binary(max_size=96))
    framing = draw(st.sampled_from(["json", "binary", "wrong-length", "raw"]))
    header_length = {"json": None, "binary": str(len(header)), "raw": "0",
                     "wrong-length": str(draw(st.integers(-5, len(header) + 200)))}[framing]
    body = header + tail if framing != "json" else header
    return model, body, header_length


def valid_values(tensor: TensorConfig, count: int, draw) -> tuple[list, bytes]:
    """(JSON data, binary bytes) of `count` valid elements."""
    if tensor.datatype == "BYTES":
        items = draw(st.lists(st.text(max_size=3), min_size=count, max_size=count))
        return items, serialize_bytes_tensor(np.array([i.encode() for i in items] + [b""], dtype=np.object_)[:count])
    if tensor.datatype == "BOOL":
        items = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    elif tensor.np_dtype.kind == "f":
        items = draw(st.lists(st.floats(-1e4, 1e4, width=16), min_size=count, max_size=count))
    else:
        info = np.iinfo(tensor.np_dtype)
        items = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=count, max_size=count))
    return items, np.array(items, dtype=tensor.np_dtype).tobytes()


MUTATIONS = ["drop-input", "duplicate-input", "bad-dim", "zero-dim", "wrong-datatype", "binary-size-off",
             "truncate-body", "extend-body", "too-many-rows", "data-not-list", "bad-output", "bad-header-length"]


@st.composite
def near_valid_requests(draw):
    """A valid request for one of MODELS, often with one or two things broken."""
    model = draw(st.sampled_from(MODELS))
    batched = model.max_batch_size > 0
    rows = draw(st.integers(0, model.max_batch_size)) if batched else 1  # (zero-sized tensors are served)
    variable = draw(st.integers(0, 3))
    entries, chunks = [], []
    for tensor in model.inputs:
        shape = ([rows] if batched else []) + [variable if d == -1 else d for d in tensor.dims]
        data, raw = valid_values(tensor, math.prod(shape), draw)
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": shape}
        if draw(st.booleans()):
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = data
        entries.append(entry)
    doc = {"inputs": entries, "id": "fuzz"}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": t.name, "parameters": {"binary_data": draw(st.booleans())}} for t in model.outputs]
    mutations = draw(st.lists(st.sampled_from(MUTATIONS), max_size=2))
    entry = draw(st.sampled_from(entries))
    tail = b"".join(chunks)
    for mutation in mutations:
        if mutation == "drop-input":
            entries.remove(entry) if entry in entries else None
        elif mutation == "duplicate-input":
            entries.append(dict(entry))
        elif mutation == "bad-dim":
            entry["shape"] = entry["shape"][:-1] + [entry["shape"][-1] + draw(st.integers(1, 3))]
        elif mutation == "zero-dim":
            entry["shape"] = [0] + entry["shape"][1:]
        elif mutation == "wrong-datatype":
            entry["datatype"] = draw(st.sampled_from(sorted(KSERVE_DATATYPES)))
        elif mutation == "binary-size-off" and "parameters" in entry:
            entry["parameters"]["binary_data_size"] += draw(st.integers(-3, 3))
        elif mutation == "truncate-body":
            tail = tail[:draw(st.integers(0, len(tail)))]
        elif mutation == "extend-body":
            tail += draw(st.binary(min_size=1, max_size=8))
        elif mutation == "too-many-rows" and batched:
            entry["shape"] = [model.max_batch_size + 1] + entry["shape"][1:]
        elif mutation == "data-not-list" and "data" in entry:
            entry["data"] = draw(scalars)
        elif mutation == "bad-output":
            doc["outputs"] = [{"name": "ghost"}]
    header = json.dumps(doc).encode()
    header_length = str(len(header)) if chunks or draw(st.booleans()) else None
    if "bad-header-length" in mutations:
        header_length = str(draw(st.integers(-1, len(header) + len(tail) + 1)))
    return model, header + tail if header_length is not None else header, header_length


def check_accepted(model: ModelConfig, request) -> None:
    batched = model.max_batch_size > 0
    for name, array in request.inputs.items():
        tensor = model.input(name)
        assert array.dtype == tensor.np_dtype
        dims = array.shape[1:] if batched else array.shape
        assert len(dims) == len(tensor.dims)
        assert all(d == e or e == -1 for d, e in zip(dims, tensor.dims))
        if batched:
            assert array.shape[0] == request.rows <= model.max_batch_size
    outputs = {}
    for t in model.outputs:
        shape = ((request.rows,) if batched else ()) + tuple(1 if d == -1 else d for d in t.dims)
        outputs[t.name] = (np.full(shape, b"ok", dtype=np.object_) if t.datatype == "BYTES"
                           else np.zeros(shape, dtype=t.np_dtype))
    body, header_length = encode_response(request, outputs)
    assert orjson.loads(body if header_length is None else body[:header_length])["model_name"] == model.name


def assert_accepted_or_4xx(loop, model, body, header_length) -> None:
    """Every input either parses into a request that checks out, or is refused with a 4xx."""
    try:
        request = parse(loop, model, body, header_length)
    except GatewayError as exc:
        assert 400 <= status_of(exc) < 500, exc
        return
    check_accepted(model, request)


def parse(loop, model, body, header_length):
    return parse_infer_request(model, body, capacity_bytes=CAPACITY_BYTES, future=loop.create_future(),
                               allow_faults=False, header_length=header_length)


@FUZZ
@given(case=requests())
def test_structured_requests_are_accepted_consistently_or_refused_with_a_4xx(loop, case):
    model, body, header_length = case
    try:
        request = parse(loop, model, body, header_length)
    except GatewayError as exc:
        assert 400 <= status_of(exc) < 500, exc
        assert str(exc)
        return
    check_accepted(model, request)


@FUZZ
@given(case=near_valid_requests())
def test_near_valid_requests_are_accepted_consistently_or_refused_with_a_4xx(loop, case):
    model, body, header_length = case
    assert_accepted_or_4xx(loop, model, body, header_length)


@FUZZ
@given(model=st.sampled_from(MODELS), body=st.binary(max_size=256),
       header_length=st.none() | st.binary(max_size=6) | st.integers(-3, 300).map(str))
def test_arbitrary_bytes_are_refused_with_a_4xx(loop, model, body, header_length):
    assert_accepted_or_4xx(loop, model, body, header_length)


@FUZZ
@given(datatype=st.sampled_from(sorted(KSERVE_DATATYPES - {"BYTES"})), rows=st.integers(1, 4),
       width=st.integers(1, 5), data=st.data())
def test_binary_tensors_round_trip_exactly(loop, datatype, rows, width, data):
    model = ModelConfig(name="rt", max_batch_size=4, inputs=(TensorConfig("x", datatype, (width,)),),
                        outputs=(TensorConfig("y", datatype, (width,)),), dynamic_batching=None, version=1,
                        model_path="/m/rt/1/model.onnx")
    dtype = model.input("x").np_dtype
    raw = data.draw(st.binary(min_size=rows * width * dtype.itemsize, max_size=rows * width * dtype.itemsize))
    array = np.frombuffer(raw, dtype=np.uint8).astype(bool).view(np.uint8) if datatype == "BOOL" else None
    raw = array.tobytes() if array is not None else raw
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [rows, width],
                                       "parameters": {"binary_data_size": len(raw)}}],
                           "parameters": {"binary_data_output": True}})

    request = parse(loop, model, header + raw, str(len(header)))

    assert request.inputs["x"].tobytes() == raw
    body, header_length = encode_response(request, {"y": request.inputs["x"]})
    assert body[header_length:] == raw


@FUZZ
@given(body=st.binary(max_size=128), encoding=st.sampled_from(["gzip", "deflate", "br", "identity", ""]))
def test_content_decoding_of_arbitrary_bytes_is_data_or_a_4xx(body, encoding):
    try:
        decoded = decode_content(body, encoding, limit_bytes=1024)
    except GatewayError as exc:
        assert 400 <= status_of(exc) < 500
        return
    assert len(decoded) <= max(1024, len(body))


@FUZZ
@given(items=st.lists(st.binary(max_size=20), max_size=8), junk=st.binary(max_size=12))
def test_bytes_elements_round_trip_and_junk_is_a_4xx(items, junk):
    wire = serialize_bytes_tensor(np.array(items + [b""], dtype=np.object_)[:len(items)])
    assert deserialize_bytes_tensor(wire, (len(items),)).tolist() == items
    try:
        decoded = tensor_from_buffer(TensorConfig("s", "BYTES", (-1,)), (len(items) + 1,), memoryview(wire + junk))
    except GatewayError as exc:
        assert status_of(exc) == 400
        return
    assert len(decoded) == len(items) + 1 and math.prod(decoded.shape) == len(items) + 1
