"""gateway/codec/parse.py and encode.py: KServe v2 JSON in (InferRequest or a 400/413 that says why), JSON out."""
from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import zlib

import numpy as np
import orjson
import pytest

from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.codec.encode import encode_infer_response, encode_response
from ringserve.gateway.codec import json_body as json_body_module
from ringserve.gateway.codec.json_body import JSON_STRUCTURE_COMMAS, JsonBudget
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.codec.tensors import float_array
from ringserve.gateway.codec.binary import decode_content
from ringserve.gateway.core.errors import BadRequest, PayloadTooLarge, RequestTooLarge, TooManyValues, status_of

CAPACITY_BYTES = 1 << 20

MODEL = ModelConfig(
    name="mlp", max_batch_size=8,
    inputs=(TensorConfig("x", "FP32", (4,)), TensorConfig("mask", "INT32", (2,))),
    outputs=(TensorConfig("y", "FP32", (4,)), TensorConfig("label", "INT64", (1,))),
    dynamic_batching=DynamicBatching(), version=3, model_path="/models/mlp/3/model.onnx",
)
UNBATCHED = ModelConfig(
    name="image", max_batch_size=0,
    inputs=(TensorConfig("pixels", "UINT8", (2, -1)),), outputs=(TensorConfig("score", "FP32", (1,)),),
    dynamic_batching=None, version=1, model_path="/models/image/1/model.onnx",
)

X = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
MASK = [[1, 0], [0, 1]]


def good_doc() -> dict:
    return {
        "id": "req-1",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [v for row in X for v in row]},
            {"name": "mask", "datatype": "INT32", "shape": [2, 2], "data": MASK},
        ],
    }



@pytest.fixture
def parse(loop):
    def parse(doc, config: ModelConfig = MODEL, capacity_bytes: int = CAPACITY_BYTES, allow_faults: bool = False):
        body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
        return parse_infer_request(config, body, capacity_bytes=capacity_bytes,
                                   future=loop.create_future(), allow_faults=allow_faults)
    return parse


# -- accepted requests ------------------------------------------------------------------
def test_good_request_becomes_typed_arrays_with_rows_and_shape_key(parse):
    request = parse(good_doc())

    assert request.model is MODEL
    assert request.rows == 2
    assert request.inputs["x"].dtype == np.float32
    assert np.array_equal(request.inputs["x"], np.array(X, dtype=np.float32))
    assert request.inputs["mask"].dtype == np.int32
    assert np.array_equal(request.inputs["mask"], np.array(MASK, dtype=np.int32))
    assert request.shape_key == ((4,), (2,))  # the batch dim is left out: any row count batches together
    assert request.kserve_id == "req-1"
    assert request.requested_outputs is None
    assert request.fault is None
    assert not request.future.done()


def test_nested_and_flat_data_give_the_same_tensor(parse):
    nested = good_doc()
    nested["inputs"][0]["data"] = X
    flat = good_doc()
    flat["inputs"][1]["data"] = [v for row in MASK for v in row]

    a, b = parse(nested), parse(flat)

    for name in ("x", "mask"):
        assert np.array_equal(a.inputs[name], b.inputs[name])
        assert a.inputs[name].shape == b.inputs[name].shape


def test_inputs_may_come_in_any_order(parse):
    doc = good_doc()
    doc["inputs"].reverse()

    assert np.array_equal(parse(doc).inputs["x"], np.array(X, dtype=np.float32))


def test_unbatched_model_takes_the_declared_shape_as_is(parse):
    doc = {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}

    request = parse(doc, config=UNBATCHED)

    assert request.rows == 1
    assert request.inputs["pixels"].shape == (2, 3)
    assert request.shape_key == ((2, 3),)  # no batch dim: the whole shape decides who batches together


def test_fault_parameter_counts_only_when_fault_injection_is_on(parse):
    doc = {**good_doc(), "parameters": {"ringserve_fault": "segfault"}}

    assert parse(doc, allow_faults=True).fault == "segfault"
    assert parse(doc, allow_faults=False).fault is None


# -- 400: the request does not match the model ------------------------------------------
def mutated(change) -> dict:
    doc = copy.deepcopy(good_doc())
    change(doc)
    return doc


def set_input(index: int, **fields):
    return lambda doc: doc["inputs"][index].update(fields)


