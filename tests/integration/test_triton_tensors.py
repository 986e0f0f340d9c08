"""Tensors as Triton serves them, through the real stack, with Triton's own clients where users have them.

Outputs written into shared memory answered as Triton answers them; NaN and ±Infinity in JSON; a raw
binary body to a batching model with one variable dim; zero-sized tensors through the batcher, the
ring and the worker; BYTES elements that are arbitrary bytes; gRPC ModelReady of what is not served.
Every result is compared with the same ONNX model run by onnxruntime in this process.
"""
from __future__ import annotations

import asyncio
import json
import os
import struct
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ringserve.common.repository.demo import make_model, write_model_dir
from ringserve.common.wire import deserialize_bytes_tensor

from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration

BATCHING = {"max_queue_delay_microseconds": 20000}
FP = {"FP16": (TensorProto.FLOAT16, np.float16), "FP32": (TensorProto.FLOAT, np.float32),
      "FP64": (TensorProto.DOUBLE, np.float64)}


def build_repo(repo: Path) -> Path:
    """vec: x FP32 [-1] -> y = 2x (batching). nonfinite: in_fpNN [-1] -> out_fpNN = 2 in (FP16, FP32, FP64).
    text: s BYTES [-1] -> echo (Identity). text1: s BYTES [1] -> echo. grid: x FP32 [-1, -1] -> y = x + 1
    (max_batch_size 0)."""
    vi = helper.make_tensor_value_info
    write_model_dir(repo, "vec", make_model(
        "vec", [helper.make_node("Mul", ["x", "two"], ["y"])], [vi("x", TensorProto.FLOAT, ["b", "n"])],
        [vi("y", TensorProto.FLOAT, ["b", "n"])], {"two": np.array(2, np.float32)}),
        {"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}], "dynamic_batching": BATCHING})
    nodes, inputs, outputs, weights, config_in, config_out = [], [], [], {}, [], []
    for kserve, (elem, dtype) in FP.items():
        name = kserve.lower()
        nodes.append(helper.make_node("Mul", [f"in_{name}", f"two_{name}"], [f"out_{name}"]))
        weights[f"two_{name}"] = np.array(2, dtype)
        inputs.append(vi(f"in_{name}", elem, ["b", "n"]))
        outputs.append(vi(f"out_{name}", elem, ["b", "n"]))
        config_in.append({"name": f"in_{name}", "data_type": f"TYPE_{kserve}", "dims": [-1]})
        config_out.append({"name": f"out_{name}", "data_type": f"TYPE_{kserve}", "dims": [-1]})
    write_model_dir(repo, "nonfinite", make_model("nonfinite", nodes, inputs, outputs, weights),
                    {"max_batch_size": 8, "input": config_in, "output": config_out, "dynamic_batching": BATCHING})
    for name, dims in (("text", [-1]), ("text1", [1])):
        write_model_dir(repo, name, make_model(
            name, [helper.make_node("Identity", ["s"], ["echo"])], [vi("s", TensorProto.STRING, ["b", "n"])],
            [vi("echo", TensorProto.STRING, ["b", "n"])], {}),
            {"max_batch_size": 8, "input": [{"name": "s", "data_type": "TYPE_STRING", "dims": dims}],
             "output": [{"name": "echo", "data_type": "TYPE_STRING", "dims": dims}], "dynamic_batching": BATCHING})
    write_model_dir(repo, "grid", make_model(
        "grid", [helper.make_node("Add", ["x", "one"], ["y"])], [vi("x", TensorProto.FLOAT, ["r", "c"])],
        [vi("y", TensorProto.FLOAT, ["r", "c"])], {"one": np.array(1, np.float32)}),
        {"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, -1]}]})
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repo(tmp_path_factory.mktemp("tensors-models"))


@pytest.fixture(scope="module")
def stack(repo: Path):
    with running_stack(repo, "--grpc-port", str(free_port()), "--allow-client-shm") as s:
        s.grpc_port = int(s.args[s.args.index("--grpc-port") + 1])
        yield s


@pytest.fixture(scope="module")
def http_client(stack: Stack):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}", connection_timeout=30, network_timeout=30)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def grpc_client(stack: Stack):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    try:
        yield client
    finally:
        client.close()


def run_alone(repo: Path, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def http_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def batches_done(stack: Stack) -> int:
    return sum(w["batches_done"] for w in stack.status()["workers"])


# -- outputs written into shared memory -------------------------------------------------------------------------
def test_an_output_written_into_shared_memory_is_answered_with_name_datatype_and_shape_only(
        stack, repo, http_client, grpc_client):
    """Triton's HTTP answer for such an output has no `parameters`; its C++ client reads binary_data_size
    from any it finds, and fails. Its gRPC answer has none either, and an empty raw_output_contents entry."""
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    expected = run_alone(repo, "vec", {"x": x})["y"]
    token = os.urandom(4).hex()
    keys = {"in": f"/rs-tensors-in-{token}", "out": f"/rs-tensors-out-{token}"}
    regions = {name: shm.create_shared_memory_region(f"t{name}", key, 64 + x.nbytes) for name, key in keys.items()}
    try:
        shm.set_shared_memory_region(regions["in"], [x])
        for name, key in keys.items():
            http_client.register_system_shared_memory(f"t{name}", key, 64 + x.nbytes)
        for client, module, shape in ((http_client, httpclient, [2, 4]), (grpc_client, grpcclient, ["2", "4"])):
            shm.set_shared_memory_region(regions["out"], [np.zeros(16, np.float32)])
            tensor = module.InferInput("x", [2, 4], "FP32")
            tensor.set_shared_memory("tin", x.nbytes)
            output = module.InferRequestedOutput("y")
            output.set_shared_memory("tout", x.nbytes, offset=64)

            result = client.infer("vec", [tensor], outputs=[output])

            answer = result.get_response() if module is httpclient else result.get_response(as_json=True)
            assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": shape}]
            np.testing.assert_array_equal(shm.get_contents_as_numpy(regions["out"], np.float32, [2, 4], offset=64),
                                          expected)
    finally:
        http_client.unregister_system_shared_memory()
        for region in regions.values():
            shm.destroy_shared_memory_region(region)


# -- NaN and ±Infinity in JSON ------------------------------------------------------------------------------------
def nonfinite_inputs() -> dict[str, np.ndarray]:
    arrays = {}
    for kserve, (_, dtype) in FP.items():
        arrays[f"in_{kserve.lower()}"] = np.array([[np.nan, np.inf, -np.inf, 1.5], [0.25, -0.0, np.nan, -3]], dtype)
    return arrays


def test_nan_and_infinity_go_in_and_come_out_of_json_tensors_with_tritons_http_client(repo, http_client):
    """tritonclient.http writes and reads JSON with python-rapidjson, which spells them NaN, Infinity, -Infinity."""
    arrays = nonfinite_inputs()
    inputs = [http_input(name, array, name[3:].upper(), binary=False) for name, array in arrays.items()]
    outputs = [httpclient.InferRequestedOutput(f"out_{t.lower()}", binary_data=False) for t in FP]

    result = http_client.infer("nonfinite", inputs, outputs=outputs)

    for name, want in run_alone(repo, "nonfinite", arrays).items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)  # (NaN where ONNX Runtime has NaN)


def test_json_bodies_with_nan_infinity_literals_are_answered_with_them(stack, repo):
    arrays = nonfinite_inputs()
    body = json.dumps({"inputs": [{"name": name, "datatype": name[3:].upper(), "shape": [2, 4],
                                   "data": array.astype(np.float64).ravel().tolist()}
                                  for name, array in arrays.items()]}).encode()  # Python's json writes them so
    assert b"NaN" in body and b"-Infinity" in body

    response = httpx.post(f"{stack.url}/v2/models/nonfinite/infer", content=body, timeout=30)

    assert response.status_code == 200, response.text
    assert b"null" not in response.content and b"[NaN,Infinity,-Infinity,3.0,0.5,-0.0,NaN,-6.0]" in response.content
    answer = json.loads(response.content)
    expected = run_alone(repo, "nonfinite", arrays)
    for out in answer["outputs"]:
        np.testing.assert_array_equal(np.asarray(out["data"], FP[out["datatype"]][1]).reshape(out["shape"]),
                                      expected[out["name"]])


# -- raw binary bodies -------------------------------------------------------------------------------------------
def raw_post(stack: Stack, model: str, body: bytes) -> tuple[dict, bytes]:
    response = httpx.post(f"{stack.url}/v2/models/{model}/infer", content=body,
                          headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    return json.loads(response.content[:length]), response.content[length:]


@pytest.mark.parametrize("values", [5, 1, 0])
def test_a_raw_body_to_a_batching_model_with_one_variable_dim_is_one_request_of_batch_1(stack, repo, values):
    """Triton's core prepends batch 1 and deduces the variable dim from the body size."""
    x = np.random.default_rng(values).standard_normal((1, values)).astype(np.float32)

    header, rest = raw_post(stack, "vec", x.tobytes())

    (out,) = header["outputs"]
    assert out["shape"] == [1, values] and out["parameters"] == {"binary_data_size": x.nbytes}
    np.testing.assert_array_equal(np.frombuffer(rest, np.float32).reshape(1, values),
                                  run_alone(repo, "vec", {"x": x})["y"])


def test_a_raw_body_to_a_model_with_one_bytes_element_is_that_element(stack, repo):
    element = "héllo, wörld".encode()

    header, rest = raw_post(stack, "text1", element)

    assert header["outputs"][0]["shape"] == [1, 1]
    expected = run_alone(repo, "text1", {"s": np.array([[element.decode()]], dtype=object)})["echo"]
    assert deserialize_bytes_tensor(rest, (1, 1), text=True).tolist() == expected.tolist()


# -- zero-sized tensors -------------------------------------------------------------------------------------------
ZERO_CASES = [("vec", "x", "FP32", (1, 0)), ("vec", "x", "FP32", (0, 3)), ("vec", "x", "FP32", (3, 0)),
              ("text", "s", "BYTES", (1, 0)), ("text", "s", "BYTES", (0, 2)),
              ("grid", "x", "FP32", (0, 4)), ("grid", "x", "FP32", (3, 0))]


@pytest.mark.parametrize("model, name, datatype, shape", ZERO_CASES)
def test_zero_sized_tensors_are_served_over_http_json_http_binary_and_grpc(
        repo, http_client, grpc_client, model, name, datatype, shape):
    array = np.zeros(shape, np.float32) if datatype == "FP32" else np.zeros(shape, dtype=object)
    (want,) = run_alone(repo, model, {name: array}).values()
    out_name = "echo" if model.startswith("text") else "y"

    answers = [http_client.infer(model, [http_input(name, array, datatype, binary)],
                                 outputs=[httpclient.InferRequestedOutput(out_name, binary_data=binary)])
               for binary in (True, False)]
    answers.append(grpc_client.infer(model, [grpc_input(name, array, datatype)]))

    for answer in answers:
        got = answer.as_numpy(out_name)
        assert got.shape == want.shape == shape
        assert got.size == 0


def test_zero_row_and_zero_width_requests_share_batches_with_others_and_answer_as_onnx_runtime_does(stack, repo):
    """Requests of one shape past the batch dim batch together, a request of 0 rows among them (the ring
    carries its zero bytes; ONNX Runtime runs the batch, or a batch of 0 rows alone)."""
    rng = np.random.default_rng(7)
    cases = [rng.standard_normal((rows, width)).astype(np.float32)
             for rows, width in [(0, 3), (2, 3), (0, 3), (1, 3), (1, 0), (2, 0), (0, 0), (3, 3)] * 3]
    before = stack.metric("ringserve_batch_size_count", model="vec")

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v2/models/vec/infer", json={"inputs": [
                {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]})
                for x in cases))

    responses = stack.send_while_stopped(lambda: asyncio.run(send_all()))

    for x, response in zip(cases, responses):
        assert response.status_code == 200, response.text
        (out,) = response.json()["outputs"]
        want = run_alone(repo, "vec", {"x": x})["y"]
        assert out["shape"] == list(want.shape)
        np.testing.assert_array_equal(np.asarray(out["data"], np.float32).reshape(out["shape"]), want)
    batches = stack.metric("ringserve_batch_size_count", model="vec") - before
    assert batches < len(cases)  # requests shared batches, the zero-sized ones with the others


