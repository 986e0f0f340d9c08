"""The models the bench serves and the one-model repositories each case runs on.

`mlp` and `encoder` are the demo models (common/repository/demo.py). `mlp_large` is built here:
the same 512-float input and 10-float output as `mlp` (so the HTTP cost per request is the
same), with three 4096-wide hidden layers in between, so a request costs ~70 MFLOP and the
model, not HTTP, is the bottleneck. `slow` (recovery) is common's build_slow_model.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ringserve.common.repository.demo import (
    DEMO_IR_VERSION,
    DEMO_OPSET,
    DEMO_SEED,
    MLP_IN,
    MLP_OUT,
    write_model_dir,
)

LARGE_WIDTH = 4096
LARGE_LAYERS = 3


# -- configs ----------------------------------------------------------------------------------
def unbatched_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Triton-style config with max_batch_size 1 and no dynamic_batching section."""
    doc = copy.deepcopy(config)
    doc["max_batch_size"] = 1
    doc.pop("dynamic_batching", None)
    return doc


def rewrite_config(model_dir: Path, edit) -> dict[str, Any]:
    """Rewrite `<model_dir>/config.json` in place with `edit(doc) -> doc`; returns the new doc."""
    path = Path(model_dir) / "config.json"
    doc = edit(json.loads(path.read_text()))
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def rewrite_config_unbatched(model_dir: Path) -> dict[str, Any]:
    return rewrite_config(model_dir, unbatched_config)


def without_buckets(config: dict[str, Any]) -> dict[str, Any]:
    """Padding kept (every length batches together, padded to the longest), buckets dropped."""
    doc = copy.deepcopy(config)
    doc.get("dynamic_batching", {}).pop("sequence_buckets", None)
    return doc


def with_latency_target(target_ms: float):
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(config)
        doc.setdefault("dynamic_batching", {})["latency_target_ms"] = float(target_ms)
        return doc
    return edit


