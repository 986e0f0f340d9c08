"""gateway/grpc/codec.py: a ModelInferRequest becomes the HTTP codec's document, and the same InferRequest."""
from __future__ import annotations

import grpc
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.repository.batching import DynamicBatching

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.codec.parse import parse_infer_doc, parse_infer_request
from ringserve.gateway.core.errors import (BadRequest, DeadlineExceeded, ModelNotFound, PayloadTooLarge, Unauthorized,
                                      Unavailable, WorkerCrashed)
from ringserve.gateway.grpc.codec import grpc_code, infer_doc, infer_response, receive_infer_request
from ringserve.gateway.core.regions import WrittenOutput
from ringserve.supervision.startup import grpc_port_problem
from ringserve.common.settings import Settings

CAPACITY_BYTES = 1 << 20
MODEL = ModelConfig(
    name="mlp", max_batch_size=8,
    inputs=(TensorConfig("x", "FP32", (4,)), TensorConfig("mask", "INT32", (2,))),
    outputs=(TensorConfig("y", "FP32", (4,)), TensorConfig("label", "INT64", (1,))),
    dynamic_batching=DynamicBatching(priority_levels=2), version=3, model_path="/models/mlp/3/model.onnx",
)
TEXT = ModelConfig(name="text", max_batch_size=4, inputs=(TensorConfig("s", "BYTES", (1,)),),
                   outputs=(TensorConfig("n", "BYTES", (1,)),), dynamic_batching=DynamicBatching(), version=1,
                   model_path="/models/text/1/model.onnx")
X = np.arange(8, dtype=np.float32).reshape(2, 4)
MASK = np.array([[1, 0], [0, 1]], np.int32)


def raw_request(**kwargs) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp", **kwargs)
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.inputs.add(name="mask", datatype="INT32", shape=[2, 2])
    request.raw_input_contents.extend([X.tobytes(), MASK.tobytes()])
    return request


def parse(loop, request: pb.ModelInferRequest, config: ModelConfig = MODEL):
    doc, raw = infer_doc(request)
    return parse_infer_doc(config, doc, raw, capacity_bytes=CAPACITY_BYTES, future=loop.create_future(),
                           allow_faults=False)


def test_raw_contents_become_views_over_the_message_bytes_as_binary_http_tensors_are(loop):
    request = raw_request(id="r1")
    parsed = parse(loop, request)
    np.testing.assert_array_equal(parsed.inputs["x"], X)
    np.testing.assert_array_equal(parsed.inputs["mask"], MASK)
    assert parsed.rows == 2 and parsed.kserve_id == "r1" and parsed.shape_key == ((4,), (2,))
    assert not parsed.inputs["x"].flags.owndata  # np.frombuffer over the bytes: no copy until the slot
    body = orjson.dumps({"id": "r1", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()},
        {"name": "mask", "datatype": "INT32", "shape": [2, 2], "data": MASK.ravel().tolist()}]})
    http = parse_infer_request(MODEL, body, capacity_bytes=CAPACITY_BYTES, future=loop.create_future(),
                               allow_faults=False)
    assert (http.rows, http.shape_key, http.kserve_id, http.requested_outputs) == (
        parsed.rows, parsed.shape_key, parsed.kserve_id, parsed.requested_outputs)


def test_typed_contents_go_through_the_json_numbers_path(loop):
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(X.ravel().tolist())
    request.inputs.add(name="mask", datatype="INT32", shape=[2, 2]).contents.int_contents.extend([1, 0, 0, 1])
    parsed = parse(loop, request)
    np.testing.assert_array_equal(parsed.inputs["x"], X)
    assert parsed.inputs["mask"].dtype == np.int32 and parsed.inputs["mask"].tolist() == MASK.tolist()


def test_typed_bytes_are_laid_out_in_the_binary_bytes_form(loop):
    request = pb.ModelInferRequest(model_name="text")
    request.inputs.add(name="s", datatype="BYTES", shape=[2, 1]).contents.bytes_contents.extend([b"ab", "é".encode()])
    parsed = parse(loop, request, TEXT)
    assert parsed.inputs["s"].tolist() == [[b"ab"], ["é".encode()]]
    assert parsed.serialized["s"] == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"