BAD_REQUESTS = [
    pytest.param(b"{not json", "not valid JSON", id="bad-json"),
    pytest.param(b"[1, 2]", "'inputs' list", id="body-not-an-object"),
    pytest.param(mutated(lambda d: d.pop("inputs")), "'inputs' list", id="inputs-missing"),
    pytest.param(mutated(lambda d: d.update(inputs={"x": 1})), "'inputs' list", id="inputs-not-a-list"),
    pytest.param(mutated(lambda d: d["inputs"].append("x")), "must be an object", id="input-not-an-object"),
    pytest.param(mutated(set_input(0, name="z")), "unknown input 'z'", id="unknown-input"),
    pytest.param(mutated(set_input(0, datatype="FP64")), "expects FP32", id="wrong-datatype"),
    pytest.param(mutated(lambda d: d["inputs"][0].pop("datatype")), "expects FP32", id="no-datatype"),
    pytest.param(mutated(lambda d: d["inputs"][0].pop("data")), "no 'data'", id="no-data"),
    pytest.param(mutated(set_input(0, shape=[2, 5], data=[0.0] * 10)), "does not match [-1,4]",
                 id="wrong-dim"),
    pytest.param(mutated(set_input(0, shape=[8], data=[0.0] * 8)), "does not match [-1,4]", id="wrong-rank"),
    pytest.param(mutated(set_input(0, shape=[2, -4])), "non-negative integers", id="negative-dim"),
    pytest.param(mutated(set_input(0, shape=[2, 4.0])), "non-negative integers", id="float-dim"),
    pytest.param(mutated(set_input(0, shape="2x4")), "non-negative integers", id="shape-not-a-list"),
    pytest.param(mutated(set_input(0, data=[1.0] * 7)), "needs 8 values, data has 7", id="too-few-values"),
    pytest.param(mutated(set_input(0, data=[1.0] * 9)), "needs 8 values, data has 9", id="too-many-values"),
    pytest.param(mutated(set_input(0, data=["a"] * 8)), "not a FP32 tensor", id="non-numeric-data"),
    pytest.param(mutated(set_input(0, data=[[1.0, 2.0], [3.0]])), "not a FP32 tensor", id="ragged-data"),
    pytest.param(mutated(set_input(1, data=[2**40, 0, 0, 1])), "not a INT32 tensor", id="int-overflow"),
    pytest.param(mutated(set_input(0, data="1,2,3")), "'data' must be a list", id="data-not-a-list"),
    pytest.param(mutated(lambda d: d["inputs"].append(d["inputs"][0])), "'x' is given twice", id="duplicate-input"),
    pytest.param(mutated(lambda d: d["inputs"].pop(1)), "missing input(s) mask", id="missing-input"),
    pytest.param(mutated(lambda d: (set_input(0, shape=[9, 4], data=[0.0] * 36)(d),
                                    set_input(1, shape=[9, 2], data=[0] * 18)(d))),
                 "batch dimension 9 exceeds model 'mlp' max_batch_size 8", id="batch-over-max"),
    pytest.param(mutated(set_input(1, shape=[1, 2], data=[0, 1])), "disagree on the batch dimension: [1, 2]",
                 id="inputs-disagree-on-batch"),
    pytest.param(mutated(lambda d: d.update(outputs=[{"name": "y"}, {"name": "probs"}])),
                 "unknown output(s) probs", id="unknown-output"),
    pytest.param(mutated(lambda d: d.update(outputs=["y"])), "list of objects with a 'name'",
                 id="outputs-not-objects"),
    pytest.param(mutated(lambda d: d.update(id=42)), "'id' must be a string", id="id-not-a-string"),
    pytest.param(mutated(lambda d: d.update(parameters=[1])), "'parameters' must be an object",
                 id="parameters-not-an-object"),
]


@pytest.mark.parametrize("doc, says", BAD_REQUESTS)
def test_malformed_request_is_a_400_that_says_why(parse, doc, says):
    with pytest.raises(BadRequest) as info:
        parse(doc)

    assert says in str(info.value)
    assert status_of(info.value) == 400


def test_unknown_input_message_lists_the_accepted_inputs(parse):
    with pytest.raises(BadRequest) as info:
        parse(mutated(set_input(0, name="z")))

    assert "x (FP32 [-1,4]), mask (INT32 [-1,2])" in str(info.value)


def test_missing_input_message_lists_the_accepted_inputs(parse):
    with pytest.raises(BadRequest) as info:
        parse(mutated(lambda d: d["inputs"].pop(0)))

    assert "missing input(s) x" in str(info.value)
    assert "x (FP32 [-1,4]), mask (INT32 [-1,2])" in str(info.value)


def test_unbatched_model_refuses_a_leading_batch_dim(parse):
    doc = {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [1, 2, 3], "data": [0] * 6}]}

    with pytest.raises(BadRequest, match=r"does not match \[2,-1\]"):
        parse(doc, config=UNBATCHED)


# -- 413: the request cannot fit one slot ------------------------------------------------
def test_tensors_beyond_the_slot_capacity_are_a_413(parse):
    # The inputs alone are 2*4*4 + 2*2*4 = 48 bytes; their outputs need room in the same slot too.
    with pytest.raises(PayloadTooLarge) as info:
        parse(good_doc(), capacity_bytes=48)

    assert status_of(info.value) == 413
    assert "48 bytes" in str(info.value)


