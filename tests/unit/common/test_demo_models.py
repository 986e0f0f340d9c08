from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from ringserve.common.repository.demo import DEMO_IR_VERSION, build_demo_models, build_slow_model
from ringserve.common.repository.scan import load_model, scan_repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo_dir = tmp_path_factory.mktemp("repo")
    assert build_demo_models(repo_dir) == ["mlp", "encoder"]
    return repo_dir


def session(path: str | Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def initializers(path: str) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in onnx.load(path).graph.initializer}


def encode(sess: ort.InferenceSession, ids: list[list[int]], mask: list[list[int]]) -> np.ndarray:
    feeds = {"input_ids": np.array(ids, dtype=np.int64), "attention_mask": np.array(mask, dtype=np.int64)}
    return sess.run(None, feeds)[0]


def test_demo_repository_loads_with_declared_configs(repo):
    configs = scan_repository(repo).defaults()
    assert list(configs) == ["encoder", "mlp"]
    for config in configs.values():
        assert config.max_batch_size == 64
        assert config.dynamic_batching is not None
        assert config.dynamic_batching.max_queue_delay_us == 0
        assert config.dynamic_batching.preferred_batch_size == ()
        assert onnx.load(config.model_path).ir_version == DEMO_IR_VERSION
    assert [(t.name, t.datatype, t.dims) for t in configs["encoder"].inputs] == [
        ("input_ids", "INT64", (-1,)), ("attention_mask", "INT64", (-1,))]


@pytest.mark.parametrize("name", ["mlp", "encoder"])
def test_demo_model_runs_in_onnxruntime_with_declared_shapes(repo, name):
    config = load_model(repo, name)
    sess = session(config.model_path)
    rng = np.random.default_rng(0)
    batch, seq = 3, 7
    feeds = {}
    for tensor in config.inputs:
        shape = (batch, *(seq if d == -1 else d for d in tensor.dims))
        feeds[tensor.name] = rng.integers(0, 1000, shape).astype(tensor.np_dtype) if tensor.datatype == "INT64" \
            else rng.standard_normal(shape).astype(tensor.np_dtype)
    results = sess.run([t.name for t in config.outputs], feeds)
    for tensor, result in zip(config.outputs, results, strict=True):
        assert result.shape == (batch, *tensor.dims)
        assert result.dtype == tensor.np_dtype
        assert np.isfinite(result).all()


def test_mlp_matches_numpy_from_initializers(repo):
    path = str(repo / "mlp" / "1" / "model.onnx")
    w = initializers(path)
    x = np.random.default_rng(1).standard_normal((5, 512)).astype(np.float32)
    expected = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
    actual = session(path).run(None, {"x": x})[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    assert 0.1 < np.abs(actual).mean() < 10  # weights scaled so outputs are O(1)


def test_encoder_matches_numpy_masked_mean(repo):
    path = str(repo / "encoder" / "1" / "model.onnx")
    w = initializers(path)
    ids, mask = [[3, 999, 42, 0]], [[1, 1, 1, 0]]
    expected = np.tanh(w["table"][[3, 999, 42]] @ w["proj"]).mean(axis=0)
    np.testing.assert_allclose(encode(session(path), ids, mask)[0], expected, rtol=1e-5, atol=1e-6)


def test_encoder_padding_never_changes_embedding(repo):
    sess = session(repo / "encoder" / "1" / "model.onnx")
    alone = encode(sess, [[5, 17, 999]], [[1, 1, 1]])
    padded = encode(sess, [[5, 17, 999, 0, 0, 123, 999]], [[1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_allclose(padded, alone, rtol=0, atol=1e-6)
    # Batched with a longer row, as the batcher pads ragged requests.
    batched = encode(sess, [[5, 17, 999, 0, 0], [1, 2, 3, 4, 5]], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_allclose(batched[0], alone[0], rtol=0, atol=1e-6)
    assert not np.allclose(batched[1], alone[0])


def test_encoder_fully_masked_row_is_zero_not_nan(repo):
    sess = session(repo / "encoder" / "1" / "model.onnx")
    np.testing.assert_array_equal(encode(sess, [[7, 8]], [[0, 0]]), np.zeros((1, 128), np.float32))


def test_demo_models_are_deterministic(tmp_path, repo):
    build_demo_models(tmp_path)
    for name in ("mlp", "encoder"):
        path = Path(name) / "1" / "model.onnx"
        assert (tmp_path / path).read_bytes() == (repo / path).read_bytes()


def test_slow_model_shape_and_layers(tmp_path):
    build_slow_model(tmp_path / "slow", width=32, layers=3)
    config = load_model(tmp_path, "slow")
    assert (config.input("x").dims, config.output("y").dims) == ((32,), (32,))
    assert [n.op_type for n in onnx.load(config.model_path).graph.node] == ["MatMul", "Tanh"] * 3
    y = session(config.model_path).run(None, {"x": np.ones((4, 32), np.float32)})[0]
    assert y.shape == (4, 32)
    assert 0 < np.abs(y).max() < 1  # tanh output, not saturated to exactly +-1


def test_slow_model_needs_a_layer(tmp_path):
    with pytest.raises(ValueError, match="layers"):
        build_slow_model(tmp_path / "slow", width=8, layers=0)


def test_the_demo_python_model_reads_as_a_python_model_and_normalizes(tmp_path):
    from ringserve.common.repository.demo import build_demo_python_model
    from ringserve.worker.python.python_model import PythonModel, completer
    from ringserve.worker.python import pb_utils

    assert build_demo_python_model(tmp_path) == "normalize"
    config = scan_repository(tmp_path, complete=completer(None, set())).defaults()["normalize"]
    assert (config.kind, config.max_batch_size) == ("python", 64)

    model = PythonModel(config)
    texts = np.array([[b"  Cr\xc3\xa8me   BR\xc3\xbbL\xc3\xa9E "], [b"a\tb"]], dtype=object)
    (response,) = model.execute([pb_utils.InferenceRequest(inputs=[pb_utils.Tensor("text", texts)])])

    assert response.output_tensors()[0].as_numpy().tolist() == [[b"creme brulee"], [b"a b"]]
