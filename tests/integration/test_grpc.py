"""KServe v2 gRPC with the official Triton client (`tritonclient.grpc`), unchanged, against the real stack.

Results are compared with the same ONNX model run by onnxruntime in this process; errors with
the message HTTP gives for the same request. Typed `contents` go through the raw stub
(tritonclient always sends raw_input_contents).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import queue
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
import tritonclient.grpc as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from google.protobuf import text_format
from onnx import helper
from tritonclient.utils import InferenceServerException

from ringserve.common.repository.demo import DEMO_IR_VERSION, DEMO_OPSET

from tests.support.pbtxt_models import BATCHING_PBTXT, build_twice
from tests.support.protocol_models import ALLTYPES_WIDTH, FIXED_TYPES, alltypes_inputs, build_protocol_repo
from tests.support.stack import Stack, free_port, held_requests, poll_for, running_stack

pytestmark = pytest.mark.integration

# The typed contents field of each datatype (FP16 has none: it goes raw).
TYPED = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
         "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
         "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The protocol repository, and `typed`: alltypes without FP16 (which has no typed contents field)."""
    repo = build_protocol_repo(tmp_path_factory.mktemp("grpc-models"))
    nodes, inputs, outputs, config_in, config_out = [], [], [], [], []
    for kserve in TYPED:
        name, elem = kserve.lower(), FIXED_TYPES[kserve]
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]))
        inputs.append(helper.make_tensor_value_info(f"in_{name}", elem, ["batch", ALLTYPES_WIDTH]))
        outputs.append(helper.make_tensor_value_info(f"out_{name}", elem, ["batch", ALLTYPES_WIDTH]))
        config_in.append({"name": f"in_{name}", "data_type": f"TYPE_{kserve}", "dims": [ALLTYPES_WIDTH]})
        config_out.append({"name": f"out_{name}", "data_type": f"TYPE_{kserve}", "dims": [ALLTYPES_WIDTH]})
    model = helper.make_model(helper.make_graph(nodes, "typed", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    (repo / "typed" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "typed" / "1" / "model.onnx"))
    (repo / "typed" / "config.json").write_text(json.dumps(
        {"name": "typed", "max_batch_size": 8, "input": config_in, "output": config_out, "dynamic_batching": {}}))
    build_twice(repo, BATCHING_PBTXT)  # a config.pbtxt in the style of Triton's own examples
    return repo


@pytest.fixture(scope="module", params=["core", "aio"])
def grpc_stack(repo: Path, request: pytest.FixtureRequest):
    """Each test on both engines (--grpc-engine): the fast path, and grpc.aio that serves when it cannot."""
    # Client shared memory on (off by default): the shared-memory tests register regions.
    with running_stack(repo, "--grpc-port", str(free_port()), "--allow-client-shm",
                       "--grpc-engine", request.param) as s:
        s.grpc_port = int(s.args[s.args.index("--grpc-port") + 1])
        yield s


@pytest.fixture(scope="module")
def client(grpc_stack: Stack):
    c = triton.InferenceServerClient(f"127.0.0.1:{grpc_stack.grpc_port}")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def stub(grpc_stack: Stack):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_stack.grpc_port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def run_alone(repo: Path, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def infer_input(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def http_error(stack: Stack, path: str, doc: dict) -> tuple[int, str]:
    status, body = stack.post(path, doc)
    return status, body["error"]


# -- health, metadata, config ---------------------------------------------------------------------------------
def test_grpcs_threads_give_way_to_the_gateways_loop(client, grpc_stack: Stack):
    """grpcio's threads and the poller run under SCHED_BATCH (they never preempt the loop thread on waking:
    gateway/grpc/scheduling.py); the loop thread keeps the default policy."""
    assert client.is_server_live()
    gateway = grpc_stack.status()["gateways"][0]["pid"]
    policies: dict[str, set[int]] = {}
    for tid in os.listdir(f"/proc/{gateway}/task"):
        name = Path(f"/proc/{gateway}/task/{tid}/comm").read_text().strip()
        stat = Path(f"/proc/{gateway}/task/{tid}/stat").read_text()
        policies.setdefault("loop" if int(tid) == gateway else name, set()).add(
            int(stat[stat.rindex(")") + 2:].split()[38]))  # field 41, policy (proc(5))
    assert policies["loop"] == {os.SCHED_OTHER}
    assert policies["event_engine"] == {os.SCHED_BATCH}
    # The poller is a Python thread, named "python" by the OS before 3.14 ("grpc-poller" after).
    assert os.SCHED_BATCH in policies.get("grpc-poller", policies["python"])


def test_health_metadata_and_config_are_those_of_http(client, grpc_stack: Stack):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert client.get_server_metadata(as_json=True) == grpc_stack.get("/v2")[1]
    for model in ("mlp", "encoder", "strings"):
        meta = client.get_model_metadata(model, as_json=True)
        http = grpc_stack.get(f"/v2/models/{model}")[1]
        assert meta["name"] == http["name"] and meta["versions"] == http["versions"]
        assert meta["platform"] == http["platform"]
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
            (t["name"], t["datatype"], t["shape"]) for t in http["inputs"]]
    config = client.get_model_config("auto", as_json=True)["config"]  # auto-completed from the ONNX graph
    assert config["max_batch_size"] == 64
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["512"]}]  # (int64 as JSON strings)
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": ["10"]}]