def test_413_counts_the_outputs_too(parse):
    tight = dataclasses.replace(MODEL, outputs=(TensorConfig("y", "FP32", (4000,)),))
    # 2 rows of y are 32000 bytes: far more than the 48 input bytes
    with pytest.raises(PayloadTooLarge):
        parse(good_doc(), config=tight, capacity_bytes=16 * 1024)
    assert parse(good_doc(), config=tight, capacity_bytes=64 * 1024).rows == 2


# -- responses -----------------------------------------------------------------------------
def outputs_for(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"y": rng.standard_normal((rows, 4)).astype(np.float32),
            "label": rng.integers(-(2**40), 2**40, size=(rows, 1), dtype=np.int64)}


def test_response_carries_model_version_id_and_every_output_in_config_order(parse):
    request = parse(good_doc())
    outputs = outputs_for(2)

    doc = orjson.loads(encode_infer_response(request, outputs))

    assert doc["model_name"] == "mlp"
    assert doc["model_version"] == "3"
    assert doc["id"] == "req-1"
    assert [o["name"] for o in doc["outputs"]] == ["y", "label"]
    y, label = doc["outputs"]
    assert (y["datatype"], y["shape"]) == ("FP32", [2, 4])
    assert (label["datatype"], label["shape"]) == ("INT64", [2, 1])
    assert label["data"] == outputs["label"].reshape(-1).tolist()


def test_response_data_round_trips_to_the_exact_float32_values(parse):
    request = parse(good_doc())
    outputs = outputs_for(2)

    doc = orjson.loads(encode_infer_response(request, outputs))

    data = np.asarray(doc["outputs"][0]["data"], dtype=np.float32).reshape(doc["outputs"][0]["shape"])
    assert data.tobytes() == outputs["y"].tobytes()


def test_response_without_id_has_no_id(parse):
    doc = good_doc()
    del doc["id"]

    response = orjson.loads(encode_infer_response(parse(doc), outputs_for(2)))

    assert "id" not in response


@pytest.mark.parametrize("requested", [["label"], ["label", "y"], ["y"]])
def test_requested_outputs_are_returned_alone_and_in_the_requested_order(parse, requested):
    request = parse({**good_doc(), "outputs": [{"name": n} for n in requested]})
    assert request.requested_outputs == requested

    doc = orjson.loads(encode_infer_response(request, outputs_for(2)))

    assert [o["name"] for o in doc["outputs"]] == requested


# -- every datatype, JSON ----------------------------------------------------------------
def one_input_model(datatype: str, dims: tuple[int, ...] = (3,)) -> ModelConfig:
    return ModelConfig(name="typed", max_batch_size=4, inputs=(TensorConfig("t", datatype, dims),),
                       outputs=(TensorConfig("out", datatype, dims),), dynamic_batching=None, version=1,
                       model_path="/models/typed/1/model.onnx")


JSON_VALUES = {
    "BOOL": [True, False, True], "UINT8": [0, 7, 255], "UINT16": [0, 7, 65535], "UINT32": [0, 7, 2**32 - 1],
    "UINT64": [0, 7, 2**64 - 1], "INT8": [-128, 0, 127], "INT16": [-(2**15), 0, 2**15 - 1],
    "INT32": [-(2**31), 0, 2**31 - 1], "INT64": [-(2**63), 0, 2**63 - 1], "FP16": [0.5, -2.0, 65504.0],
    "FP32": [0.1, -2.5, 3.4e38], "FP64": [0.1, -2.5, 1e300],
}


@pytest.mark.parametrize("datatype", sorted(JSON_VALUES))
def test_every_kserve_datatype_parses_from_json_exactly(parse, datatype):
    config = one_input_model(datatype)
    values = JSON_VALUES[datatype]

    request = parse({"inputs": [{"name": "t", "datatype": datatype, "shape": [1, 3], "data": values}]}, config=config)

    array = request.inputs["t"]
    assert array.dtype == config.input("t").np_dtype
    assert array.tolist() == [np.array(values, dtype=array.dtype).tolist()]


