"""Triton's error phrases (gateway/core/phrases.py), checked against Triton's own test expectations verbatim.

Each expected string below is copied from triton-inference-server/server qa/ (the file named beside
it), where Triton's tests match it with assertIn, startswith or a regex; the request is the one that
test sends, to a model with the same name and shape. ringserve's own detail follows after "; ".
"""
from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator

import grpc
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.repository.batching import DynamicBatching

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import BadRequest, DeadlineExceeded, GatewayError, ModelNotFound, RequestTooLarge
from ringserve.gateway.grpc.codec import grpc_code, infer_doc
from ringserve.gateway.codec.parse import parse_infer_doc, parse_infer_request
from ringserve.gateway.core.phrases import PHRASES, say
from ringserve.gateway.core.region_errors import RegionError, RegionNotFound
from ringserve.gateway.core.region_registry import RegionRegistry


def model(name: str, inputs: list[TensorConfig], max_batch_size: int = 8, outputs: list[TensorConfig] | None = None
          ) -> ModelConfig:
    return ModelConfig(name=name, max_batch_size=max_batch_size, inputs=tuple(inputs),
                       outputs=tuple(outputs or [TensorConfig("OUTPUT0", "FP32", (16,))]),
                       dynamic_batching=DynamicBatching() if max_batch_size else None, version=1,
                       model_path=f"/models/{name}/1/model.onnx")


def refusal(config: ModelConfig, doc: dict, header_length: int | None = None, tail: bytes = b"",
            regions: RegionRegistry | None = None) -> str:
    body = orjson.dumps(doc) if header_length is None else orjson.dumps(doc) + tail
    if header_length is not None:
        header_length = len(orjson.dumps(doc))
    with pytest.raises(GatewayError) as caught:
        parse_infer_request(config, body, capacity_bytes=1 << 20, future=None, allow_faults=False,
                            header_length=header_length, regions=regions)
    return str(caught.value)


INPUTS3 = [TensorConfig(f"INPUT{i}", "FP32", (1,)) for i in range(3)]


def test_an_input_byte_size_mismatch_reads_as_in_l0_input_validation():
    config = model("pt_identity", [TensorConfig("INPUT0", "FP32", (8,))])
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 8], "parameters": {"binary_data_size": 40}}]}
    message = refusal(config, doc, header_length=0, tail=bytes(40))
    assert "input byte size mismatch for input 'INPUT0' for model 'pt_identity'. Expected 32, got 40" in message


def test_missing_required_inputs_read_as_in_l0_input_validation():
    required = model("input_all_required", INPUTS3, max_batch_size=0)
    assert ("expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], but missing "
            "required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required input(s).") in \
        refusal(required, {"inputs": []})
    given = [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [0.0]}]
    assert ("expected 3 inputs but got 1 inputs for model 'input_all_required'. Got input(s) ['INPUT0'], but missing "
            "required input(s) ['INPUT1','INPUT2']. Please provide all required input(s).") in \
        refusal(required, {"inputs": given})
    optional = model("input_optional", [*INPUTS3, TensorConfig("INPUT3", "FP32", (1,), optional=True)],
                     max_batch_size=0)
    assert ("expected number of inputs between 3 and 4 but got 1 inputs for model 'input_optional'. Got input(s) "
            "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all required input(s).") in \
        refusal(optional, {"inputs": given})


def test_an_output_named_twice_reads_as_in_l0_http_and_l0_grpc():
    config = model("simple", [TensorConfig("INPUT0", "FP32", (16,))])
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}],
           "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}
    assert "output 'OUTPUT0' already exists in request" in refusal(config, doc)


def test_a_negative_dim_reads_as_in_l0_http():
    config = model("onnx_zero_1_float32", [TensorConfig("INPUT0", "FP32", (-1,))])
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, -4], "data": []}]}
    assert ("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
            in refusal(config, doc))


def test_raw_requests_read_as_in_l0_http():
    # (one variable dim is batch 1 of it, as Triton's core prepends the batch dim: two cannot be deduced)
    two_variable = model("onnx_zero_1_float32", [TensorConfig("INPUT0", "FP32", (-1, -1))])
    with pytest.raises(BadRequest) as caught:
        parse_infer_request(two_variable, bytes(16), capacity_bytes=1 << 20, future=None, allow_faults=False,
                            header_length=0)
    assert ("The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized "
            "dimension") in str(caught.value)
    three = model("simple", INPUTS3)
    with pytest.raises(BadRequest) as caught:
        parse_infer_request(three, bytes(4), capacity_bytes=1 << 20, future=None, allow_faults=False, header_length=0)
    assert "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in" in str(caught.value)
    strings = model("simple_identity", [TensorConfig("INPUT0", "BYTES", (-1,))])
    with pytest.raises(BadRequest) as caught:
        parse_infer_request(strings, bytes(8), capacity_bytes=1 << 20, future=None, allow_faults=False,
                            header_length=0)
    assert "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]" in str(caught.value)


