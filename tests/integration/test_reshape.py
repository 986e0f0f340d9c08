"""Triton's reshape, batch_output and is_shape_tensor, on the ONNX models of Triton's gen_qa_reshape_models.py and
L0_batch_input's ragged_io; each answer is checked against ONNX Runtime run on the model's own shapes here."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.scan import load_model
from tests.support.stack import running_stack
from tests.support.warmup_models import build_python_reshape, build_ragged_identity, create_reshape_model

# (dtype, input shapes, the model's input shapes, output shapes, the model's output shapes, with a nobatch twin):
# gen_qa_reshape_models.py's create_models calls for ONNX (its --variable ones included).
CASES = [
    (np.float32, [[1]], [[]], None, None, False),
    (np.float32, [[4, 4], [2], [2, 2, 3]], [[16], [1, 2], [3, 2, 2]], None, None, True),
    (np.float32, [[4, 4], [2], [2, 2, 3], [1]], [[16], [1, 2], [3, 2, 2], [1]],
     [[16], [1, 2], [3, 2, 2], [1]], [[16], [1, 2], [3, 2, 2], [1]], True),
    (np.int32, [[2, 4, -1, 6]], [[8, -1, 1, 6]], None, None, True),
    (np.int32, [[-1, 1], [2]], [[1, -1], [1, 2]], [[1, -1], [1, 2]], [[1, -1], [1, 2]], True),
]
DATATYPES = {np.float32: "FP32", np.int32: "INT32"}


@pytest.fixture(scope="module")
def reshape_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("reshape")
    models = []
    for dtype, shapes, model_shapes, out_shapes, out_model_shapes, no_batch in CASES:
        for max_batch in (8, 0) if no_batch else (8,):
            name = create_reshape_model(repo, max_batch, dtype, shapes, model_shapes, out_shapes, out_model_shapes)
            models.append((name, max_batch, dtype, shapes, model_shapes, out_shapes or shapes))
    build_ragged_identity(repo)
    build_python_reshape(repo)
    with running_stack(repo) as stack:
        yield stack, repo, models


def concrete(shape: list[int], variable: int) -> list[int]:
    return [variable if d == -1 else d for d in shape]


def test_reshaped_models_answer_what_onnx_runtime_computes_on_the_model_shapes(reshape_stack) -> None:
    stack, repo, models = reshape_stack
    rng = np.random.default_rng(7)
    for name, max_batch, dtype, shapes, model_shapes, out_shapes in models:
        session = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        for batch in (1, 8) if max_batch else (None,):
            lead = [batch] if batch else []
            xs = [(rng.standard_normal(lead + concrete(s, 5)) * 100).astype(dtype) for s in shapes]
            doc = {"inputs": [{"name": f"INPUT{i}", "shape": list(x.shape), "datatype": DATATYPES[dtype],
                               "data": x.ravel().tolist()} for i, x in enumerate(xs)]}

            status, answer = stack.post(f"/v2/models/{name}/infer", doc)

            assert status == 200, (name, answer)
            feeds = {f"INPUT{i}": x.reshape(lead + concrete(m, 5)) for i, (x, m) in enumerate(zip(xs, model_shapes))}
            expected = session.run(None, feeds)
            outputs = {o["name"]: o for o in answer["outputs"]}
            for i, (want, out_shape) in enumerate(zip(expected, out_shapes)):
                got = outputs[f"OUTPUT{i}"]
                assert got["shape"] == lead + concrete(out_shape, 5), (name, got["shape"])
                np.testing.assert_array_equal(np.asarray(got["data"], dtype).reshape(got["shape"]),
                                              want.reshape(got["shape"]))


def test_a_batch_output_scatters_each_request_its_piece_in_its_inputs_shape(reshape_stack) -> None:
    """L0_batch_input's ragged_io: requests of 2, 3, 5 and 7 elements form one batch of 17 concatenated values
    (1 s queue delay); each gets back its own elements shaped as its INPUT0."""
    stack = reshape_stack[0]
    session = ort.InferenceSession(str(reshape_stack[1] / "ragged_io" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    xs = [np.arange(n, dtype=np.float32).reshape(1, n) + 10 * n for n in (2, 3, 5, 7)]

    async def post_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v2/models/ragged_io/infer", json={"inputs": [
                {"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
                for x in xs))

    responses = asyncio.run(post_all())

    (whole,) = session.run(None, {"INPUT0": np.concatenate([x.ravel() for x in xs])})
    start = 0
    for x, response in zip(xs, responses):
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert output["shape"] == list(x.shape)
        np.testing.assert_array_equal(np.asarray(output["data"], np.float32), whole[start:start + x.size])
        start += x.size
    assert stack.metric("ringserve_batch_size_count", model="ragged_io") == 1  # one batch of the four


def test_a_python_model_gets_its_inputs_reshaped_and_its_outputs_back_in_dims(reshape_stack) -> None:
    """As Triton's core normalizes every backend's requests: three requests batched, each [rows, 4] on the wire."""
    stack = reshape_stack[0]
    xs = [np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + rows for rows in (1, 2, 3)]

    async def post_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v2/models/python_reshape/infer", json={"inputs": [
                {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}) for x in xs))

    for x, response in zip(xs, asyncio.run(post_all())):
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert output["shape"] == list(x.shape)
        np.testing.assert_array_equal(np.asarray(output["data"], np.float32).reshape(x.shape), 2 * x)


def test_a_shape_tensor_outside_tensorrt_is_refused_in_tritons_words(tmp_path: Path) -> None:
    name = create_reshape_model(tmp_path, 8, np.float32, [[1]], [[]])
    config = tmp_path / name / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 1 ]", "dims: [ 1 ]\n    is_shape_tensor: true", 1))
    with pytest.raises(ConfigError, match="shape tensors are only supported for TensorRT platform"):
        load_model(tmp_path, name)