def test_an_unknown_model_is_not_found_with_the_http_message(client, grpc_stack: Stack):
    status, message = http_error(grpc_stack, "/v2/models/nope/infer", {"inputs": []})
    assert status == 404
    x = np.zeros((1, 512), np.float32)
    for call in (lambda: client.infer("nope", [infer_input("x", x, "FP32")]),
                 lambda: client.get_model_metadata("nope"), lambda: client.get_model_config("nope")):
        error = grpc_error(call)
        assert error.status() == "StatusCode.NOT_FOUND" and error.message() == message


def test_every_models_config_comes_back_and_a_config_pbtxt_as_triton_reads_it(client):
    for model in ("mlp", "encoder", "strings", "alltypes", "typed", "auto", "twice"):
        assert client.get_model_config(model).config.name == model
    triton_reads = text_format.Parse(BATCHING_PBTXT, model_config_pb2.ModelConfig())
    served = client.get_model_config("twice").config
    assert served.dynamic_batching == triton_reads.dynamic_batching
    assert (served.max_batch_size, list(served.input), list(served.output)) == (
        triton_reads.max_batch_size, list(triton_reads.input), list(triton_reads.output))


# -- inference ------------------------------------------------------------------------------------------------
def test_raw_contents_infer_equals_the_model_run_alone_and_echoes_the_id(client, repo):
    x = np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)

    result = client.infer("mlp", [infer_input("x", x, "FP32")], request_id="r-7")

    np.testing.assert_allclose(result.as_numpy("y"), run_alone(repo, "mlp", {"x": x})["y"], rtol=0, atol=1e-5)
    response = result.get_response()
    assert response.id == "r-7" and response.model_name == "mlp" and response.model_version == "1"


def test_a_large_request_whose_raw_contents_are_not_copied_out_of_the_message_is_answered_exactly(client, repo):
    x = np.random.default_rng(6).standard_normal((64, 512)).astype(np.float32)  # 128 KiB: the view path
    expected = run_alone(repo, "mlp", {"x": x})["y"]

    np.testing.assert_allclose(client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("y"), expected, atol=1e-5)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id="big")
        result, error = answers.get(timeout=60)
    finally:
        client.stop_stream()
    assert error is None and result.get_response().id == "big"
    np.testing.assert_allclose(result.as_numpy("y"), expected, atol=1e-5)