def test_an_unknown_model_starts_as_in_l0_infer():
    assert str(ModelNotFound("nope", None, ["mlp"])).startswith("Request for unknown model")
    assert str(ModelNotFound("nope", "3", ["mlp"])).startswith("Request for unknown model: 'nope' version 3 is not "
                                                               "found")


def test_a_body_over_the_limit_reads_as_in_l0_http():
    message = str(RequestTooLarge(1 << 21, 1 << 20))
    assert "request JSON size" in message and " exceeds the maximum allowed input size" in message


def test_the_scheduler_s_refusals_start_as_tritons():
    assert str(DeadlineExceeded(0.25)).startswith("Request timeout expired; ")


def test_an_unknown_input_a_wrong_datatype_and_a_wrong_shape_read_as_in_tritons_core():
    config = model("simple", [TensorConfig("INPUT0", "FP32", (16,))])
    assert refusal(config, {"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1], "data": [1.0]}]}) \
        .startswith("unexpected inference input 'NOPE' for model 'simple'; ")
    assert refusal(config, {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}) \
        .startswith("inference input 'INPUT0' data-type is 'INT32', but model 'simple' expects 'FP32'; ")
    assert refusal(config, {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]}) \
        .startswith("unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]; ")
    assert refusal(config, {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [9, 16],
                                        "data": [1.0] * 144}]}) \
        .startswith("inference request batch-size must be <= 8 for 'simple'; ")


def test_grpc_tensors_without_data_read_as_in_tritons_grpc_server():
    config = model("simple", [TensorConfig("INPUT0", "FP32", (16,))])
    request = pb.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    with pytest.raises(BadRequest) as caught:
        doc, reader = infer_doc(request)
        parse_infer_doc(config, doc, reader, capacity_bytes=1 << 20, future=None, allow_faults=False)
    assert str(caught.value).startswith("unable to find data for input tensor 'INPUT0' for model 'simple' in request.")
    assert grpc_code(caught.value) == grpc.StatusCode.INVALID_ARGUMENT


# -- shared memory (qa/L0_shared_memory/shared_memory_test.py) --------------------------------------
@pytest.fixture
def segment() -> Iterator[str]:
    key = f"/rs-test-phrase-{secrets.token_hex(6)}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 64)
        yield key
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + key)


def test_shared_memory_refusals_read_as_in_l0_shared_memory(segment: str):
    regions = RegionRegistry(allowed=True)  # (--allow-client-shm)
    for offset, byte_size in ((0, 65), (1, 64), (64, 1), (65, 0)):  # (test_register_out_of_bound's four, HTTP and gRPC)
        with pytest.raises(RegionError) as caught:
            regions.register("dummy_data", {"key": segment, "offset": offset, "byte_size": byte_size})
        assert re.search("failed to register shared memory region.*invalid args", str(caught.value))
    regions.register("dummy_data", {"key": segment, "byte_size": 8})
    with pytest.raises(RegionError) as caught:
        regions.register("dummy_data", {"key": segment, "byte_size": 8})
    assert "shared memory region 'dummy_data' already in manager" in str(caught.value)
    for key in ("/", "///"):
        with pytest.raises(RegionError) as caught:
            regions.register("my_test_shm_name", {"key": key, "byte_size": 8})
        assert re.search(f"cannot register shared memory region 'my_test_shm_name' - invalid shm key '{key}'",
                         str(caught.value))
    with pytest.raises(RegionNotFound) as caught:
        regions.status("input0_data")
    assert "Unable to find system shared memory region: 'input0_data'" in str(caught.value)

    config = model("simple", [TensorConfig("INPUT0", "FP32", (2,))], outputs=[TensorConfig("OUTPUT0", "FP32", (2,))])
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    for offset, says in ((8, "Invalid offset for shared memory region"),
                         (1, "Invalid offset + byte size for shared memory region")):
        doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "dummy_data",
                                                             "shared_memory_offset": offset,
                                                             "shared_memory_byte_size": 8}}]
        assert says in refusal(config, doc, regions=regions)
    # test_infer_integer_overflow (HTTP): offset 32 + byte_size 2**64 - 32 passes a size_t
    regions.register("output0_data", {"key": segment, "byte_size": 64})
    doc["outputs"][0]["parameters"].update(shared_memory_region="output0_data", shared_memory_offset=32,
                                           shared_memory_byte_size=2**64 - 32)
    assert refusal(config, doc, regions=regions).startswith(
        f"Integer overflow detected: byte_size ({2**64 - 32}) + offset (32) exceeds maximum value ({2**64 - 1}) "
        "for region 'output0_data'; ")
    # test_infer_offset_out_of_bound (HTTP): 2**64 - 32 is an offset past the end, before any sum
    doc["outputs"][0]["parameters"].update(shared_memory_offset=2**64 - 32, shared_memory_byte_size=8)
    assert "Invalid offset for shared memory region: 'output0_data'" in refusal(config, doc, regions=regions)