def test_parameters_pass_through_into_the_document_shared_memory_ones_included():
    request = raw_request(id="p")
    request.parameters["priority"].uint64_param = 1
    request.parameters["timeout"].int64_param = 5000
    request.parameters["note"].string_param = "n"
    region = request.inputs.add(name="extra", datatype="FP32", shape=[2, 4])
    region.parameters["shared_memory_region"].string_param = "in0"
    region.parameters["shared_memory_byte_size"].int64_param = 32
    output = request.outputs.add(name="y")
    output.parameters["shared_memory_region"].string_param = "out0"
    output.parameters["shared_memory_offset"].int64_param = 64
    request.outputs.add(name="label")

    doc, _ = infer_doc(request)

    assert doc["parameters"] == {"priority": 1, "timeout": 5000, "note": "n"}
    assert doc["inputs"][2] == {"name": "extra", "datatype": "FP32", "shape": [2, 4], "parameters": {
        "shared_memory_region": "in0", "shared_memory_byte_size": 32}}  # no raw contents taken for it
    assert doc["outputs"] == [{"name": "y", "parameters": {"shared_memory_region": "out0",
                                                            "shared_memory_offset": 64}}, {"name": "label"}]


def test_a_binary_data_size_parameter_means_nothing_over_grpc(loop):
    request = pb.ModelInferRequest(model_name="mlp")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    x.contents.fp32_contents.extend(X.ravel().tolist())
    x.parameters["binary_data_size"].int64_param = 32
    mask = request.inputs.add(name="mask", datatype="INT32", shape=[2, 2])
    mask.parameters["binary_data_size"].int64_param = 16  # and no data at all
    with pytest.raises(BadRequest, match="input 'mask': no data; give its values in contents.int_contents or its "
                                         "bytes in raw_input_contents"):
        parse(loop, request)
    mask.contents.int_contents.extend([1, 0, 0, 1])
    np.testing.assert_array_equal(parse(loop, request).inputs["x"], X)


def test_priority_and_requested_outputs_reach_the_request(loop):
    request = raw_request()
    request.parameters["priority"].uint64_param = 2
    request.outputs.add(name="label")
    parsed = parse(loop, request)
    assert parsed.priority == 2 and parsed.requested_outputs == ["label"]


@pytest.mark.parametrize("change, message", [
    ("mix", "input 'mask': contents and raw_input_contents are both given; send every input's data one way"),
    ("fewer", "raw_input_contents has 1 entries, fewer than the inputs that need one"),
    ("more", "raw_input_contents has 3 entries but 2 input(s) take one"),
    ("field", "input 'mask': datatype INT32 takes its values in contents.int_contents; the request set: "
              "int64_contents"),
    ("fp16", "input 'mask': datatype FP16 takes its values in raw_input_contents (it has no typed contents field)"),
])
def test_malformed_contents_are_refused_saying_how_to_send_them(loop, change, message):
    request = raw_request()
    if change == "mix":
        request.inputs[1].contents.int_contents.extend([1, 0, 0, 1])
    elif change == "fewer":
        del request.raw_input_contents[1]
    elif change == "more":
        request.raw_input_contents.append(b"")
    else:
        del request.raw_input_contents[:]
        request.inputs[0].contents.fp32_contents.extend(X.ravel().tolist())
        request.inputs[1].contents.int64_contents.extend([1, 0, 0, 1])
        if change == "fp16":
            request.inputs[1].datatype = "FP16"
    with pytest.raises(BadRequest) as info:
        parse(loop, request)
    assert message in str(info.value)


def test_a_wrong_shape_says_what_http_says(loop):
    request = raw_request()
    request.inputs[0].shape[1] = 5
    with pytest.raises(BadRequest, match=r"input 'x': shape \[2, 5\] does not match \[-1,4\]"):
        parse(loop, request)