@pytest.mark.parametrize("datatype, data, says", [
    ("UINT8", [0, 1, 256], "within 0..255"),
    ("UINT64", [0, 1, -1], "within 0..18446744073709551615"),
    ("INT8", [0, 1, -129], "within -128..127"),
    ("INT32", [0, 1.5, 2], "must be JSON integers"),
    ("INT64", [True, False, True], "must be JSON integers"),
    ("BOOL", [1, 0, 1], "must be JSON true/false"),
    ("FP16", [1.0, 2.0, 70000.0], "overflow"),
    ("FP32", [1.0, 2.0, 1e39], "overflow"),
])
def test_json_values_that_do_not_fit_the_datatype_are_refused_not_wrapped(parse, datatype, data, says):
    doc = {"inputs": [{"name": "t", "datatype": datatype, "shape": [1, 3], "data": data}]}

    with pytest.raises(BadRequest, match=says) as info:
        parse(doc, config=one_input_model(datatype))

    assert f"data is not a {datatype} tensor" in str(info.value)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_nan_and_infinity_in_json_are_read_as_triton_reads_them(parse, datatype):
    body = (b'{"inputs": [{"name": "t", "datatype": "%s", "shape": [1, 3], "data": [NaN, -Infinity, Infinity]}],'
            b' "id": "NaN, Infinity"}' % datatype.encode())

    request = parse(body, config=one_input_model(datatype))

    x = request.inputs["t"]
    assert x.dtype == numpy_dtype(datatype) and np.isnan(x[0, 0]) and x[0, 1] == -np.inf and x[0, 2] == np.inf
    assert request.kserve_id == "NaN, Infinity"  # (a string holding the words is left alone)


def test_nan_also_comes_in_the_json_header_of_a_binary_request(parse_binary):
    mask = np.ones((1, 2), dtype=np.int32)
    header, _ = binary_body({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]},
                                        binary_input("mask", "INT32", [1, 2], mask.nbytes)]})
    header = header.replace(b"[1.0,2.0,3.0,4.0]", b"[1.0,NaN,-Infinity,4.0]")

    request = parse_binary(header + mask.tobytes(), str(len(header)).encode())

    x = request.inputs["x"]
    assert np.isnan(x[0, 1]) and x[0, 2] == -np.inf and x[0, 3] == 4.0
    assert request.inputs["mask"].tolist() == [[1, 1]]


NON_FINITE_REFUSED = [
    (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [-NaN]}]}', "NaN, Infinity and -Infinity"),
    (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [Inf]}]}', "not valid JSON"),
    (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}], "id": "\\ud800"}',
     "not valid JSON"),  # what orjson refuses stays refused: here a lone surrogate
    (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}], "x": 1e999}', "not valid JSON"),
    (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}], "x": 1NaN}', "not valid JSON"),
    (b'{"inputs": [{"name": "t", "datatype": "INT32", "shape": [1, 1], "data": [NaN]}]}', "not a INT32 tensor"),
]


def test_the_json_fallback_takes_the_three_literals_and_nothing_more(parse):
    """The standard library's json runs only for a body orjson refused at a literal, and only where the
    body holds to orjson's rules otherwise: the other spellings and what orjson refuses stay 400s."""
    accepted = parse(b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1, 1], "data": [-Infinity]}]}',
                     config=one_input_model("FP32", (1,)))
    assert accepted.inputs["t"].tolist() == [[-np.inf]]
    for body, says in NON_FINITE_REFUSED:
        config = one_input_model("INT32" if b"INT32" in body else "FP32", (1,))
        with pytest.raises(BadRequest, match=says):
            parse(body, config=config)


@pytest.mark.parametrize("body, says", [
    (b"[" * 2000 + b"]" * 2000, "nest at most 1024 deep"),
    (b'{"inputs": "\xff\xfe"}', r"not valid JSON \(UTF-8\)"),
])
def test_deep_and_non_utf8_json_are_400s(parse, body, says):
    with pytest.raises(BadRequest, match=says):
        parse(body)


def test_bytes_tensors_parse_from_json_strings_as_utf8(parse):
    config = one_input_model("BYTES", (2,))
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2, 2], "data": [["a", "h\u00e9"], ["", "z"]]}]}

    array = parse(doc, config=config).inputs["t"]

    assert array.shape == (2, 2) and array.dtype == np.object_
    assert array.tolist() == [[b"a", "h\u00e9".encode()], [b"", b"z"]]


def test_bytes_json_data_must_be_strings(parse):
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1, 2], "data": ["a", 3]}]}

    with pytest.raises(BadRequest, match="BYTES data must be JSON strings"):
        parse(doc, config=one_input_model("BYTES", (2,)))


# -- binary tensor extension ---------------------------------------------------------------
def binary_body(doc: dict, *chunks: bytes) -> tuple[bytes, bytes]:
    header = orjson.dumps(doc)
    return header + b"".join(chunks), str(len(header)).encode()


@pytest.fixture
def parse_binary(loop):
    def parse(body: bytes, header_length, config: ModelConfig = MODEL, capacity_bytes: int = CAPACITY_BYTES):
        return parse_infer_request(config, body, capacity_bytes=capacity_bytes, future=loop.create_future(),
                                   allow_faults=False, header_length=header_length)
    return parse


def binary_input(name: str, datatype: str, shape: list[int], nbytes: int) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": nbytes}}