def test_every_fixed_size_datatype_goes_raw_bit_exact(client, repo):
    arrays = alltypes_inputs(rows=3)
    inputs = [infer_input(name, array, name[3:].upper()) for name, array in arrays.items()]

    result = client.infer("alltypes", inputs)

    expected = run_alone(repo, "alltypes", arrays)
    assert len(expected) == len(FIXED_TYPES)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_every_typed_contents_field_is_read_bit_exact(stub, repo):
    arrays = {name: array for name, array in alltypes_inputs(rows=2, seed=9).items() if name != "in_fp16"}
    request = pb.ModelInferRequest(model_name="typed", id="typed")
    for name, array in arrays.items():
        datatype = name[3:].upper()
        tensor = request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        getattr(tensor.contents, TYPED[datatype]).extend(array.ravel().tolist())

    answer = stub.ModelInfer(request, timeout=30)

    expected = run_alone(repo, "typed", arrays)
    assert answer.id == "typed" and len(answer.outputs) == len(expected) == len(TYPED)
    for output, raw in zip(answer.outputs, answer.raw_output_contents):
        assert output.datatype == output.name[4:].upper() and raw == expected[output.name].tobytes(), output.name


def test_typed_contents_infer_equals_the_model_run_alone(stub, repo):
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    request = pb.ModelInferRequest(model_name="mlp", id="t1")
    request.inputs.add(name="x", datatype="FP32", shape=[3, 512]).contents.fp32_contents.extend(x.ravel().tolist())

    answer = stub.ModelInfer(request, timeout=30)

    assert answer.id == "t1" and [o.name for o in answer.outputs] == ["y"] and list(answer.outputs[0].shape) == [3, 10]
    y = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(3, 10)
    np.testing.assert_allclose(y, run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)


@pytest.mark.parametrize("typed", [False, True])
def test_bytes_tensors_raw_and_typed_equal_the_model_run_alone(client, stub, repo, typed):
    text = np.array([["a", "zwölf"], ["", "日本"]], dtype=np.object_)
    encoded = np.vectorize(str.encode, otypes=[object])(text)
    expected = run_alone(repo, "strings", {"text": text})["echo"]
    if typed:
        request = pb.ModelInferRequest(model_name="strings")
        request.inputs.add(name="text", datatype="BYTES", shape=[2, 2]).contents.bytes_contents.extend(
            encoded.ravel().tolist())
        answer = stub.ModelInfer(request, timeout=30)
        result = triton.InferResult(answer)
    else:
        result = client.infer("strings", [infer_input("text", encoded, "BYTES")])
    got = [[item.decode() for item in row] for row in result.as_numpy("echo")]
    assert got == expected.tolist()


def test_typed_int8_values_out_of_range_are_refused_as_over_http(stub, grpc_stack: Stack):
    request = pb.ModelInferRequest(model_name="alltypes")
    arrays = alltypes_inputs(rows=1)
    for name, array in arrays.items():
        datatype = name[3:].upper()
        if datatype == "FP16":
            continue
        values = array.ravel().tolist()
        if name == "in_int8":
            values = [300, 0, 0]
        getattr(request.inputs.add(name=name, datatype=datatype, shape=array.shape).contents,
                TYPED[datatype]).extend(values)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'in_int8': data is not a INT8 tensor (values must lie within -128..127)" in info.value.details()


def test_requested_output_subset_comes_back_alone_in_the_order_asked(client, repo):
    arrays = alltypes_inputs(rows=1, seed=3)
    inputs = [infer_input(name, array, name[3:].upper()) for name, array in arrays.items()]
    asked = ["out_int16", "out_bool", "out_fp64"]

    result = client.infer("alltypes", inputs, outputs=[triton.InferRequestedOutput(n) for n in asked])

    assert [o.name for o in result.get_response().outputs] == asked
    assert result.as_numpy("out_uint8") is None
    expected = run_alone(repo, "alltypes", arrays)
    for name in asked:
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])


