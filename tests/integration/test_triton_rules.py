"""Triton's client-facing rules on the real stack, with Triton's own clients where they apply.

- optional inputs (`optional: true`): a request may leave one out, and ONNX Runtime uses the graph's
  initializer for it, as Triton's ONNX Runtime backend does; requests with and without it, queued
  together, are each answered with their own result; a batching model that marks one optional
  fails to load, as in Triton;
- the classification extension: `parameters.classification` (HTTP JSON and binary) and
  `class_count` (gRPC) answer BYTES "value:index[:label]" top-k per row, as Triton writes them;
- a body with both Transfer-Encoding and Content-Length gets a JSON 400 naming the rule;
- a model whose name starts with dots is served as any other;
- `/v2` and gRPC's ServerMetadata list exactly the extensions served: each is probed here.
Every number is computed here: by ONNX Runtime on the same file, or by Triton's rule from the values.
"""
from __future__ import annotations

import concurrent.futures
import json
import socket
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from ringserve.gateway.kserve.dataplane import EXTENSIONS
from tests.support import rawhttp
from tests.support.sequence_models import build_accumulator
from tests.support.stack import Stack, free_port, running_stack
from tests.support.triton_rule_models import BIAS, CLASSES, DOT_MODEL, LABELS, WIDTH, build_rules_repo, triton_classes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_rules_repo(tmp_path_factory.mktemp("rules-models"))
    build_accumulator(path)  # (the sequence extension's probe)
    return path


@pytest.fixture(scope="module")
def stack(repo: Path):
    with running_stack(repo, "--grpc-port", str(free_port())) as s:
        yield s


def grpc_port(stack: Stack) -> int:
    return int(stack.args[stack.args.index("--grpc-port") + 1])


def opt_input(name: str, values: np.ndarray) -> dict:
    return {"name": name, "datatype": "FP32", "shape": [WIDTH], "data": values.tolist()}


def run_in_this_process(repo: Path, model: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


# -- optional inputs -------------------------------------------------------------------------------
def test_an_optional_input_may_be_left_out_and_the_graphs_value_is_used(stack: Stack, repo: Path):
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    bias = np.array([-1.0, 0.5, 0.25, 8.0], np.float32)
    expected_without = run_in_this_process(repo, "opt", {"x": x})
    expected_with = run_in_this_process(repo, "opt", {"x": x, "bias": bias})
    np.testing.assert_allclose(expected_without, x + BIAS)  # (ONNX Runtime itself uses the initializer)

    status, doc = stack.post("/v2/models/opt/infer", {"inputs": [opt_input("x", x)]})
    assert status == 200, doc
    np.testing.assert_allclose(doc["outputs"][0]["data"], expected_without, rtol=1e-6)
    status, doc = stack.post("/v2/models/opt/infer", {"inputs": [opt_input("x", x), opt_input("bias", bias)]})
    assert status == 200, doc
    np.testing.assert_allclose(doc["outputs"][0]["data"], expected_with, rtol=1e-6)

    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        tensor = grpcclient.InferInput("x", [WIDTH], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("opt", [tensor]).as_numpy("y"), expected_without, rtol=1e-6)


def test_requests_with_and_without_an_optional_input_queued_together_each_get_their_own_answer(stack: Stack,
                                                                                                repo: Path):
    xs = [np.full(WIDTH, float(i), np.float32) for i in range(8)]
    biases = [None if i % 2 else np.full(WIDTH, -float(i), np.float32) for i in range(8)]
    docs = [{"inputs": [opt_input("x", x)] + ([] if b is None else [opt_input("bias", b)])} for x, b in zip(xs, biases)]

    def send_all() -> list[tuple[int, dict]]:
        with concurrent.futures.ThreadPoolExecutor(len(docs)) as pool:
            return list(pool.map(lambda doc: stack.post("/v2/models/opt/infer", doc), docs))

    answers = stack.send_while_stopped(send_all, until=lambda s: s["models"]["opt"]["queue_depth"] >= 4)
    for (status, doc), x, b in zip(answers, xs, biases):
        assert status == 200, doc
        feeds = {"x": x} if b is None else {"x": x, "bias": b}
        np.testing.assert_allclose(doc["outputs"][0]["data"], run_in_this_process(repo, "opt", feeds), rtol=1e-6)


def test_a_missing_required_input_is_refused_in_tritons_words(stack: Stack):
    status, doc = stack.post("/v2/models/opt/infer", {"inputs": [opt_input("bias", BIAS)]})
    assert status == 400
    assert doc["error"].startswith(
        "expected number of inputs between 1 and 2 but got 1 inputs for model 'opt'. Got input(s) ['bias'], but "
        "missing required input(s) ['x']. Please provide all required input(s).")


def test_a_batching_model_with_an_optional_input_fails_to_load_as_in_triton(stack: Stack):
    status, doc = stack.post("/v2/models/opt_batched/infer", {"inputs": [opt_input("x", BIAS)]})
    assert status == 503 and "optional input 'bias' is not supported for models that support batching" in doc["error"]
    index = {e["name"]: e for e in stack.post("/v2/repository/index", {})[1]}
    assert index["opt_batched"]["state"] == "UNAVAILABLE" and index["opt"]["state"] == "READY"


# -- classification --------------------------------------------------------------------------------
ROWS = np.array([[0.1, 0.7, 0.05, 0.7, 0.0, 0.15],   # a tie: index 1 before 3
                 [3.0, -1.0, 9.5, 2.25, 9.5, 0.0]], np.float32)


def test_http_classification_answers_tritons_top_k_strings_json_and_binary(stack: Stack):
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        tensor = httpclient.InferInput("x", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        for binary in (False, True):
            outputs = [httpclient.InferRequestedOutput("y", binary_data=binary, class_count=3),
                       httpclient.InferRequestedOutput("yi", binary_data=binary, class_count=10)]
            result = client.infer("cls", [tensor], outputs=outputs)
            assert result.get_output("y")["datatype"] == "BYTES" and result.get_output("y")["shape"] == [2, 3]
            assert result.as_numpy("y").astype(str).tolist() == triton_classes(ROWS, 3, LABELS)
            ints = ROWS.astype(np.int32)
            assert result.get_output("yi")["shape"] == [2, CLASSES]  # k is cut to the row's elements
            assert result.as_numpy("yi").astype(str).tolist() == triton_classes(ints, CLASSES, [], "%d")
    # Verbatim, for one row: std::to_string's six decimals, the label, none for an empty label line.
    status, doc = stack.post("/v2/models/cls/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6],
                                                                  "data": ROWS[:1].tolist()}],
                                                      "outputs": [{"name": "y", "parameters": {"classification": 4}}]})
    assert status == 200, doc
    assert doc["outputs"] == [{"name": "y", "datatype": "BYTES", "shape": [1, 4],
                               "data": ["0.700000:1:dog", "0.700000:3:bird\r", "0.150000:5", "0.100000:0:cat"]}]


