"""Triton's generate extension, its pure parts (gateway/http/generate.py, gateway/http/streams.py): a generate
body becomes the KServe document /infer's parser reads, with Triton's reasons for a bad one; a response becomes
one flat JSON object; a request's responses become one async iterator, whichever kind of model answers."""
from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import BadRequest, StreamBroken
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.grpc.stream import empty_final, wants_empty_final
from ringserve.gateway.http.generate import infer_doc_of, match_generate_path, response_json
from ringserve.gateway.http.streams import Response, ResponseStream
from ringserve.gateway.kserve.dataplane import InferCall

LLM = ModelConfig(name="mock_llm", max_batch_size=0, version=1, model_path="/m/mock_llm/1/model.py", dynamic_batching=None,
                  inputs=(TensorConfig("PROMPT", "BYTES", (1, 1)), TensorConfig("STREAM", "BOOL", (1, 1)),
                          TensorConfig("input_ids", "INT32", (1, -1))),
                  outputs=(TensorConfig("TEXT", "BYTES", (1, -1)),))
BATCHED = ModelConfig(name="mlp", max_batch_size=8, version=1, model_path="/m/mlp/1/model.onnx",
                      dynamic_batching=DynamicBatching(),
                      inputs=(TensorConfig("x", "FP32", (4,)),), outputs=(TensorConfig("y", "FP32", (2,)),))


def refusal(config: ModelConfig, body: str) -> str:
    with pytest.raises(BadRequest) as caught:
        infer_doc_of(config, body.encode())
    return str(caught.value)


def test_the_paths_name_the_model_its_version_and_the_route():
    assert match_generate_path("/v2/models/m/generate") == ("m", None, "generate")
    assert match_generate_path("/v2/models/m/versions/2/generate_stream") == ("m", "2", "generate_stream")
    assert match_generate_path("/v2/models/m/infer") is None
    assert match_generate_path("/v2/models//generate") is None


def test_top_level_keys_and_parameters_keys_become_inputs_shaped_to_the_dims_or_parameters():
    doc = infer_doc_of(LLM, b'{"id": "42", "PROMPT": "hi", "input_ids": [1, 2, 3],'
                            b' "parameters": {"STREAM": true, "temperature": 0.5, "top_k": 3}, "REPETITION": 2}')

    assert doc["id"] == "42"
    assert {i["name"]: (i["datatype"], i["shape"], i["data"]) for i in doc["inputs"]} == {
        "PROMPT": ("BYTES", [1, 1], ["hi"]), "STREAM": ("BOOL", [1, 1], [True]), "input_ids": ("INT32", [1, 3], [1, 2, 3])}
    assert doc["parameters"] == {"temperature": 0.5, "top_k": 3, "REPETITION": 2}


def test_a_batched_model_s_input_gets_a_batch_of_one():
    assert infer_doc_of(BATCHED, b'{"x": [1, 2, 3, 4]}')["inputs"][0]["shape"] == [1, 4]
    assert "The schema can not convert input 'x' to tensor with proper shape" in refusal(BATCHED, '{"x": [1, 2, 3]}')


def test_bad_bodies_are_refused_with_triton_s_reasons_in_the_order_the_keys_come():
    assert "input 'STREAM' already exists in request" in refusal(
        LLM, '{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}')
    assert "attempt to access JSON non-string as string" in refusal(LLM, '{"PROMPT": true, "STREAM": 1}')
    assert "attempt to access JSON non-boolean as boolean" in refusal(LLM, '{"STREAM": 1, "PROMPT": true}')
    assert "attempt to access JSON non-signed-integer as signed-integer" in refusal(LLM, '{"input_ids": [1.5]}')
    assert "parameter 'PARAMS' has invalid type" in refusal(LLM, '{"PARAMS": {"a": 1}}')
    assert "Expected JSON object for keyword: 'parameters'" in refusal(LLM, '{"parameters": 1}')
    assert refusal(LLM, '{"parameters": {"nested": {"twice": 1}}}').startswith(
        "Converting keyword: 'parameters': parameter 'nested' has invalid type.")


def call_with(request: InferRequest | None) -> InferCall:
    call = InferCall(0, "rid", None, "mock_llm")
    call.request = request
    return call


def a_request(kserve_id: str | None = "7") -> InferRequest:
    return InferRequest(model=LLM, inputs={}, rows=1, shape_key=(), kserve_id=kserve_id, requested_outputs=None,
                        fault=None, future=None)  # type: ignore[arg-type]


def test_a_response_is_one_flat_object_of_outputs_and_parameters_keys_sorted():
    text = np.array([[b"hello"]], dtype=object)
    body = response_json(call_with(a_request()), LLM, Response({"TEXT": text}, {"done": True, "n": 2}, None))

    assert body == b'{"TEXT":"hello","done":true,"id":"7","model_name":"mock_llm","model_version":"1","n":2}'
    empty = response_json(call_with(a_request(None)), LLM, Response({"TEXT": np.empty((1, 0), object)}, None, None))
    assert orjson.loads(empty)["TEXT"] == [] and "id" not in orjson.loads(empty)


def collected(stream: ResponseStream) -> list[Response]:
    async def collect() -> list[Response]:
        return [response async for response in stream]

    return asyncio.get_event_loop().run_until_complete(collect())


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_the_stream_yields_each_pushed_response_then_the_request_s_failure_and_ends(loop):
    stream = ResponseStream()
    request = a_request()
    outcome = loop.create_future()
    stream.follow(outcome, call_with(request))
    request.response_parameters, request.response_final = {"i": 0}, False
    stream.push(request, {"TEXT": np.array([b"a"], object)}, None)
    outcome.set_exception(StreamBroken("mock_llm", 1, "SIGKILL"))

    got = collected(stream)

    assert [(r.parameters, r.streamed, r.error is None) for r in got] == [({"i": 0}, True, True), (None, False, False)]


def test_a_model_that_answers_once_is_a_stream_of_one_final_response(loop):
    stream = ResponseStream()
    request = a_request()
    request.response_parameters = {"p": 1.5}
    outcome = loop.create_future()
    stream.follow(outcome, call_with(request))
    loop.call_later(0.01, outcome.set_result, {"TEXT": np.array([b"x"], object)})

    got = collected(stream)

    assert len(got) == 1 and got[0].final and got[0].parameters == {"p": 1.5} and got[0].streamed


def test_a_grpc_request_asks_for_empty_final_responses_with_a_bool_only():
    request = pb.ModelInferRequest(model_name="tokens", id="9")
    assert not wants_empty_final(request)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    assert wants_empty_final(request)
    request.parameters["triton_enable_empty_final_response"].string_param = "true"
    with pytest.raises(BadRequest, match="invalid value type for 'triton_enable_empty_final_response' parameter"):
        wants_empty_final(request)
    final = empty_final(request).infer_response
    assert (final.id, final.model_name, list(final.outputs)) == ("9", "tokens", [])
    assert final.parameters["triton_final_response"].bool_param