def test_the_answer_carries_every_output_raw_as_triton_answers(loop):
    parsed = parse(loop, raw_request(id="a"))
    y = np.ones((2, 4), np.float32)
    label = np.array([[3], [4]], np.int64)
    response = infer_response(parsed, {"y": y, "label": label})
    assert (response.model_name, response.model_version, response.id) == ("mlp", "3", "a")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("y", "FP32", [2, 4]), ("label", "INT64", [2, 1])]
    assert response.raw_output_contents == [y.tobytes(), label.tobytes()]


def test_bytes_outputs_are_answered_in_the_binary_bytes_form(loop):
    request = pb.ModelInferRequest(model_name="text")
    request.inputs.add(name="s", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(b"x")
    parsed = parse(loop, request, TEXT)
    response = infer_response(parsed, {"n": np.array([[b"hi"]], dtype=object)})
    assert response.raw_output_contents == [b"\x02\x00\x00\x00hi"]


def test_bytes_contents_are_any_bytes_carried_into_the_slot_form_and_back_as_sent(loop):
    items = [b"\xff\xd8\xff\xe0", b"caf\xe9", b"\x00"]  # a JPEG's start, latin-1, a NUL: not UTF-8 text
    request = pb.ModelInferRequest(model_name="text")
    request.inputs.add(name="s", datatype="BYTES", shape=[3, 1]).contents.bytes_contents.extend(items)

    parsed = parse(loop, request, TEXT)
    response = infer_response(parsed, {"n": parsed.inputs["s"]})

    assert parsed.serialized["s"] == b"".join(len(i).to_bytes(4, "little") + i for i in items)
    assert response.raw_output_contents == [parsed.serialized["s"]]


def test_zero_sized_tensors_come_in_raw_or_as_empty_typed_contents_and_go_out_empty(loop):
    raw = pb.ModelInferRequest(model_name="mlp")
    raw.inputs.add(name="x", datatype="FP32", shape=[0, 4])
    raw.inputs.add(name="mask", datatype="INT32", shape=[0, 2])
    raw.raw_input_contents.extend([b"", b""])
    typed = pb.ModelInferRequest(model_name="mlp")
    typed.inputs.add(name="x", datatype="FP32", shape=[0, 4]).contents.SetInParent()
    typed.inputs.add(name="mask", datatype="INT32", shape=[0, 2]).contents.SetInParent()

    for request in (raw, typed):
        parsed = parse(loop, request)
        assert parsed.rows == 0 and parsed.inputs["x"].shape == (0, 4) and parsed.inputs["mask"].shape == (0, 2)
    response = infer_response(parsed, {"y": np.zeros((0, 4), np.float32), "label": np.zeros((0, 1), np.int64)})
    assert [list(o.shape) for o in response.outputs] == [[0, 4], [0, 1]]
    assert response.raw_output_contents == [b"", b""]


def test_an_output_written_into_a_region_is_answered_as_triton_answers_it_no_parameters(loop):
    parsed = parse(loop, raw_request())
    written = WrittenOutput((2, 4), {"shared_memory_region": "out", "shared_memory_byte_size": 32})
    parsed.output_regions = {"y": object()}

    response = infer_response(parsed, {"y": written, "label": np.array([[3], [4]], np.int64)})

    (y, label) = response.outputs
    assert (y.name, y.datatype, list(y.shape), dict(y.parameters)) == ("y", "FP32", [2, 4], {})
    assert response.raw_output_contents[0] == b"" and len(response.raw_output_contents) == 2


@pytest.mark.parametrize("error, code", [
    (BadRequest("x"), grpc.StatusCode.INVALID_ARGUMENT), (ModelNotFound("m", None, []), grpc.StatusCode.NOT_FOUND),
    (Unavailable("x"), grpc.StatusCode.UNAVAILABLE), (Unauthorized("x"), grpc.StatusCode.UNAUTHENTICATED),
    (PayloadTooLarge(2, 1), grpc.StatusCode.RESOURCE_EXHAUSTED), (DeadlineExceeded(1.0),
                                                                 grpc.StatusCode.DEADLINE_EXCEEDED),
    (WorkerCrashed("SIGSEGV"), grpc.StatusCode.INTERNAL),
])
def test_errors_map_to_tritons_grpc_codes(error, code):
    assert grpc_code(error) == code


def test_the_grpc_port_may_not_be_the_http_port():
    settings = Settings(model_repository="/m", port=9000, grpc_port=9000)
    assert "--grpc-port 9000 is the HTTP port" in grpc_port_problem(settings)
    assert grpc_port_problem(Settings(model_repository="/m", grpc_port=0)) is None


def test_a_large_requests_raw_contents_stay_views_over_the_received_bytes(loop):
    big = np.random.default_rng(3).standard_normal((8, 4096)).astype(np.float32)  # 128 KiB
    config = ModelConfig(name="wide", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (4096,)),),
                         outputs=(TensorConfig("y", "FP32", (1,)),), dynamic_batching=DynamicBatching(), version=1,
                         model_path="/m")
    request = pb.ModelInferRequest(model_name="wide", id="big")
    request.inputs.add(name="x", datatype="FP32", shape=[8, 4096])
    request.parameters["priority"].int64_param = 0
    request.raw_input_contents.append(big.tobytes())
    request.outputs.add(name="y")
    data = request.SerializeToString()

    received = receive_infer_request(data)

    assert received.raw is not None and [bytes(v) for v in received.raw] == [big.tobytes()]
    assert received.raw[0].obj is data  # a view, not a copy
    whole = pb.ModelInferRequest()
    whole.CopyFrom(received.request)
    whole.raw_input_contents.extend(bytes(v) for v in received.raw)
    assert whole == request  # nothing else lost on the way
    doc, raw = infer_doc(received.request, received.raw)
    parsed = parse_infer_doc(config, doc, raw, capacity_bytes=1 << 24, future=loop.create_future(),
                             allow_faults=False)
    np.testing.assert_array_equal(parsed.inputs["x"], big)
    assert np.shares_memory(parsed.inputs["x"], np.frombuffer(data, np.uint8))