def test_binary_inputs_are_views_of_the_body_in_json_order(parse_binary):
    x = np.array(X, dtype=np.float32)
    mask = np.array(MASK, dtype=np.int32)
    body, length = binary_body({"inputs": [binary_input("mask", "INT32", [2, 2], 16),
                                           binary_input("x", "FP32", [2, 4], 32)]},
                               mask.tobytes(), x.tobytes())

    request = parse_binary(body, length)

    assert np.array_equal(request.inputs["x"], x) and np.array_equal(request.inputs["mask"], mask)
    assert request.rows == 2 and request.shape_key == ((2,), (4,))
    # One copy from body to slot: the arrays share the request body's memory.
    assert all(not a.flags.owndata and not a.flags.writeable for a in request.inputs.values())


def test_binary_and_json_inputs_mix(parse_binary):
    x = np.array(X, dtype=np.float32)
    body, length = binary_body({"inputs": [binary_input("x", "FP32", [2, 4], 32),
                                           {"name": "mask", "datatype": "INT32", "shape": [2, 2], "data": MASK}]},
                               x.tobytes())

    request = parse_binary(body, length)

    assert np.array_equal(request.inputs["x"], x)
    assert np.array_equal(request.inputs["mask"], np.array(MASK, dtype=np.int32))


def test_every_fixed_size_datatype_parses_from_binary(parse_binary):
    for datatype, values in JSON_VALUES.items():
        config = one_input_model(datatype)
        array = np.array([values], dtype=config.input("t").np_dtype)
        body, length = binary_body({"inputs": [binary_input("t", datatype, [1, 3], array.nbytes)]}, array.tobytes())

        assert parse_binary(body, length, config=config).inputs["t"].tolist() == array.tolist(), datatype


def test_bytes_tensors_parse_from_binary(parse_binary):
    config = one_input_model("BYTES", (2,))
    data = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", "zw\u00f6lf\x00".encode()))
    body, length = binary_body({"inputs": [binary_input("t", "BYTES", [1, 2], len(data))]}, data)

    assert parse_binary(body, length, config=config).inputs["t"].tolist() == [[b"ab", "zw\u00f6lf\x00".encode()]]

    data = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"\xff\x00"))  # not UTF-8: carried as sent
    body, length = binary_body({"inputs": [binary_input("t", "BYTES", [1, 2], len(data))]}, data)
    request = parse_binary(body, length, config=config)
    assert request.inputs["t"].tolist() == [[b"ab", b"\xff\x00"]] and request.serialized == {"t": data}


BINARY_REFUSALS = [
    pytest.param({"inputs": [binary_input("x", "FP32", [2, 4], 32), binary_input("mask", "INT32", [2, 2], 12)]},
                 48, "binary_data_size is 12 bytes but shape [2, 2] of INT32 needs 4 x 4 = 16", id="size-vs-shape"),
    pytest.param({"inputs": [binary_input("x", "FP32", [2, 4], 32), binary_input("mask", "INT32", [2, 2], 16)]},
                 40, "runs past the end of the body", id="body-too-short"),
    pytest.param({"inputs": [binary_input("x", "FP32", [2, 4], 32), binary_input("mask", "INT32", [2, 2], 16)]},
                 52, "4 bytes after the last input", id="bytes-left-over"),
    pytest.param({"inputs": [{**binary_input("x", "FP32", [2, 4], 32), "data": [0.0] * 8},
                             binary_input("mask", "INT32", [2, 2], 16)]},
                 48, "both 'data' and binary_data_size", id="data-and-binary"),
    pytest.param({"inputs": [binary_input("x", "FP32", [2, 4], "32"), binary_input("mask", "INT32", [2, 2], 16)]},
                 48, "binary_data_size must be a non-negative integer", id="size-not-an-int"),
    pytest.param({"inputs": [{**binary_input("x", "FP32", [2, 4], 32), "parameters": [1]},
                             binary_input("mask", "INT32", [2, 2], 16)]},
                 48, "'parameters' must be an object", id="input-parameters-not-an-object"),
]


@pytest.mark.parametrize("doc, binary_bytes, says", BINARY_REFUSALS)
def test_binary_requests_that_disagree_with_themselves_are_400s(parse_binary, doc, binary_bytes, says):
    body, length = binary_body(doc, b"\0" * binary_bytes)

    with pytest.raises(BadRequest) as info:
        parse_binary(body, length)

    assert says in str(info.value)


def test_binary_data_size_without_the_header_is_a_400(parse):
    doc = {"inputs": [binary_input("x", "FP32", [2, 4], 32), binary_input("mask", "INT32", [2, 2], 16)]}

    with pytest.raises(BadRequest, match="send the Inference-Header-Content-Length header"):
        parse(doc)