# -- errors: the HTTP message, Triton's code ------------------------------------------------------------------
def mlp_doc(shape: list[int], datatype: str = "FP32") -> dict:
    count = int(np.prod(shape))
    return {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": [0] * count}]}


@pytest.mark.parametrize("case", ["bad shape", "wrong datatype", "missing input", "unknown input"])
def test_bad_requests_are_invalid_argument_with_the_http_message(client, grpc_stack: Stack, case):
    x = np.zeros((2, 500), np.float32)
    doc = mlp_doc([2, 500])
    inputs = [infer_input("x", x, "FP32")]
    if case == "wrong datatype":
        x = np.zeros((2, 512), np.float64)
        doc, inputs = mlp_doc([2, 512], "FP64"), [infer_input("x", x, "FP64")]
    elif case == "missing input":
        doc, inputs = {"inputs": []}, []
    elif case == "unknown input":
        x = np.zeros((2, 512), np.float32)
        doc = {"inputs": [{"name": "z", "shape": [2, 512], "datatype": "FP32", "data": [0.0] * 1024}]}
        inputs = [infer_input("z", x, "FP32")]
    status, message = http_error(grpc_stack, "/v2/models/mlp/infer", doc)
    assert status == 400

    error = grpc_error(lambda: client.infer("mlp", inputs))

    assert error.status() == "StatusCode.INVALID_ARGUMENT" and error.message() == message


@pytest.mark.parametrize("version", ["9" * 5000, "\u00b2", "\u0663"], ids=["5000-digits", "superscript-two",
                                                                           "arabic-indic-three"])
def test_an_invalid_model_version_is_invalid_argument_with_the_http_message_on_every_rpc(stub, grpc_stack, version):
    """On gRPC, model_version goes through the same check as HTTP's path (1-19 ASCII digits),
    never to int() (past 4300 digits a ValueError: an UNKNOWN error where HTTP once sent a plain-text 500)."""
    status, doc = grpc_stack.get(f"/v2/models/mlp/versions/{urllib.parse.quote(version)}")
    assert status == 400 and "is not valid: versions are whole numbers of at most 19 digits" in doc["error"]
    infer = pb.ModelInferRequest(model_name="mlp", model_version=version)
    infer.inputs.add(name="x", datatype="FP32", shape=[1, 512]).contents.fp32_contents.extend([0.5] * 512)
    calls = {"ModelInfer": (stub.ModelInfer, infer),
             "ModelMetadata": (stub.ModelMetadata, pb.ModelMetadataRequest(name="mlp", version=version)),
             "ModelReady": (stub.ModelReady, pb.ModelReadyRequest(name="mlp", version=version)),
             "ModelConfig": (stub.ModelConfig, pb.ModelConfigRequest(name="mlp", version=version)),
             "ModelStatistics": (stub.ModelStatistics, pb.ModelStatisticsRequest(name="mlp", version=version))}
    for rpc, (call, request) in calls.items():
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=30)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, doc["error"]), rpc


def test_typed_contents_of_another_type_are_refused_by_name(stub):
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 512]).contents.int_contents.extend([0] * 512)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("unexpected explicit tensor data for input tensor 'x' for model 'mlp' of type "
                                    "'INT32', expected datatype 'FP32'; "  # Triton's words, then ringserve's
                                    "input 'x': datatype FP32 takes its values in contents.fp32_contents; "
                                    "the request set: int_contents")


