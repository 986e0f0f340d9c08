"""gateway/codec.py: KServe v2 JSON in (InferRequest or a 400/413 that says why), JSON out."""
from __future__ import annotations

import asyncio
import copy
import dataclasses

import numpy as np
import orjson
import pytest

from common.config import DynamicBatching, ModelConfig, TensorConfig
from gateway.codec import encode_infer_response, parse_infer_request
from gateway.errors import BadRequest, PayloadTooLarge, status_of

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
def loop():
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


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
    assert request.request_id == "req-1"
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
    pytest.param(mutated(lambda d: (set_input(0, shape=[0, 4], data=[])(d), set_input(1, shape=[0, 2], data=[])(d))),
                 "zero dimension", id="zero-dim"),
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