def test_raw_request_body_is_the_single_input_and_outputs_come_back_binary(parse_binary):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    config = dataclasses.replace(MODEL, inputs=(TensorConfig("x", "FP32", (4,)),))

    request = parse_binary(x.tobytes(), b"0", config=config)

    assert np.array_equal(request.inputs["x"], x) and request.rows == 2
    assert request.binary_outputs == {"y", "label"}


def test_raw_request_for_a_model_with_two_inputs_is_a_400(parse_binary):
    with pytest.raises(BadRequest, match="for models with one input"):
        parse_binary(b"\0" * 16, b"0")


# -- requested outputs and binary outputs -----------------------------------------------------
@pytest.mark.parametrize("doc_change, binary", [
    ({}, set()),
    ({"parameters": {"binary_data_output": True}}, {"y", "label"}),
    ({"outputs": [{"name": "label", "parameters": {"binary_data": True}}, {"name": "y"}]}, {"label"}),
    ({"parameters": {"binary_data_output": True},
      "outputs": [{"name": "label", "parameters": {"binary_data": False}}, {"name": "y"}]}, {"y"}),
])
def test_binary_output_choice_follows_binary_data_and_binary_data_output(parse, doc_change, binary):
    assert parse({**good_doc(), **doc_change}).binary_outputs == binary


@pytest.mark.parametrize("doc_change, says", [
    ({"outputs": [{"name": "y"}, {"name": "y"}]}, "names an output twice"),
    ({"outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}, "binary_data must be true or false"),
    ({"outputs": [{"name": "y", "parameters": {"classification": -1}}]}, "Unable to set 'classification'"),
    ({"outputs": [{"name": "y", "parameters": {"classification": 3, "shared_memory_region": "r"}}]},
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({"parameters": {"binary_data_output": 1}}, "binary_data_output must be true or false"),
])
def test_bad_output_requests_are_400s(parse, doc_change, says):
    with pytest.raises(BadRequest, match=says):
        parse({**good_doc(), **doc_change})


def split_response(body: bytes, header_length: int) -> tuple[dict, bytes]:
    return orjson.loads(body[:header_length]), body[header_length:]


def test_binary_response_is_the_json_header_then_the_outputs_bytes_in_order(parse):
    request = parse({**good_doc(), "outputs": [{"name": "label", "parameters": {"binary_data": True}},
                                               {"name": "y", "parameters": {"binary_data": True}}]})
    outputs = outputs_for(2)

    body, header_length = encode_response(request, outputs)

    doc, rest = split_response(body, header_length)
    assert doc["id"] == "req-1" and [o["name"] for o in doc["outputs"]] == ["label", "y"]
    label, y = doc["outputs"]
    assert label == {"name": "label", "datatype": "INT64", "shape": [2, 1], "parameters": {"binary_data_size": 16}}
    assert y["parameters"] == {"binary_data_size": 32} and "data" not in y
    assert rest == outputs["label"].tobytes() + outputs["y"].tobytes()


def test_mixed_response_carries_json_data_for_the_other_outputs(parse):
    request = parse({**good_doc(), "outputs": [{"name": "y"}, {"name": "label", "parameters": {"binary_data": True}}]})
    outputs = outputs_for(2)

    body, header_length = encode_response(request, outputs)

    doc, rest = split_response(body, header_length)
    assert np.array_equal(np.array(doc["outputs"][0]["data"], dtype=np.float32), outputs["y"].reshape(-1))
    assert rest == outputs["label"].tobytes()


def test_all_json_response_has_no_header_length(parse):
    request = parse(good_doc())

    body, header_length = encode_response(request, outputs_for(2))

    assert header_length is None and body == encode_infer_response(request, outputs_for(2))


def test_bytes_outputs_encode_as_json_strings_or_length_prefixed_binary(parse):
    config = one_input_model("BYTES", (2,))
    out = np.array([[b"ab", "h\u00e9".encode()]], dtype=np.object_)
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]}

    json_body, _ = encode_response(parse(doc, config=config), {"out": out})
    binary, length = encode_response(parse({**doc, "parameters": {"binary_data_output": True}}, config=config),
                                     {"out": out})

    assert orjson.loads(json_body)["outputs"][0]["data"] == ["ab", "h\u00e9"]
    header, rest = split_response(binary, length)
    assert rest == b"\x02\x00\x00\x00ab\x03\x00\x00\x00" + "h\u00e9".encode()
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(rest)


def test_a_non_utf8_bytes_output_in_json_is_its_bytes_in_the_string_as_triton_writes_it(parse):
    config = one_input_model("BYTES", (2,))
    request = parse({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2, 2], "data": ["a", "b", "c", "d"]}]},
                    config=config)
    out = np.array([[b"\xff", "é\n".encode()], [b'q"\\\x01', b""]], dtype=np.object_)

    body, length = encode_response(request, {"out": out})

    # rapidjson's writer: the bytes unchanged, but for '"', '\\' and control bytes, escaped.
    assert length is None
    assert b'"data":["\xff","\xc3\xa9\\n","q\\"\\\\\\u0001",""]' in body
    assert body.startswith(b'{"model_name":"typed"')