# -- qa/L0_http/http_test.py: test_buffer_size_overflow, test_json_recursion_depth_limit ---------------
def test_a_shape_whose_element_count_or_byte_size_overflows_reads_as_in_l0_http():
    config = model("onnx_zero_1_float32", [TensorConfig("INPUT0", "FP32", (-1,))])
    doc = {"inputs": [{"name": "INPUT0", "shape": [2**4, 2**60 + 2], "datatype": "FP32", "data": [1.0]}]}
    message = refusal(config, doc)
    assert "causes total element count to exceed maximum size of" in message
    assert message.startswith(f"invalid shape for input 'INPUT0': shape [16,{2**60 + 2}] causes total element count "
                              f"to exceed maximum size of {2**63 - 1}")
    doc["inputs"][0]["shape"] = [2**2, 2**60 + 2]
    message = refusal(config, doc)
    assert "byte size overflow for input" in message
    assert message.startswith(f"byte size overflow for input 'INPUT0': element count ({2**62 + 8}) * data type size "
                              f"(4) exceeds maximum allowed size ({2**63 - 1})")


@pytest.mark.parametrize("datatype, value", [("BYTES", "hello"), ("INT64", 123)])
def test_data_nested_100_deep_or_more_reads_as_in_l0_http(datatype: str, value: object):
    config = model("simple_identity", [TensorConfig("INPUT0", datatype, (1,))])

    def nested(depth: int) -> dict:
        data: object = value
        for _ in range(depth):
            data = [data]
        return {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 1], "data": data}]}

    for depth in (100, 120):
        assert refusal(config, nested(depth)).startswith("JSON nesting depth exceeds maximum allowed limit (100); ")
    for depth in (1, 50):  # (Triton serves these; here too, as far as the parse)
        parse_infer_request(config, orjson.dumps(nested(depth)), capacity_bytes=1 << 20, future=None,
                            allow_faults=False)


# -- qa/L0_input_validation/input_validation_test.py: test_wrong_input_shape_tensor_size -----------------
def test_bytes_elements_other_than_the_shape_s_count_read_as_in_l0_input_validation():
    """gRPC raw contents of 14 and of 18 elements for a shape [1, 16]. (Triton names INPUT1 there because its
    inputs sit in an unordered_map; ringserve names the first input of the request that is wrong.)"""
    config = model("onnx_object_int32_int32", [TensorConfig(f"INPUT{i}", "BYTES", (16,)) for i in range(2)])
    for count, says in ((14, "expected 16 string elements for inference input 'INPUT0' for model "
                              "'onnx_object_int32_int32', got 14"),
                        (18, "unexpected number of string elements 17 for inference input 'INPUT0' for model "
                              "'onnx_object_int32_int32', expecting 16")):
        request = pb.ModelInferRequest(model_name="onnx_object_int32_int32")
        for i in range(2):
            request.inputs.add(name=f"INPUT{i}", datatype="BYTES", shape=[1, 16])
            request.raw_input_contents.append(b"".join(len(s).to_bytes(4, "little") + s
                                                       for s in (str(n).encode() for n in range(count))))
        with pytest.raises(BadRequest) as caught:
            doc, reader = infer_doc(request)
            parse_infer_doc(config, doc, reader, capacity_bytes=1 << 20, future=None, allow_faults=False)
        assert says in str(caught.value)
        assert grpc_code(caught.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_every_phrase_is_filled_by_its_fields_and_detail_follows():
    assert say("queue_full") == "Exceeds maximum queue size"
    assert say("unknown_model", "models: a", model="m") == "Request for unknown model: 'm' is not found; models: a"
    for condition, template in PHRASES.items():
        fields = set(re.findall(r"{(\w+)}", template))
        assert "{" not in say(condition, **{f: "v" for f in fields}), condition