def test_a_small_request_is_parsed_by_protobuf_and_garbage_is_refused_by_it():
    request = raw_request()
    received = receive_infer_request(request.SerializeToString())
    assert received.raw is None and received.request == request and received.refusal is None
    for garbage in (b"\x3a\xff\xff\xff\x7f" + bytes(70_000), b"\x3a\xff\xff\xff\x7f"):  # field 7 past the end
        refused = receive_infer_request(garbage)
        assert refused.request == pb.ModelInferRequest() and refused.nbytes == len(garbage)
        assert str(refused.refusal()).startswith("the message is not a ModelInferRequest in protobuf's encoding (")


def test_typed_contents_that_cannot_fit_a_slot_are_refused_before_protobuf_parses_them():
    """16 MB of empty bytes_contents took protobuf's parse half a second of the event loop."""
    request = pb.ModelInferRequest(model_name="strings")
    request.inputs.add(name="text", datatype="BYTES", shape=[1, 100_000]).contents.bytes_contents.extend(
        [b""] * 100_000)  # 200 KB on the wire, 400 KB in a slot
    data = request.SerializeToString()
    refused = receive_infer_request(data, capacity_bytes=100_000)
    assert refused.request == pb.ModelInferRequest() and str(refused.refusal()).startswith(
        "the request's typed contents needs at least 133333 bytes of tensor space; one batch slot holds 100000")
    assert receive_infer_request(data, capacity_bytes=1 << 20).refusal is None


def test_typed_contents_are_counted_against_the_shape_and_the_slot_before_each_becomes_a_python_value():
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([0.5] * 1000)
    with pytest.raises(BadRequest, match=r"input 'x': shape \[1, 4\] needs 4 values, data has 1000"):
        infer_doc(request, capacity_bytes=1 << 20)
    with pytest.raises(PayloadTooLarge, match=r"input 'x' \(1000 values of FP32\) needs 4000 bytes"):
        infer_doc(request, capacity_bytes=1000)