def test_system_shared_memory_over_grpc_reads_the_input_and_writes_the_output_in_regions(client, repo):
    """Triton's extension with tritonclient.grpc: register, infer from and into regions, status, unregister."""
    x = np.random.default_rng(7).standard_normal((3, 512)).astype(np.float32)
    out_bytes = 3 * 10 * 4
    token = os.urandom(4).hex()
    inp = shm.create_shared_memory_region("gin", f"/rs-test-grpc-in-{token}", x.nbytes)
    out = shm.create_shared_memory_region("gout", f"/rs-test-grpc-out-{token}", 64 + out_bytes)
    try:
        shm.set_shared_memory_region(inp, [x])
        client.register_system_shared_memory("gin", f"/rs-test-grpc-in-{token}", x.nbytes)
        client.register_system_shared_memory("gout", f"/rs-test-grpc-out-{token}", 64 + out_bytes)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["gin"]["key"] == f"/rs-test-grpc-in-{token}" and int(status["gout"]["byte_size"]) == 64 + out_bytes

        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_shared_memory("gin", x.nbytes)
        output = triton.InferRequestedOutput("y")
        output.set_shared_memory("gout", out_bytes, offset=64)
        result = client.infer("mlp", [tensor], outputs=[output])

        assert result.get_response(as_json=True)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["3", "10"]}]
        got = shm.get_contents_as_numpy(out, np.float32, [3, 10], offset=64)
        np.testing.assert_allclose(got, run_alone(repo, "mlp", {"x": x})["y"], rtol=0, atol=1e-5)

        error = grpc_error(lambda: client.register_system_shared_memory("bad", "/rs-test-grpc-no-such-key", 16))
        assert error.status() == "StatusCode.INVALID_ARGUMENT" and "rs-test-grpc-no-such-key" in error.message()
        client.unregister_system_shared_memory("gin")
        assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"gout"}
        error = grpc_error(lambda: client.get_system_shared_memory_status("gin"))
        assert error.status() == "StatusCode.NOT_FOUND"
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inp)
        shm.destroy_shared_memory_region(out)
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_cuda_shared_memory_is_refused_as_by_triton_without_gpus(client):
    error = grpc_error(lambda: client.register_cuda_shared_memory("c", b"\0" * 64, 0, 16))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "GPUs not supported" in error.message()
    assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_every_grpc_answer_carries_the_request_id(stub):
    x = np.ones((1, 512), np.float32)
    request = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[1, 512])
    _, call = stub.ModelInfer.with_call(request, metadata=(("x-request-id", "grpc-id-1"),))
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-id-1"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(pb.ModelInferRequest(model_name="no-such-model"), metadata=(("x-request-id", "grpc-id-2"),))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(info.value.trailing_metadata())["x-request-id"] == "grpc-id-2"
    _, call = stub.ModelInfer.with_call(request)  # none sent: one made by the gateway
    assert dict(call.trailing_metadata())["x-request-id"]


# -- statistics and the repository ----------------------------------------------------------------------------
def test_statistics_count_grpc_requests(client):
    before = client.get_inference_statistics("encoder", as_json=True)["model_stats"][0]
    ids = np.ones((1, 4), np.int64)
    for _ in range(3):
        client.infer("encoder", [infer_input("input_ids", ids, "INT64"), infer_input("attention_mask", ids, "INT64")])
    after = client.get_inference_statistics("encoder", as_json=True)["model_stats"][0]
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == 3
    assert int(after["inference_stats"]["success"]["count"]) - int(
        before["inference_stats"]["success"].get("count", 0)) == 3
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in every} >= {"mlp", "encoder", "strings", "alltypes", "auto"}


def test_repository_index_unload_and_load(client, grpc_stack: Stack):
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["state"]) for m in index} >= {("auto", "READY"), ("mlp", "READY")}
    x = np.ones((1, 512), np.float32)

    client.unload_model("auto")
    assert not client.is_model_ready("auto")
    error = grpc_error(lambda: client.infer("auto", [infer_input("x", x, "FP32")]))
    status, message = http_error(grpc_stack, "/v2/models/auto/infer", mlp_doc([1, 512]))
    assert status == 503 and error.status() == "StatusCode.UNAVAILABLE" and error.message() == message
    unloaded = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}["auto"]
    assert unloaded["state"] == "UNAVAILABLE"

    client.load_model("auto")
    assert client.is_model_ready("auto")
    assert client.infer("auto", [infer_input("x", x, "FP32")]).as_numpy("y").shape == (1, 10)
    error = grpc_error(lambda: client.load_model("auto", config=json.dumps({"max_batch_size": 2})))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "config or files in the load request" in error.message()


