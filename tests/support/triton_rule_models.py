"""Models for Triton's client-facing rules (tests/integration/test_triton_rules.py, unit tests).

- `opt`: y = x + bias, max_batch_size 0; `bias` is an optional input, an ONNX overridable
  initializer whose value [10, 20, 30, 40] ONNX Runtime uses when a request leaves it out.
- `opt_batched`: the same graph behind a batching config that marks `bias` optional (Triton's
  ONNX Runtime backend refuses it; so does ringserve).
- `cls`: y = x (FP32) and yi = int32(x), batching, y with labels from labels.txt: the
  classification extension's values are then the test's own.
- `..my_model`: a model whose name starts with dots (Triton serves it).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ringserve.common.repository.demo import DEMO_IR_VERSION, DEMO_OPSET

from .lifecycle_models import build_versioned

WIDTH = 4
BIAS = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
CLASSES = 6
LABELS = ["cat", "dog", "", "bird\r", "fish"]  # index 2: an empty line (no label); 5: past the file (none)
DOT_MODEL = "..my_model"


def _save(repo: Path, name: str, graph: onnx.GraphProto, config: dict) -> Path:
    model = helper.make_model(graph, producer_name="ringserve.tests", opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    onnx.checker.check_model(model)
    path = repo / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    (repo / name / "config.json").write_text(json.dumps(config, indent=2))
    return path


def optional_graph() -> onnx.GraphProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [WIDTH])
    bias = helper.make_tensor_value_info("bias", TensorProto.FLOAT, [WIDTH])  # an input, and below its default
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [WIDTH])
    return helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"])], "opt", [x, bias], [y],
                             initializer=[numpy_helper.from_array(BIAS, name="bias")])


def optional_config(name: str, max_batch_size: int = 0) -> dict:
    return {"name": name, "max_batch_size": max_batch_size,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [WIDTH]},
                      {"name": "bias", "data_type": "TYPE_FP32", "dims": [WIDTH], "optional": True}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}


def classes_graph() -> onnx.GraphProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", CLASSES])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])
    yi = helper.make_tensor_value_info("yi", TensorProto.INT32, ["batch", CLASSES])
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Cast", ["x"], ["yi"], to=TensorProto.INT32)]
    return helper.make_graph(nodes, "cls", [x], [y, yi])


def build_rules_repo(repo: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    _save(repo, "opt", optional_graph(), optional_config("opt"))
    # (the graph's shapes have no batch dim; the config is refused before the graph is compared)
    _save(repo, "opt_batched", optional_graph(), optional_config("opt_batched", max_batch_size=8))
    _save(repo, "cls", classes_graph(), {
        "name": "cls", "max_batch_size": 8, "dynamic_batching": {},
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [CLASSES]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [CLASSES], "label_filename": "labels.txt"},
                   {"name": "yi", "data_type": "TYPE_INT32", "dims": [CLASSES]}]})
    (repo / "cls" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    build_versioned(repo, DOT_MODEL, weight_bytes=64)
    return repo


def triton_classes(rows: np.ndarray, k: int, labels: list[str], text: str = "%f") -> list[list[str]]:
    """What Triton's classification answers for each row, computed here from its rule: the k highest
    values (ties: the lower index first), each "value:index[:label]"."""
    answer = []
    for row in rows:
        order = sorted(range(len(row)), key=lambda i: -float(row[i]))[:k]
        entries = []
        for i in order:
            label = labels[i] if i < len(labels) else ""
            entries.append(f"{text % row[i]}:{i}" + (f":{label}" if label else ""))
        answer.append(entries)
    return answer