def test_a_zero_row_request_alone_runs_as_a_batch_of_zero_rows(stack, repo, grpc_client):
    before = batches_done(stack)

    result = grpc_client.infer("vec", [grpc_input("x", np.zeros((0, 5), np.float32), "FP32")])

    assert result.as_numpy("y").shape == run_alone(repo, "vec", {"x": np.zeros((0, 5), np.float32)})["y"].shape
    assert batches_done(stack) == before + 1  # it went through a slot to the worker


# -- BYTES elements are bytes ---------------------------------------------------------------------------------------
NOT_UTF8 = [b"\x89PNG\r\n\x1a\n", b"caf\xe9"]  # a PNG's signature, latin-1


def binary_bytes_body(items: list[bytes], rows: int) -> tuple[bytes, dict[str, str]]:
    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [rows, len(items) // rows],
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def test_bytes_that_are_not_utf8_are_carried_to_the_worker_which_refuses_only_their_request(
        stack, repo, grpc_client):
    """ONNX Runtime's Python API takes str elements: non-UTF-8 bytes cannot reach its model as sent. The
    gateway carries them (HTTP binary, gRPC bytes_contents), the worker refuses them before the model runs,
    and the batch is split so that the text requests batched beside them are answered."""
    text = [np.array([["héllo"], ["日本"]], dtype=object), np.array([["", "a\x00b"]], dtype=object)]
    before = batches_done(stack)

    async def send_all() -> list:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            async def http_infer(items: list[bytes], rows: int):
                body, headers = binary_bytes_body(items, rows)
                return await http.post("/v2/models/text/infer", content=body, headers=headers)

            async def grpc_infer(array: np.ndarray):
                return await asyncio.to_thread(grpc_client.infer, "text", [grpc_input("s", array, "BYTES")])
            calls = [http_infer([s.encode() for s in text[0].ravel()], 2),
                     grpc_infer(np.array([NOT_UTF8], dtype=object)),
                     http_infer([s.encode() for s in text[1].ravel()], 1),
                     http_infer([b"ok", NOT_UTF8[1]], 1), grpc_infer(text[0])]
            return await asyncio.gather(*calls, return_exceptions=True)

    good_http, bad_grpc, good_http_2, bad_http, good_grpc = stack.send_while_stopped(lambda: asyncio.run(send_all()))

    for array, response in ((text[0], good_http), (text[1], good_http_2)):
        assert response.status_code == 200, response.text
        length = int(response.headers["inference-header-content-length"])
        got = deserialize_bytes_tensor(response.content[length:], array.shape, text=True)
        assert got.tolist() == run_alone(repo, "text", {"s": array})["echo"].tolist()
    assert not isinstance(good_grpc, Exception), good_grpc
    assert ([[item.decode() for item in row] for row in good_grpc.as_numpy("echo")]
            == run_alone(repo, "text", {"s": text[0]})["echo"].tolist())
    assert isinstance(bad_grpc, InferenceServerException), bad_grpc
    assert bad_grpc.status() == "StatusCode.INVALID_ARGUMENT"
    assert bad_http.status_code == 400
    for message, element in ((bad_grpc.message(), 0), (bad_http.json()["error"], 1)):
        assert (f"input 's': BYTES element {element} is not UTF-8" in message
                and "ONNX Runtime's string tensors take UTF-8 text only" in message), message
    assert batches_done(stack) > before + 2  # the refused requests reached the worker, in batches of their own


def test_a_request_of_non_utf8_bytes_alone_reaches_the_worker_and_gets_its_400(stack, http_client):
    before = batches_done(stack)

    with pytest.raises(InferenceServerException) as refused:
        http_client.infer("text", [http_input("s", np.array([NOT_UTF8], dtype=object), "BYTES", True)])

    assert refused.value.status() == "400"
    assert refused.value.message() == (
        "model 'text' failed on this request: input 's': BYTES element 0 is not UTF-8 (invalid start byte at "
        "byte 0); ONNX Runtime's string tensors take UTF-8 text only (send the bytes as UINT8 to a model that "
        "reads them so)")
    assert poll_for(lambda: batches_done(stack) == before + 1, 10, what="the worker's reply counted")


# -- gRPC ModelReady ----------------------------------------------------------------------------------------------
def test_grpc_model_ready_of_a_model_or_version_not_served_is_false_not_an_error(stack, grpc_client, http_client):
    assert grpc_client.is_model_ready("vec") and grpc_client.is_model_ready("vec", "1")
    assert not grpc_client.is_model_ready("nope")
    assert not grpc_client.is_model_ready("vec", "7")
    assert not http_client.is_model_ready("nope") and not http_client.is_model_ready("vec", "7")  # as over HTTP
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name="nope"), timeout=30) == pb.ModelReadyResponse(ready=False)
        with pytest.raises(grpc.RpcError) as refused:  # a name no model can have stays an error, as in Triton
            stub.ModelReady(pb.ModelReadyRequest(name="vec", version="x1"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