# -- streaming ------------------------------------------------------------------------------------------------
def test_a_stream_answers_each_request_matched_by_id_and_an_error_does_not_end_it(client, repo):
    rng = np.random.default_rng(8)
    xs = {f"s{i}": rng.standard_normal((1 + i % 3, 512)).astype(np.float32) for i in range(12)}
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for rid, x in xs.items():
            client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id=rid)
        client.async_stream_infer("nope", [infer_input("x", xs["s0"], "FP32")], request_id="bad")
        client.async_stream_infer("mlp", [infer_input("x", xs["s1"], "FP32")], request_id="after")
        got = [answers.get(timeout=60) for _ in range(len(xs) + 2)]
    finally:
        client.stop_stream()
    results = {r.get_response().id: r for r, e in got if e is None}
    errors = [e for r, e in got if e is not None]
    assert set(results) == {*xs, "after"}
    for rid, x in xs.items():
        np.testing.assert_allclose(results[rid].as_numpy("y"), run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)
    assert len(errors) == 1 and "model 'nope' is not served here" in errors[0].message()


# -- an HTTP and a gRPC request in one batch ----------------------------------------------------------------------
def test_an_http_and_a_grpc_request_share_a_batch(client, grpc_stack: Stack, repo):
    """Two fillers take the worker's two in-flight places while it is stopped; an HTTP and a gRPC
    request then wait in the queue together and leave as one batch of 2 (the statistics extension
    counts executions by size, as Triton's: the worker may fuse the two fillers into one of 2 rows)."""
    rng = np.random.default_rng(12)
    fillers = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(2)]
    x_http, x_grpc = (rng.standard_normal((1, 512)).astype(np.float32) for _ in range(2))
    before = batches_by_size(client)
    fused_before = grpc_stack.metric("ringserve_fused_executions_total", model="mlp")

    def post(x: np.ndarray) -> np.ndarray:
        status, doc = grpc_stack.post("/v2/models/mlp/infer", mlp_doc_of(x))
        assert status == 200, doc
        return np.asarray(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])

    def send() -> list[np.ndarray]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = [pool.submit(post, x) for x in fillers]
            poll_for(lambda: sum(w["in_flight_batches"] for w in grpc_stack.status()["workers"]) == 2, 10,
                     what="the fillers in flight")
            both = [pool.submit(post, x_http),
                    pool.submit(lambda: client.infer("mlp", [infer_input("x", x_grpc, "FP32")]).as_numpy("y"))]
            return [f.result(timeout=60) for f in first + both]

    answers = grpc_stack.send_while_stopped(
        send, until=lambda s: held_requests(s) == 4 and s["models"]["mlp"]["queue_depth"] == 2, timeout_s=10)

    for x, y in zip([*fillers, x_http, x_grpc], answers):
        np.testing.assert_allclose(y, run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)
    after = batches_by_size(client)
    fillers_fused = grpc_stack.metric("ringserve_fused_executions_total", model="mlp") - fused_before == 1
    assert {size: after[size] - before.get(size, 0) for size in after if after[size] != before.get(size, 0)} == (
        {2: 2} if fillers_fused else {1: 2, 2: 1})


def batches_by_size(client) -> dict[int, int]:
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"].get("count", 0)) for b in stats.get("batch_stats", [])}


