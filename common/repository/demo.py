"""Small ONNX models built in code, for the demo repository, tests and benchmarks (and the demo's
one Python model, `normalize`, written as Triton's model.py).

Weights come from a fixed seed, so every build of a model is byte-for-byte the same graph
and tests can recompute outputs with numpy from the initializers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

logger = logging.getLogger(__name__)

# onnx 1.23 stamps IR 14, which onnxruntime 1.31 rejects (13 is the newest it loads, tried);
# IR 10 is loaded by every onnxruntime since 1.20, the floor in pyproject.toml.
DEMO_IR_VERSION = 10
# Opset 17 has every op used here and is loaded by any onnxruntime since 1.12.
DEMO_OPSET = 17
DEMO_SEED = 20240601
DEMO_MAX_BATCH_SIZE = 64

MLP_IN, MLP_HIDDEN, MLP_OUT = 512, 256, 10
ENCODER_VOCAB = 1000  # valid input_ids, padding included, are 0..ENCODER_VOCAB-1
ENCODER_WIDTH = 128


def make_model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    weights: dict[str, np.ndarray],
) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(array, name=key) for key, array in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph, producer_name="ringserve.demo_models", opset_imports=[helper.make_opsetid("", DEMO_OPSET)]
    )
    model.ir_version = DEMO_IR_VERSION
    return model


def _tensor_json(name: str, data_type: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims}


def _config(name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "platform": "onnxruntime_onnx",
        "max_batch_size": DEMO_MAX_BATCH_SIZE,
        "input": inputs,
        "output": outputs,
        "dynamic_batching": {"max_queue_delay_microseconds": 0},
    }


def write_model_dir(repo: Path, name: str, model_proto: onnx.ModelProto, config: dict[str, Any] | None) -> Path:
    """Write `<repo>/<name>/1/model.onnx` and, unless config is None (auto-complete it),
    `<repo>/<name>/config.json`; returns the model path."""
    onnx.checker.check_model(model_proto)
    model_path = Path(repo) / name / "1" / "model.onnx"
    model_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model_proto, str(model_path))
    if config is not None:
        (model_path.parent.parent / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    logger.debug("wrote %s", model_path)
    return model_path


def mlp_model() -> onnx.ModelProto:
    """x [batch, 512] -> Gemm -> Relu -> Gemm -> y [batch, 10]."""
    rng = np.random.default_rng(DEMO_SEED)
    # 0.05 keeps activations and outputs O(1) for inputs drawn from N(0, 1).
    weights = {
        "w1": (rng.standard_normal((MLP_IN, MLP_HIDDEN)) * 0.05).astype(np.float32),
        "b1": (rng.standard_normal(MLP_HIDDEN) * 0.05).astype(np.float32),
        "w2": (rng.standard_normal((MLP_HIDDEN, MLP_OUT)) * 0.05).astype(np.float32),
        "b2": (rng.standard_normal(MLP_OUT) * 0.05).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["hidden_relu"]),
        helper.make_node("Gemm", ["hidden_relu", "w2", "b2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", MLP_IN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", MLP_OUT])
    return make_model("mlp", nodes, [x], [y], weights)


def encoder_model() -> onnx.ModelProto:
    """input_ids, attention_mask [batch, seq] -> embedding [batch, 128].

    Per token: Gather from a [1000, 128] table, MatMul 128x128, Tanh. Then masked mean over
    seq: sum(h * mask) / max(sum(mask), 1), so masked-out padding tokens never change the
    result and an all-padding row gives zeros instead of NaN.
    """
    rng = np.random.default_rng(DEMO_SEED)
    weights = {
        "table": rng.standard_normal((ENCODER_VOCAB, ENCODER_WIDTH)).astype(np.float32),
        "proj": (rng.standard_normal((ENCODER_WIDTH, ENCODER_WIDTH)) / np.sqrt(ENCODER_WIDTH)).astype(np.float32),
        "axis_seq": np.array([1], dtype=np.int64),
        "axis_last": np.array([2], dtype=np.int64),
        "one": np.array(1.0, dtype=np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["embedded"], axis=0),
        helper.make_node("MatMul", ["embedded", "proj"], ["projected"]),
        helper.make_node("Tanh", ["projected"], ["hidden"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis_last"], ["mask_3d"]),
        helper.make_node("Mul", ["hidden", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_seq"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis_seq"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "one"], ["count_at_least_one"]),
        helper.make_node("Div", ["summed", "count_at_least_one"], ["embedding"]),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "attention_mask")
    ]
    output = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", ENCODER_WIDTH])
    return make_model("encoder", nodes, inputs, [output], weights)


ENCODER_BUCKETS = (16, 32, 64, 128, 256, 512)


def build_demo_models(repo_dir: Path) -> list[str]:
    """Write the `mlp` and `encoder` demo models into `repo_dir`; returns their names."""
    mlp_config = _config("mlp", [_tensor_json("x", "TYPE_FP32", [MLP_IN])], [_tensor_json("y", "TYPE_FP32", [MLP_OUT])])
    encoder_config = _config(
        "encoder",
        [_tensor_json("input_ids", "TYPE_INT64", [-1]), _tensor_json("attention_mask", "TYPE_INT64", [-1])],
        [_tensor_json("embedding", "TYPE_FP32", [ENCODER_WIDTH])],
    )
    # Masked mean pooling makes padding harmless: requests of different lengths share a batch,
    # padded within their length bucket, and the mask may be left out (all ones).
    encoder_config["dynamic_batching"].update(
        padding={"value": 0, "mask_input": "attention_mask"}, sequence_buckets=list(ENCODER_BUCKETS)
    )
    write_model_dir(repo_dir, "mlp", mlp_model(), mlp_config)
    write_model_dir(repo_dir, "encoder", encoder_model(), encoder_config)
    return ["mlp", "encoder"]


# A Python model (Triton's model.py), as a Triton user writes one: `import triton_python_backend_utils`
# resolves inside ringserve's workers, which alone import this file.
NORMALIZE_MODEL_PY = '''"""normalize: each text lower-cased, accents dropped, runs of white space made one space."""
import unicodedata

import numpy as np
import triton_python_backend_utils as pb_utils


def normalize(text: bytes) -> bytes:
    decomposed = unicodedata.normalize("NFKD", text.decode("utf-8", errors="replace"))
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(plain.lower().split()).encode()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:  # one per client request of the batch
            texts = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # object array of bytes
            out = np.array([normalize(t) for t in texts.reshape(-1)], dtype=object).reshape(texts.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("normalized", out)]))
        return responses
'''


def build_demo_python_model(repo_dir: Path) -> str:
    """Write the `normalize` demo Python model (`<repo>/normalize/1/model.py` and its config.json)."""
    version = Path(repo_dir) / "normalize" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(NORMALIZE_MODEL_PY)
    config = {
        "name": "normalize",
        "backend": "python",
        "max_batch_size": DEMO_MAX_BATCH_SIZE,
        "input": [_tensor_json("text", "TYPE_STRING", [1])],
        "output": [_tensor_json("normalized", "TYPE_STRING", [1])],
        "dynamic_batching": {"max_queue_delay_microseconds": 0},
    }
    (version.parent / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return "normalize"


def build_slow_model(path: Path, *, width: int, layers: int) -> None:
    """Write a model directory at `path` (= `<repo>/<name>`): x [batch, width] -> y [batch, width].

    `layers` times MatMul(width x width) + Tanh; cost grows as batch * width^2 * layers, so
    tests can pick sizes that make one batch take tens to hundreds of milliseconds. Every
    layer reuses one weight matrix: the file stays small and the time is compute, not
    memory traffic.
    """
    if width < 1 or layers < 1:
        raise ValueError(f"width and layers must be >= 1, got width={width}, layers={layers}")
    rng = np.random.default_rng(DEMO_SEED)
    # 1/sqrt(width) keeps activations away from tanh saturation, layer after layer.
    weights = {"w": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)}
    nodes, current = [], "x"
    for layer in range(layers):
        result = "y" if layer == layers - 1 else f"h{layer}"
        nodes.append(helper.make_node("MatMul", [current, "w"], [f"m{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"m{layer}"], [result]))
        current = result
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    name = Path(path).name
    config = _config(name, [_tensor_json("x", "TYPE_FP32", [width])], [_tensor_json("y", "TYPE_FP32", [width])])
    write_model_dir(Path(path).parent, name, make_model(name, nodes, [x], [y], weights), config)
