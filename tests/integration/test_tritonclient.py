"""The official Triton HTTP client (`tritonclient[http]`), unchanged, against the real stack.

Every result is compared with the same ONNX model run by onnxruntime in this process.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.protocol_models import FIXED_TYPES, alltypes_inputs
from tests.support.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(stack: Stack):
    c = triton.InferenceServerClient(f"127.0.0.1:{stack.port}", connection_timeout=30, network_timeout=30)
    try:
        yield c
    finally:
        c.close()


def run_alone(repo: Path, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def infer_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_health_and_metadata(client, stack: Stack):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "7")
    meta = client.get_server_metadata()
    assert meta["name"] == "ringserve"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata("encoder")
    assert model["versions"] == ["1"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                               {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]


def test_model_config_is_the_one_in_force_auto_completed_fields_included(client):
    config = client.get_model_config("auto")  # no config.json: everything comes from the ONNX graph

    assert config["max_batch_size"] == 64
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [512]}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}]
    assert "dynamic_batching" in config
    assert client.get_model_config("mlp", "1")["name"] == "mlp"


@pytest.mark.parametrize("binary_in, binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_infer_binary_and_json_inputs_and_outputs_equal_the_model_run_alone(client, repo, binary_in, binary_out):
    x = np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)

    result = client.infer("mlp", [infer_input("x", x, "FP32", binary_in)],
                          outputs=[triton.InferRequestedOutput("y", binary_data=binary_out)], request_id="r-7")

    np.testing.assert_allclose(result.as_numpy("y"), run_alone(repo, "mlp", {"x": x})["y"], rtol=0, atol=1e-5)
    response = result.get_response()
    assert response["id"] == "r-7" and response["model_version"] == "1"
    assert ("parameters" in response["outputs"][0]) == binary_out


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors_in_and_out_equal_the_model_run_alone(client, repo, binary):
    text = np.array([["a", "zwölf"], ["", "日本"]], dtype=np.object_)

    result = client.infer("strings", [infer_input("text", np.vectorize(str.encode, otypes=[object])(text), "BYTES",
                                                  binary)],
                          outputs=[triton.InferRequestedOutput("echo", binary_data=binary)])

    expected = run_alone(repo, "strings", {"text": text})["echo"]
    got = [[item.decode() if isinstance(item, bytes) else item for item in row] for row in result.as_numpy("echo")]
    assert got == expected.tolist()  # (binary output: bytes; JSON output: str)


def test_every_fixed_size_datatype_goes_through_the_ring_bit_exact(client, repo):
    arrays = alltypes_inputs(rows=3)
    inputs = [infer_input(name, array, name[3:].upper(), binary=True) for name, array in arrays.items()]

    result = client.infer("alltypes", inputs)  # no outputs named: the client asks for all, binary

    expected = run_alone(repo, "alltypes", arrays)
    assert len(expected) == len(FIXED_TYPES)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_every_datatype_also_goes_as_json(client, repo):
    arrays = alltypes_inputs(rows=2, seed=9)
    inputs = [infer_input(name, array, name[3:].upper(), binary=False) for name, array in arrays.items()
              if name != "in_fp16"]  # the client refuses FP16 as JSON (no JSON type for it): binary
    inputs.append(infer_input("in_fp16", arrays["in_fp16"], "FP16", binary=True))
    outputs = [triton.InferRequestedOutput(f"out_{t.lower()}", binary_data=t == "FP16") for t in FIXED_TYPES]

    result = client.infer("alltypes", inputs, outputs=outputs)

    for name, want in run_alone(repo, "alltypes", arrays).items():
        np.testing.assert_array_equal(result.as_numpy(name), want, err_msg=name)


def test_requested_output_subset_comes_back_alone_in_the_order_asked(client, repo):
    arrays = alltypes_inputs(rows=1, seed=3)
    inputs = [infer_input(name, array, name[3:].upper(), binary=True) for name, array in arrays.items()]
    asked = ["out_int16", "out_bool", "out_fp64"]

    result = client.infer("alltypes", inputs, outputs=[triton.InferRequestedOutput(n) for n in asked])

    assert [o["name"] for o in result.get_response()["outputs"]] == asked
    assert result.as_numpy("out_uint8") is None
    expected = run_alone(repo, "alltypes", arrays)
    for name in asked:
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_requests_and_responses(client, repo, compression):
    x = np.random.default_rng(2).standard_normal((64, 512)).astype(np.float32)  # a response over 1 KiB

    result = client.infer("mlp", [infer_input("x", x, "FP32", True)],
                          outputs=[triton.InferRequestedOutput("y", binary_data=False)],
                          request_compression_algorithm=compression, response_compression_algorithm=compression)

    np.testing.assert_allclose(result.as_numpy("y"), run_alone(repo, "mlp", {"x": x})["y"], atol=1e-5)


def test_encoder_with_two_inputs_and_the_schedule_parameters(client, repo):
    ids = np.random.default_rng(4).integers(0, 1000, (2, 9), dtype=np.int64)
    mask = np.ones_like(ids)

    result = client.infer("encoder", [infer_input("input_ids", ids, "INT64", True),
                                      infer_input("attention_mask", mask, "INT64", False)], timeout=10_000_000)

    expected = run_alone(repo, "encoder", {"input_ids": ids, "attention_mask": mask})["embedding"]
    np.testing.assert_allclose(result.as_numpy("embedding"), expected, atol=1e-5)


@pytest.mark.parametrize("call, status, says", [
    (lambda c: c.infer("nope", [infer_input("x", np.zeros((1, 512), np.float32), "FP32", True)]),
     "404", "model 'nope' is not served here; models: alltypes, auto, encoder, mlp, strings"),
    (lambda c: c.infer("mlp", [infer_input("x", np.zeros((1, 7), np.float32), "FP32", True)]),
     "400", "input 'x': shape [1, 7] does not match [-1,512]"),
    (lambda c: c.infer("mlp", [infer_input("x", np.zeros((1, 512), np.float64), "FP64", True)]),
     "400", "input 'x': datatype 'FP64'; model 'mlp' expects FP32"),
    (lambda c: c.infer("mlp", [infer_input("x", np.zeros((1, 512), np.float32), "FP32", True)],
                       outputs=[triton.InferRequestedOutput("z")]),
     "400", "unknown output(s) z; model 'mlp' has: y"),
    (lambda c: c.infer("strings", [infer_input("text", np.array([[b"a", b"\xff"]], dtype=np.object_), "BYTES", True)]),
     "400", "input 'text': BYTES element 1 is not UTF-8"),
    (lambda c: c.get_model_metadata("mlp", "3"), "404", "model 'mlp' has no version '3' here; it serves version 1"),
    (lambda c: c.get_model_config("ghost"), "404", "model 'ghost' is not served here"),
])
def test_errors_surface_as_inference_server_exception_with_the_servers_message(client, call, status, says):
    with pytest.raises(InferenceServerException) as info:
        call(client)

    assert info.value.status() == status
    assert says in info.value.message()


def test_statistics_and_repository_index_through_the_client(client):
    before = client.get_inference_statistics("encoder")["model_stats"][0]
    ids = np.ones((3, 4), dtype=np.int64)
    client.infer("encoder", [infer_input("input_ids", ids, "INT64", True),
                             infer_input("attention_mask", ids, "INT64", True)])

    after = client.get_inference_statistics("encoder", "1")["model_stats"][0]

    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 3
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["strings"]["state"] == "READY"
