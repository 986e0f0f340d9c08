"""The streaming front doors: Triton's generate extension read as `curl -N` reads it, gRPC streams that say
when each request ends (triton_final_response), and the parameters a model sets on its responses, with their
types, over HTTP JSON, HTTP binary and gRPC. Triton's own generate-endpoint QA runs in test_triton_generate_qa.py."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.sse import post_events
from tests.support.stack import Stack, free_port, running_stack
from tests.support.stream_models import LABELS, build_asker, build_labelled, build_tokens

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("streams")
    build_tokens(repo)
    build_labelled(repo)
    build_asker(repo)
    with running_stack(repo, "--grpc-port", str(free_port())) as stack:
        stack.grpc_port = int(stack.args[stack.args.index("--grpc-port") + 1])
        yield stack


def test_generate_stream_sends_each_event_as_the_model_sends_it(stack: Stack) -> None:
    status, headers, events = post_events(stack.port, "/v2/models/tokens/generate_stream",
                                          {"N": 3, "parameters": {"delay_s": 0.4}})

    assert status == 200 and headers["content-type"] == "text/event-stream; charset=utf-8"
    assert [e["TEXT"] for _, e in events] == ["tok0", "tok1", "tok2"]
    # The model sleeps 0.4 s between sends: the first event was read ~0.8 s before the last was made.
    assert events[-1][0] - events[0][0] > 0.6
    assert events[1][0] - events[0][0] > 0.3


def test_generate_answers_one_json_object_with_outputs_and_response_parameters(stack: Stack) -> None:
    status, _, events = post_events(stack.port, "/v2/models/labelled/generate", {"X": [2.5], "id": "7"})

    assert status == 200
    assert events[0][1] == {"id": "7", "model_name": "labelled", "model_version": "1", "Y": 2.5, **LABELS}


def test_generate_refuses_a_model_that_answers_several_times_and_a_bad_body_with_triton_s_reasons(stack: Stack) -> None:
    status, _, events = post_events(stack.port, "/v2/models/tokens/generate", {"N": 2})
    assert status == 500 and "generate expects model to produce exactly 1 response" in events[0][1]["error"]

    status, headers, events = post_events(stack.port, "/v2/models/tokens/generate_stream", {"N": "two"})
    assert status == 400 and headers["content-type"] == "application/json"
    assert "attempt to access JSON non-signed-integer as signed-integer" in events[0][1]["error"]

    status, _, events = post_events(stack.port, "/v2/models/tokens/generate_stream", {"N": 1, "parameters": [1]})
    assert status == 400 and "Expected JSON object for keyword: 'parameters'" in events[0][1]["error"]


def test_http_infer_refuses_a_decoupled_model_in_triton_s_words(stack: Stack) -> None:
    status, doc = stack.post("/v2/models/tokens/infer",
                             {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [1]}]})

    assert status == 501  # Triton's UNSUPPORTED (http_server.cc: CheckTransactionPolicy, HttpCodeFromError)
    assert doc["error"].startswith("HTTP end point doesn't support models with decoupled transaction policy")


def test_response_parameters_reach_http_json_http_binary_and_grpc_with_their_types(stack: Stack) -> None:
    status, doc = stack.post("/v2/models/labelled/infer",
                             {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})
    assert status == 200 and doc["parameters"] == LABELS

    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], np.float32), binary_data=True)
        result = client.infer("labelled", [x], outputs=[httpclient.InferRequestedOutput("Y", binary_data=True)])
        assert result.get_response()["parameters"] == LABELS
        assert result.as_numpy("Y").tolist() == [[1.0]]

    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], np.float32))
        params = client.infer("labelled", [x]).get_response().parameters
    assert (params["flag"].bool_param, params["count"].int64_param) == (True, 3)
    assert (params["name"].string_param, params["ratio"].double_param) == ("ok", 0.25)
    assert {k: params[k].WhichOneof("parameter_choice") for k in LABELS} == {
        "flag": "bool_param", "count": "int64_param", "name": "string_param", "ratio": "double_param"}


def grpc_stream(stack: Stack, requests: list[tuple[str, int, dict]], empty_final: bool) -> dict[str, list]:
    """Each request (model, N, parameters) on one stream; its responses by request id, read until every request
    had a response whose triton_final_response is true (a client that waits for nothing else)."""
    answers: queue.Queue = queue.Queue()
    got: dict[str, list] = {str(i): [] for i in range(len(requests))}
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i, (model, n, params) in enumerate(requests):
            name, datatype = ("N", "INT32") if model == "tokens" else ("X", "FP32")
            tensor = grpcclient.InferInput(name, [1] if model == "tokens" else [1, 1], datatype)
            tensor.set_data_from_numpy(np.array([n], np.int32) if model == "tokens" else np.array([[n]], np.float32))
            client.async_stream_infer(model, [tensor], request_id=str(i), parameters=params,
                                      enable_empty_final_response=empty_final)
        open_ids = set(got)
        while open_ids:
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            got[response.id].append(response)
            if response.parameters["triton_final_response"].bool_param:
                open_ids.discard(response.id)
        client.stop_stream()
    return got


def test_a_grpc_stream_with_empty_final_responses_ends_each_request_on_its_final_flag(stack: Stack) -> None:
    got = grpc_stream(stack, [("tokens", 3, {}), ("tokens", 2, {"final_with_last": True}), ("labelled", 4, {})],
                      empty_final=True)

    flags = {rid: [r.parameters["triton_final_response"].bool_param for r in responses]
             for rid, responses in got.items()}
    # The final flag came alone: an empty response carries it. With the last response: no empty one follows.
    assert flags == {"0": [False, False, False, True], "1": [False, True], "2": [True]}
    assert len(got["0"][3].outputs) == 0 and got["0"][3].model_name == "tokens"
    assert got["0"][0].parameters["index"].int64_param == 0 and got["0"][2].parameters["last"].bool_param
    # triton_enable_empty_final_response is the stream's, never the model's (Triton's InferGRPCToInput)
    assert [got[rid][0].parameters["asked"].string_param for rid in "01"] == ["", "final_with_last"]


def test_a_grpc_stream_without_empty_final_responses_still_flags_each_response(stack: Stack) -> None:
    got = grpc_stream(stack, [("tokens", 2, {"final_with_last": True}), ("labelled", 1, {})], empty_final=False)

    assert [r.parameters["triton_final_response"].bool_param for r in got["0"]] == [False, True]
    assert [r.parameters["triton_final_response"].bool_param for r in got["1"]] == [True]


def asked_parameters(stack: Stack) -> dict:
    status, doc = stack.post("/v2/models/asker/infer",
                             {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    assert status == 200, doc
    return json.loads(doc["outputs"][0]["data"][0])


def test_a_bls_caller_in_another_lane_reads_the_called_model_s_response_parameters(stack: Stack) -> None:
    assert stack.lane("asker") != stack.lane("labelled")  # (through the gateway: worker/calls.py)
    assert asked_parameters(stack) == LABELS


def test_a_bls_caller_in_the_same_worker_reads_them_too(tmp_path) -> None:
    build_labelled(tmp_path)
    build_asker(tmp_path)
    with running_stack(tmp_path, "--lanes", "shared") as shared:  # (in the worker: worker/bls.py's fast path)
        assert asked_parameters(shared) == LABELS