# -- mlp_large ----------------------------------------------------------------------------------
def mlp_large_model(width: int = LARGE_WIDTH, layers: int = LARGE_LAYERS):
    """x [batch, 512] -> (Gemm -> Relu) x layers, each `width` wide -> Gemm -> y [batch, 10]."""
    if width < 1 or layers < 1:
        raise ValueError(f"width and layers must be >= 1, got {width}, {layers}")
    rng = np.random.default_rng(DEMO_SEED)
    weights: dict[str, np.ndarray] = {}
    nodes = []
    current, fan_in = "x", MLP_IN
    for layer in range(layers):
        w, b, h, r = f"w{layer}", f"b{layer}", f"h{layer}", f"r{layer}"
        # 1/sqrt(fan_in) keeps activations O(1) through the stack.
        weights[w] = (rng.standard_normal((fan_in, width), dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        weights[b] = np.zeros(width, dtype=np.float32)
        nodes += [helper.make_node("Gemm", [current, w, b], [h]), helper.make_node("Relu", [h], [r])]
        current, fan_in = r, width
    weights["w_out"] = (rng.standard_normal((fan_in, MLP_OUT), dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
    weights["b_out"] = np.zeros(MLP_OUT, dtype=np.float32)
    nodes.append(helper.make_node("Gemm", [current, "w_out", "b_out"], ["y"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", MLP_IN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", MLP_OUT])
    initializers = [numpy_helper.from_array(array, name=key) for key, array in weights.items()]
    graph = helper.make_graph(nodes, "mlp_large", [x], [y], initializer=initializers)
    model = helper.make_model(graph, producer_name="ringserve.bench",
                              opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION  # see common/repository/demo.py: what every onnxruntime >= 1.20 loads
    return model


def mlp_large_flops_per_row(width: int = LARGE_WIDTH, layers: int = LARGE_LAYERS) -> int:
    return 2 * (MLP_IN * width + (layers - 1) * width * width + width * MLP_OUT)


def build_mlp_large(repo: Path, width: int = LARGE_WIDTH, layers: int = LARGE_LAYERS) -> Path:
    """Write `<repo>/mlp_large` (demo-style config: max_batch_size 64, work-conserving batching)."""
    from ringserve.common.repository.demo import DEMO_MAX_BATCH_SIZE

    tensor = lambda name, dims: {"name": name, "data_type": "TYPE_FP32", "dims": dims}
    config = {"name": "mlp_large", "platform": "onnxruntime_onnx", "max_batch_size": DEMO_MAX_BATCH_SIZE,
              "input": [tensor("x", [MLP_IN])], "output": [tensor("y", [MLP_OUT])],
              "dynamic_batching": {"max_queue_delay_microseconds": 0}}
    return write_model_dir(repo, "mlp_large", mlp_large_model(width, layers), config)


# -- busy: slow to run, instant to load ---------------------------------------------------------
def build_busy_model(repo: Path, name: str = "busy", width: int = 512, rounds: int = 6) -> Path:
    """Write `<repo>/<name>`: x [batch, width] -> y [batch, width], slow to run, instant to load.

    No weights (nothing for ONNX Runtime to pre-pack at load, which for a model with large
    MatMul weights takes seconds and would dominate a restart): A = tanh(x x^T) per row, then
    `rounds` times A = tanh(A @ A), 2 * width^3 FLOP per row per round, then the row means.
    For inputs around 0.5 the entries saturate near 1, so no round works on denormals. The
    recovery bench uses it to time ringserve's restart, not a model's load.
    """
    axis_row, axis_col = np.array([2], dtype=np.int64), np.array([1], dtype=np.int64)
    nodes = [helper.make_node("Unsqueeze", ["x", "axis_row"], ["column"]),  # [b, w, 1]
             helper.make_node("Unsqueeze", ["x", "axis_col"], ["row"]),  # [b, 1, w]
             helper.make_node("MatMul", ["column", "row"], ["outer"]),
             helper.make_node("Tanh", ["outer"], ["a0"])]
    for r in range(rounds):
        nodes += [helper.make_node("MatMul", [f"a{r}", f"a{r}"], [f"p{r}"]),
                  helper.make_node("Tanh", [f"p{r}"], [f"a{r + 1}"])]
    nodes.append(helper.make_node("ReduceMean", [f"a{rounds}"], ["y"], axes=[2], keepdims=0))  # opset 17: attribute
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    constants = [numpy_helper.from_array(axis_row, "axis_row"), numpy_helper.from_array(axis_col, "axis_col")]
    graph = helper.make_graph(nodes, name, [x], [y], initializer=constants)
    model = helper.make_model(graph, producer_name="ringserve.bench",
                              opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    tensor = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [width]}
    config = {"name": name, "platform": "onnxruntime_onnx", "max_batch_size": 64, "input": [tensor("x")],
              "output": [tensor("y")], "dynamic_batching": {"max_queue_delay_microseconds": 0}}
    return write_model_dir(repo, name, model, config)


# -- one repository per case ------------------------------------------------------------------
def _link_tree(src: Path, dst: Path) -> None:
    """Copy a model dir, hard-linking the .onnx files (mlp_large is ~140 MB)."""
    def copy(s: str, d: str) -> None:
        if s.endswith(".onnx"):
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=copy)


def case_repository(root: Path, source_repo: Path, model: str, case: str, edit=None) -> Path:
    """`<root>/repo-<case>/<model>` from `<source_repo>/<model>`, its config rewritten by `edit`."""
    repo = Path(root) / f"repo-{case}"
    repo.mkdir(parents=True, exist_ok=True)
    _link_tree(Path(source_repo) / model, repo / model)
    if edit is not None:
        rewrite_config(repo / model, edit)
    return repo


def build_case_repositories(root: Path, model: str = "mlp") -> dict[str, Path]:
    """Demo models once under `<root>/demo`, then {"batched": repo, "unbatched": repo} for `model`."""
    from ringserve.common.repository.demo import build_demo_models

    demo = Path(root) / "demo"
    if not (demo / model).exists():
        build_demo_models(demo)
    return {"batched": case_repository(root, demo, model, "batched"),
            "unbatched": case_repository(root, demo, model, "unbatched", unbatched_config)}