def test_grpc_class_count_answers_the_same_strings(stack: Stack):
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        tensor = grpcclient.InferInput("x", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        result = client.infer("cls", [tensor], outputs=[grpcclient.InferRequestedOutput("y", class_count=2)])
        output = result.get_output("y")
        assert (output.datatype, list(output.shape)) == ("BYTES", [2, 2])
        assert result.as_numpy("y").astype(str).tolist() == triton_classes(ROWS, 2, LABELS)
        assert client.get_model_config("cls").config.output[0].label_filename == "labels.txt"
        assert [i.optional for i in client.get_model_config("opt").config.input] == [False, True]


def test_classification_of_an_output_in_shared_memory_is_refused_as_triton_does(stack: Stack):
    status, doc = stack.post("/v2/models/cls/infer", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6], "data": ROWS[:1].tolist()}],
        "outputs": [{"name": "y", "parameters": {"classification": 2, "shared_memory_region": "r",
                                                 "shared_memory_byte_size": 24}}]})
    assert status == 400 and doc["error"].startswith("Output can't set both 'shared_memory_region' and "
                                                     "'classification'")


# -- the extensions /v2 lists -----------------------------------------------------------------------
TRITON_EXTENSIONS = (  # every name Triton lists (core src/server.cc), in its order
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "trace", "logging")
CLS_BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6], "data": ROWS[:1].tolist()}]}


def serves_classification(stack: Stack) -> bool:
    status, doc = stack.post("/v2/models/cls/infer", {**CLS_BODY, "outputs": [{"name": "y", "parameters": {
        "classification": 1}}]})
    return status == 200 and doc["outputs"][0]["data"] == ["0.700000:1:dog"]


def serves_sequence(stack: Stack) -> bool:
    def step(value: float, **flags: bool) -> float:
        status, doc = stack.post("/v2/models/accumulator/infer", {
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
            "parameters": {"sequence_id": 4242, **flags}})
        assert status == 200, doc
        return next(o["data"][0] for o in doc["outputs"] if o["name"] == "OUTPUT")

    return [step(1.0, sequence_start=True), step(2.0), step(4.0, sequence_end=True)] == [1.0, 3.0, 7.0]