def mlp_doc_of(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


# -- the API key, the message limit, the port -----------------------------------------------------------------
def test_the_api_key_applies_to_grpc_but_live_and_ready_stay_open(repo: Path, tmp_path: Path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    port = free_port()
    with running_stack(repo, "--grpc-port", str(port), "--api-key-file", str(key_file)):
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            x = np.ones((1, 512), np.float32)
            assert client.is_server_live() and client.is_server_ready()  # open, as /v2/health/* over HTTP
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # and the standard health check
                assert channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10) == b"\x08\x01"
            missing = grpc_error(lambda: client.infer("mlp", [infer_input("x", x, "FP32")]))
            assert missing.status() == "StatusCode.UNAUTHENTICATED"
            assert missing.message() == ("this endpoint needs the server's API key; send the header "
                                         "'Authorization: Bearer <key>' with the server's API key")
            wrong = grpc_error(lambda: client.get_model_metadata("mlp", headers={"authorization": "Bearer nope"}))
            assert wrong.status() == "StatusCode.UNAUTHENTICATED" and "the API key in the Authorization header is wrong" \
                in wrong.message()
            good = {"authorization": "Bearer s3cret"}
            assert client.infer("mlp", [infer_input("x", x, "FP32")], headers=good).as_numpy("y").shape == (1, 10)
            assert client.get_model_metadata("mlp", headers=good).name == "mlp"
            streamed: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: streamed.put(error), headers={"authorization": "Bearer nope"})
            try:  # the server ends the stream at once: the client may already know when this is queued
                client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id="k")
            except InferenceServerException:
                pass
            error = streamed.get(timeout=30)
            client.stop_stream()
            assert error is not None and "UNAUTHENTICATED" in error.status()
        finally:
            client.close()


def test_a_message_over_max_request_bytes_is_refused_and_the_server_stays_up(repo: Path):
    port = free_port()
    with running_stack(repo, "--grpc-port", str(port), "--max-request-bytes", "64KiB") as stack:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            big = np.zeros((64, 512), np.float32)  # 128 KiB
            error = grpc_error(lambda: client.infer("mlp", [infer_input("x", big, "FP32")]))
            assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert client.infer("mlp", [infer_input("x", big[:4], "FP32")]).as_numpy("y").shape == (4, 10)
        finally:
            client.close()
        assert stack.stop() == 0


def test_a_second_server_on_the_same_grpc_port_is_refused_at_start_and_two_gateways_share_it(demo_repo: Path):
    port = free_port()
    with running_stack(demo_repo, "--grpc-port", str(port), "--gateways", "2") as first:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            x = np.ones((2, 512), np.float32)
            for _ in range(8):  # new channels: the kernel deals them among the gateways' sockets
                c = triton.InferenceServerClient(f"127.0.0.1:{port}")
                assert c.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("y").shape == (2, 10)
                c.close()
            # Whichever gateway answers, the statistics are the whole server's (as over HTTP).
            stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
            assert int(stats["inference_count"]) == 16 and int(stats["inference_stats"]["success"]["count"]) == 8
        finally:
            client.close()
        done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository",
                               str(demo_repo), "--port", str(free_port()), "--grpc-port", str(port)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 3, done.stderr[-2000:]
        assert f"stop what uses port {port} or choose another with --grpc-port" in done.stderr, done.stderr[-2000:]
        assert "started gateway" not in done.stderr
        gateways = [p for p in psutil.Process(first.pid).children() if "ringserve.gateway" in p.cmdline()]
        assert len(gateways) == 2

        def listening(gateway: psutil.Process) -> bool:
            return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in gateway.net_connections())
        # Each listens on the port itself (SO_REUSEPORT); gateway 1 once a worker has announced itself to it.
        poll_for(lambda: all(map(listening, gateways)), 30, what="both gateways listening for gRPC")
        assert first.stop(signal.SIGTERM) == 0


def test_stopping_with_a_grpc_client_connected_is_clean(demo_repo: Path):
    port = free_port()
    with running_stack(demo_repo, "--grpc-port", str(port)) as stack:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            x = np.ones((1, 512), np.float32)
            assert client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("y").shape == (1, 10)
            assert stack.stop() == 0  # (the channel is still open)
        finally:
            client.close()