# -- Content-Encoding ---------------------------------------------------------------------------------------------
def test_a_gzip_body_with_bytes_after_its_stream_is_refused():
    body = gzip.compress(b'{"inputs": []}')
    assert decode_content(body, "gzip", 1 << 20) == b'{"inputs": []}'
    with pytest.raises(BadRequest, match="has 7 bytes after its compressed stream"):
        decode_content(body + b"garbage", "gzip", 1 << 20)
    with pytest.raises(BadRequest, match="has 3 bytes after its compressed stream"):
        decode_content(zlib.compress(b"{}") + b"abc", "deflate", 1 << 20)


def test_gzip_members_one_after_another_are_all_decoded_within_the_limit():
    body = gzip.compress(b'{"inputs": ') + gzip.compress(b"[]}")
    assert decode_content(body, "gzip", 1 << 20) == b'{"inputs": []}'
    with pytest.raises(RequestTooLarge):
        decode_content(gzip.compress(b" " * 600) + gzip.compress(b" " * 600), "gzip", 1000)
    with pytest.raises(BadRequest, match="not valid gzip data"):
        decode_content(gzip.compress(b"{}") + b"\x1f\x8bjunk", "gzip", 1 << 20)


# -- JSON floats: np.fromiter for a flat list, np.asarray for the rest -------------------------------------------
FLOAT_DATA = [[0.5, -1.25, 3e38], [True, 2, 2**70], ["1.5", "inf", None], [], [[1.0, 2.0], [3.0, 4.0]], [[]],
              [1e39], [10**400], [{}], ["x"], [1.0, [2.0]], [[1.0], 2.0]]


@pytest.mark.parametrize("data", FLOAT_DATA, ids=[repr(d)[:24] for d in FLOAT_DATA])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_json_floats_become_what_np_asarray_makes_of_them_or_its_error(data, dtype):
    def outcome(convert):
        try:
            with np.errstate(over="raise"):
                array = convert(data, np.dtype(dtype))
        except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
            return type(exc), str(exc)
        return array.dtype, array.shape, array.tobytes()

    assert outcome(float_array) == outcome(lambda d, t: np.asarray(d, dtype=t))


# -- non-finite floats out, as Triton's rapidjson writes them ------------------------------------------------------
@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize("rows", [1, 64])
def test_nan_and_infinity_outputs_are_written_as_nan_infinity_and_minus_infinity(parse, datatype, rows):
    config = one_input_model(datatype)
    request = parse({"inputs": [{"name": "t", "datatype": datatype, "shape": [1, 3], "data": [0, 0, 0]}],
                     "id": "n"}, config=config)
    out = np.random.default_rng(3).standard_normal((rows, 3)).astype(numpy_dtype(datatype))
    out[0] = [np.nan, np.inf, -np.inf]
    out[rows - 1, 1] = np.nan if rows > 1 else np.inf

    body = encode_infer_response(request, {"out": out})  # (orjson's null found in its bytes: nothing marks it)

    assert b"null" not in body and b"[NaN,Infinity,-Infinity" in body
    decoded = json.loads(body)  # (Python's json reads the three literals, as python-rapidjson does)
    got = np.asarray(decoded["outputs"][0]["data"], numpy_dtype(datatype)).reshape(rows, 3)
    np.testing.assert_array_equal(got, out)  # NaN where NaN, the finite values as orjson writes them
    finite = out.copy()
    finite[~np.isfinite(finite)] = 1.5
    assert encode_infer_response(request, {"out": finite}) == orjson.dumps(
        {"model_name": "typed", "model_version": "1", "id": "n", "outputs": [
            {"name": "out", "datatype": datatype, "shape": [rows, 3], "data": finite.reshape(-1)}]},
        option=orjson.OPT_SERIALIZE_NUMPY)  # the finite case: orjson's bytes, nothing added


def test_non_finite_json_outputs_beside_binary_ones_and_a_null_in_a_name(parse):
    request = parse({**good_doc(), "id": "null", "outputs": [{"name": "label", "parameters": {"binary_data": True}},
                                                             {"name": "y"}]})
    y = np.array([[np.nan, 1, 2, 3], [4, 5, 6, -np.inf]], np.float32)
    label = np.array([[1], [2]], np.int64)

    body, length = encode_response(request, {"y": y, "label": label})

    header = json.loads(body[:length])
    assert header["id"] == "null" and header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.asarray(header["outputs"][1]["data"], np.float32).reshape(2, 4), y)
    assert body[length:] == label.tobytes()