def serves_model_repository(stack: Stack) -> bool:
    index = stack.post("/v2/repository/index", {})
    return index[0] == 200 and "cls" in {m["name"] for m in index[1]} and \
        stack.post("/v2/repository/models/cls/load", {})[0] == 200


def serves_schedule_policy(stack: Stack) -> bool:
    served = stack.post("/v2/models/cls/infer", {**CLS_BODY, "parameters": {"priority": 0, "timeout": 10**7}})
    refused = stack.post("/v2/models/cls/infer", {**CLS_BODY, "parameters": {"priority": 2}})  # (cls: no levels)
    return served[0] == 200 and refused[0] == 400 and "priority 2 is out of range" in refused[1]["error"]


def serves_model_configuration(stack: Stack) -> bool:
    status, config = stack.get("/v2/models/cls/config")
    return status == 200 and config["name"] == "cls" and config["max_batch_size"] == 8


def serves_system_shared_memory(stack: Stack) -> bool:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        grpc_status = client.get_system_shared_memory_status()
    return stack.get("/v2/systemsharedmemory/status") == (200, []) and list(grpc_status.regions) == []


def serves_binary_tensor_data(stack: Stack) -> bool:
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6],
                                     "parameters": {"binary_data_size": 24}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    answer = requests.post(f"{stack.url}/v2/models/cls/infer", data=header + ROWS[:1].tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    size = int(answer.headers.get("Inference-Header-Content-Length", 0))
    return answer.status_code == 200 and answer.content[size:] == ROWS[:1].tobytes()


def serves_statistics(stack: Stack) -> bool:
    status, doc = stack.get("/v2/models/cls/stats")
    return status == 200 and doc["model_stats"][0]["name"] == "cls" and stack.get("/v2/models/stats")[0] == 200


def serves_trace(stack: Stack) -> bool:
    status, doc = stack.post("/v2/models/cls/trace/setting", {"trace_rate": "1"})
    return status == 200 and doc["trace_mode"] == "opentelemetry" and stack.get("/v2/trace/setting")[0] == 200


def serves_logging(stack: Stack) -> bool:
    status, doc = stack.post("/v2/logging", {"log_error": True})
    return status == 200 and doc["log_error"] is True and "log_verbose_level" in stack.get("/v2/logging")[1]


EXTENSION_PROBES = {  # a listed extension, and a request that only a server serving it answers so
    "classification": serves_classification,
    "sequence": serves_sequence,
    "model_repository": serves_model_repository,
    "schedule_policy": serves_schedule_policy,
    "model_configuration": serves_model_configuration,
    "system_shared_memory": serves_system_shared_memory,
    "binary_tensor_data": serves_binary_tensor_data,
    "statistics": serves_statistics,
    "trace": serves_trace,
    "logging": serves_logging,
}


def test_v2_and_grpc_server_metadata_list_exactly_the_extensions_served(stack: Stack):
    """classification was served but not listed. Every listed extension has a probe here and passes it."""
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        grpc_listed = list(client.get_server_metadata().extensions)
    http_listed = stack.get("/v2")[1]["extensions"]
    assert http_listed == grpc_listed == list(EXTENSIONS)
    assert "classification" in http_listed and len(set(http_listed)) == len(http_listed)
    assert [name for name in TRITON_EXTENSIONS if name in http_listed] == http_listed  # Triton's names and order
    assert set(http_listed) == set(EXTENSION_PROBES), "a listed extension without a probe, or a probe not listed"
    assert [name for name, serves in EXTENSION_PROBES.items() if not serves(stack)] == []


# -- the HTTP request line and model names ---------------------------------------------------------
def test_a_body_with_both_transfer_encoding_and_content_length_gets_a_json_400_naming_the_rule(stack: Stack):
    body = json.dumps({"inputs": [opt_input("x", BIAS)]}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    raw = rawhttp.request(stack.port, "POST", "/v2/models/opt/infer", chunked,
                          {"Content-Length": str(len(chunked)), "Transfer-Encoding": "chunked"})
    assert raw.status == 400 and raw.headers["content-type"] == "application/json", raw
    error = raw.json()["error"]
    assert "Transfer-Encoding" in error and "Content-Length" in error and "RFC 9112" in error
    assert raw.headers.get("connection") == "close"

    # What Python's requests sends for a generator body given a Content-Length of its own.
    answer = requests.post(f"{stack.url}/v2/models/opt/infer", data=iter([body]),
                           headers={"Content-Length": str(len(body)), "Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 400 and "Transfer-Encoding" in answer.json()["error"]

    status, doc = stack.post("/v2/models/opt/infer", {"inputs": [opt_input("x", BIAS)]})  # still serving
    assert status == 200, doc


def test_a_broken_chunk_gets_a_json_400_and_the_server_serves_on(stack: Stack):
    with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/opt/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"zz\r\n{}\r\n0\r\n\r\n")
        data = rawhttp._read_response(sock)
    response = rawhttp._parse(data)
    assert response.status == 400 and "invalid HTTP request" in response.json()["error"]
    assert stack.post("/v2/models/opt/infer", {"inputs": [opt_input("x", BIAS)]})[0] == 200


def test_a_model_whose_name_starts_with_dots_is_served(stack: Stack):
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get(f"/v2/models/{DOT_MODEL}").json()["name"] == DOT_MODEL
        assert http.get(f"/v2/models/{DOT_MODEL}/ready").status_code == 200
        answer = http.post(f"/v2/models/{DOT_MODEL}/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]})
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [5.0], answer.text  # 4 + version 1
        index = {e["name"]: e for e in http.post("/v2/repository/index", json={}).json()}
        assert index[DOT_MODEL]["state"] == "READY"
        assert http.post(f"/v2/repository/models/{DOT_MODEL}/load", json={}).status_code == 200
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        assert client.is_model_ready(DOT_MODEL)


# -- Triton's words (qa/ expectations), over HTTP and gRPC alike ---------------------------------------
def test_tritons_phrases_come_first_over_http_and_grpc(stack: Stack):
    status, doc = stack.post("/v2/repository/index", {"ready": "yes"})  # qa/L0_http/http_test.py
    assert status == 400 and doc["error"].startswith("Invalid value for 'ready': expected a boolean")

    assert stack.post(f"/v2/repository/models/{DOT_MODEL}/unload", {})[0] == 200  # qa/L0_lifecycle
    status, doc = stack.post(f"/v2/models/{DOT_MODEL}/infer", {"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]})
    assert status == 503 and doc["error"].startswith(f"Request for unknown model: '{DOT_MODEL}' has no available "
                                                     "versions")
    assert stack.post(f"/v2/repository/models/{DOT_MODEL}/load", {})[0] == 200

    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(stack)}") as client:
        tensor = grpcclient.InferInput("x", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        with pytest.raises(grpcclient.InferenceServerException) as unknown:  # qa/L0_infer/infer_test.py
            client.infer("nope", [tensor])
        assert unknown.value.message().startswith("Request for unknown model")
        twice = [grpcclient.InferRequestedOutput("y"), grpcclient.InferRequestedOutput("y")]
        with pytest.raises(grpcclient.InferenceServerException) as refused:  # qa/L0_grpc/python_unit_test.py
            client.infer("cls", [tensor], outputs=twice)
        assert "output 'y' already exists in request" in refused.value.message()
        with pytest.raises(grpcclient.InferenceServerException) as empty:  # qa/L0_input_validation
            client.load_model(" ")
        assert "Model name cannot be empty. Please enter a valid name to deploy." in empty.value.message()


def test_tritons_words_for_overflowing_shapes_and_deep_json_over_http(stack: Stack):
    """qa/L0_http/http_test.py: test_buffer_size_overflow, test_json_recursion_depth_limit,
    test_repository_index_deeply_nested_json (the same requests, here to `cls`: x FP32 [-1,6])."""
    for shape, says in (([2**4, 2**60 + 2], "causes total element count to exceed maximum size of"),
                        ([2**2, 2**60 + 2], "byte size overflow for input")):
        status, doc = stack.post("/v2/models/cls/infer", {"inputs": [
            {"name": "x", "shape": shape, "datatype": "FP32", "data": [1.0]}]})
        assert status == 400 and says in doc["error"], doc
    for depth, served in ((120, False), (50, True)):
        data: object = 1.0
        for _ in range(depth):
            data = [data]
        status, doc = stack.post("/v2/models/cls/infer", {"inputs": [
            {"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [data] * 6}]})
        if served:
            assert status == 200, doc  # (as Triton: the six values, however nested)
        else:
            assert status == 400 and "JSON nesting depth exceeds maximum allowed limit (100)" in doc["error"]
    nested = b'{"ready":' + b"[" * 250000 + b"true" + b"]" * 250000 + b"}"
    status, doc = stack.post("/v2/repository/index", nested)
    assert status == 400 and "Invalid value for 'ready': expected a boolean" in doc["error"]
    assert stack.get("/v2/health/live")[0] == 200