def test_sigterm_answers_every_grpc_request_already_accepted(demo_repo: Path):
    """Requests held behind a stopped worker when SIGTERM comes are answered (the drain), then the server exits 0."""
    port = free_port()
    rng = np.random.default_rng(31)
    xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(8)]
    # (--hang-timeout-s: a loaded machine may keep the worker stopped past the default 5 s)
    with running_stack(demo_repo, "--grpc-port", str(port), "--drain-timeout-s", "30",
                       "--hang-timeout-s", "60") as stack:
        worker = next(w["pid"] for w in stack.status()["workers"] if "mlp" in w["models"])  # mlp's lane

        def infer(x: np.ndarray) -> np.ndarray:
            client = triton.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                return client.infer("mlp", [infer_input("x", x, "FP32")], client_timeout=60).as_numpy("y")
            finally:
                client.close()

        with concurrent.futures.ThreadPoolExecutor(len(xs)) as pool:
            os.kill(worker, signal.SIGSTOP)
            try:
                answers = [pool.submit(infer, x) for x in xs]
                poll_for(lambda: held_requests(stack.status()) == len(xs), 10, what="every request held")
                stack.process.send_signal(signal.SIGTERM)
                poll_for(lambda: not grpc_listening(port), 10, what="the gateway to stop taking new RPCs")
            finally:
                os.kill(worker, signal.SIGCONT)
            ys = [a.result(timeout=60) for a in answers]
        assert stack.process.wait(60) == 0
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y, run_alone(demo_repo, "mlp", {"x": x})["y"], atol=1e-5)


def grpc_listening(port: int) -> bool:
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        return client.is_server_live(client_timeout=1)
    except InferenceServerException:
        return False
    finally:
        client.close()


def test_the_standard_grpc_health_check_says_serving_as_triton_does(grpc_stack: Stack):
    """grpc.health.v1.Health/Check (Kubernetes' gRPC probes): HealthCheckResponse{status: SERVING}."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_stack.grpc_port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"", timeout=10) == b"\x08\x01"  # status 1 = SERVING
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/grpc.health.v1.Health/Watch")(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_requests_are_answered(client, repo, compression):
    x = np.random.default_rng(13).standard_normal((8, 512)).astype(np.float32)
    result = client.infer("mlp", [infer_input("x", x, "FP32")], compression_algorithm=compression)
    np.testing.assert_allclose(result.as_numpy("y"), run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)


def test_the_asyncio_client_infers_and_streams(grpc_stack: Stack, repo):
    import tritonclient.grpc.aio as aio_triton

    xs = {f"a{i}": np.random.default_rng(40 + i).standard_normal((1, 512)).astype(np.float32) for i in range(4)}

    async def run() -> tuple[np.ndarray, dict[str, np.ndarray]]:
        client = aio_triton.InferenceServerClient(f"127.0.0.1:{grpc_stack.grpc_port}")
        try:
            single = (await client.infer("mlp", [infer_input("x", xs["a0"], "FP32")])).as_numpy("y")

            async def requests():
                for rid, x in xs.items():
                    yield {"model_name": "mlp", "inputs": [infer_input("x", x, "FP32")], "request_id": rid}
            streamed = {}
            async for result, error in client.stream_infer(requests()):
                assert error is None
                streamed[result.get_response().id] = result.as_numpy("y")
                if len(streamed) == len(xs):
                    break
            return single, streamed
        finally:
            await client.close()

    single, streamed = asyncio.run(run())
    np.testing.assert_allclose(single, run_alone(repo, "mlp", {"x": xs["a0"]})["y"], atol=1e-5)
    assert set(streamed) == set(xs)
    for rid, x in xs.items():
        np.testing.assert_allclose(streamed[rid], run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)