def test_a_null_that_is_no_number_leaves_finite_outputs_as_orjson_writes_them(parse):
    request = parse({**good_doc(), "id": "null"})  # (the body holds "null": each float output is checked)
    y = np.array([[0.5, 1, 2, 3], [4, 5, 6, 7]], np.float32)
    label = np.array([[1], [2]], np.int64)

    body = encode_infer_response(request, {"y": y, "label": label})

    assert json.loads(body)["id"] == "null" and b"NaN" not in body and b"Infinity" not in body
    np.testing.assert_array_equal(np.asarray(json.loads(body)["outputs"][0]["data"], np.float32).reshape(2, 4), y)


# -- zero-sized tensors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x_shape, mask_shape", [([0, 4], [0, 2]), ([1, 4], [1, 2])])
def test_zero_rows_and_zero_sized_dims_are_served_in_json_and_binary(parse, parse_binary, x_shape, mask_shape):
    config = ModelConfig(name="z", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (-1,)),
                                                             TensorConfig("s", "BYTES", (-1,))),
                         outputs=(TensorConfig("y", "FP32", (-1,)),), dynamic_batching=DynamicBatching(),
                         version=1, model_path="/m")
    rows = x_shape[0]
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 0], "data": []},
                      {"name": "s", "datatype": "BYTES", "shape": [rows, 0], "data": []}]}
    header, _ = binary_body({"inputs": [binary_input("x", "FP32", [rows, 0], 0),
                                        binary_input("s", "BYTES", [rows, 0], 0)],
                             "parameters": {"binary_data_output": True}})

    for request in (parse(doc, config=config), parse_binary(header, str(len(header)).encode(), config=config)):
        assert request.rows == rows and request.shape_key == ((0,), (0,))
        assert request.inputs["x"].shape == (rows, 0) and request.inputs["s"].shape == (rows, 0)
        assert request.serialized == {"s": b""}
    out = np.zeros((rows, 0), np.float32)
    assert orjson.loads(encode_infer_response(parse(doc, config=config), {"y": out}))["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [rows, 0], "data": []}]
    body, length = encode_response(request, {"y": out})
    assert orjson.loads(body[:length])["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [rows, 0], "parameters": {"binary_data_size": 0}}]
    assert len(body) == length


# -- work bounded before it is done ----------------------------------------------------------------------
def test_a_json_body_with_more_values_than_a_slot_holds_is_413_before_orjson_parses_it(parse, monkeypatch):
    capacity = 4096  # FP32 and INT32: at most 1024 values, plus JSON_STRUCTURE_COMMAS for the document
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2,4],"data":[' + b"0," * 20_000 + b"0]}]}"
    monkeypatch.setattr(json_body_module.orjson, "loads", lambda _: pytest.fail("parsed before it was counted"))
    with pytest.raises(TooManyValues) as info:
        parse(body, capacity_bytes=capacity)
    assert status_of(info.value) == 413
    assert str(info.value).startswith(f"the request's JSON has {20_000 + 4} commas or more, so about as many values; "
                                      f"one batch slot holds 4096 bytes, room for {1024 + JSON_STRUCTURE_COMMAS} of "
                                      "them at most")


def test_a_json_budget_counts_only_the_json_part_of_a_binary_body():
    budget = JsonBudget(MODEL, 4096, json_bytes=10)
    budget.count(b"0," * 5 + b"," * 100_000)  # the binary part: commas there are tensor bytes
    assert budget.commas == 5
    with pytest.raises(TooManyValues):
        JsonBudget(MODEL, 4096).count(b"," * 6000)


def test_the_shape_is_refused_before_its_data_is_read(parse):
    """A batch over max_batch_size, or more elements than a slot holds: data that is no tensor at all is
    never looked at (a million empty strings took seconds before their 400)."""
    over_batch = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 4], "data": "never read"},
                             {"name": "mask", "datatype": "INT32", "shape": [9, 2], "data": []}]}
    with pytest.raises(BadRequest, match="batch dimension 9 exceeds model 'mlp' max_batch_size 8"):
        parse(over_batch)
    past_slot = {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [2, 10**7], "data": "never read"}]}
    with pytest.raises(PayloadTooLarge, match=r"input 'pixels' \(shape \[2, 10000000\] UINT8\) needs 20000000 bytes"):
        parse(past_slot, config=UNBATCHED)


def test_json_data_whose_length_cannot_match_the_shape_is_refused_before_conversion(parse):
    doc = good_doc()
    doc["inputs"][0]["data"] = [0.5] * 7
    with pytest.raises(BadRequest, match=r"shape \[2, 4\] needs 8 values, data has 7 entries \(give the values flat, "
                                         r"or as 2 rows\)"):
        parse(doc)
