"""Model repositories for the protocol tests: every KServe datatype, BYTES models, an auto-completed model.

Built in code with onnx.helper, like common/repository/demo.py, so the tests need no files.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ringserve.common.repository.demo import DEMO_IR_VERSION, DEMO_OPSET, build_demo_models, write_model_dir

# KServe datatype -> ONNX element type, for every fixed-size type ringserve carries through the ring.
FIXED_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
}
ALLTYPES_WIDTH = 3


def _save(repo: Path, name: str, graph: onnx.GraphProto, config: dict | None) -> None:
    model = helper.make_model(graph, producer_name="ringserve.tests", opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    onnx.checker.check_model(model)
    path = repo / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    if config is not None:
        (repo / name / "config.json").write_text(json.dumps(config, indent=2))


def alltypes_model(repo: Path) -> None:
    """`alltypes`: in_<TYPE> [batch, 3] -> Identity -> out_<TYPE>, for every fixed-size KServe type."""
    nodes, inputs, outputs, config_in, config_out = [], [], [], [], []
    for kserve, elem in FIXED_TYPES.items():
        name = kserve.lower()
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]))
        inputs.append(helper.make_tensor_value_info(f"in_{name}", elem, ["batch", ALLTYPES_WIDTH]))
        outputs.append(helper.make_tensor_value_info(f"out_{name}", elem, ["batch", ALLTYPES_WIDTH]))
        config_in.append({"name": f"in_{name}", "data_type": f"TYPE_{kserve}", "dims": [ALLTYPES_WIDTH]})
        config_out.append({"name": f"out_{name}", "data_type": f"TYPE_{kserve}", "dims": [ALLTYPES_WIDTH]})
    config = {"name": "alltypes", "max_batch_size": 8, "input": config_in, "output": config_out,
              "dynamic_batching": {}}
    _save(repo, "alltypes", helper.make_graph(nodes, "alltypes", inputs, outputs), config)


def strings_model(repo: Path) -> None:
    """`strings`: text [batch, 2] BYTES -> Identity -> same (ORT's tensor(string))."""
    graph = helper.make_graph([helper.make_node("Identity", ["text"], ["echo"])], "strings",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 2])],
                              [helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch", 2])])
    _save(repo, "strings", graph, None)


# StringConcat came with opset 20 (onnxruntime 1.17+); IR 10 as for every test model (see common/repository/demo.py).
TEXTOPS_OPSET = 20


def textops_model(repo: Path, name: str = "textops", max_batch_size: int = 16) -> Path:
    """`textops`: string tensors in and out, next to fixed-size ones, computed by ONNX Runtime.

    text [batch, 2] BYTES, scale [batch, 1] FP32 ->
        shout    [batch, 2] BYTES = text + "!"        (StringConcat: new strings, new lengths)
        is_empty [batch, 2] BOOL  = text == ""         (a fixed-size output read from the strings)
        doubled  [batch, 1] FP32  = 2 * scale          (a fixed-size input after a BYTES one in the slot)
    """
    nodes = [helper.make_node("StringConcat", ["text", "bang"], ["shout"]),
             helper.make_node("Equal", ["text", "empty"], ["is_empty"]),
             helper.make_node("Mul", ["scale", "two"], ["doubled"])]
    initializers = [helper.make_tensor("bang", TensorProto.STRING, [], [b"!"]),
                    helper.make_tensor("empty", TensorProto.STRING, [], [b""]),
                    helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 2]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("shout", TensorProto.STRING, ["batch", 2]),
         helper.make_tensor_value_info("is_empty", TensorProto.BOOL, ["batch", 2]),
         helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["batch", 1])],
        initializer=initializers)
    model = helper.make_model(graph, producer_name="ringserve.tests",
                              opset_imports=[helper.make_opsetid("", TEXTOPS_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    config = {"name": name, "max_batch_size": max_batch_size,
              "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [2]},
                        {"name": "scale", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "shout", "data_type": "TYPE_STRING", "dims": [2]},
                         {"name": "is_empty", "data_type": "TYPE_BOOL", "dims": [2]},
                         {"name": "doubled", "data_type": "TYPE_FP32", "dims": [1]}],
              "dynamic_batching": {"max_queue_delay_microseconds": 20000}}
    return write_model_dir(repo, name, model, config)


def build_protocol_repo(repo: Path) -> Path:
    """mlp and encoder (demo), alltypes, strings, and `auto`: mlp's graph with no config.json."""
    build_demo_models(repo)
    alltypes_model(repo)
    strings_model(repo)
    (repo / "auto" / "1").mkdir(parents=True)
    shutil.copy(repo / "mlp" / "1" / "model.onnx", repo / "auto" / "1" / "model.onnx")
    return repo


def alltypes_inputs(rows: int, seed: int = 5) -> dict[str, np.ndarray]:
    """Random values for every alltypes input, spread over each type's range."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for kserve in FIXED_TYPES:
        shape = (rows, ALLTYPES_WIDTH)
        if kserve == "BOOL":
            array = rng.integers(0, 2, shape).astype(bool)
        elif kserve.startswith("FP"):
            array = (rng.standard_normal(shape) * 100).astype({"FP16": np.float16, "FP32": np.float32,
                                                               "FP64": np.float64}[kserve])
        else:
            dtype = np.dtype(kserve.lower())
            info = np.iinfo(dtype)
            array = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        arrays[f"in_{kserve.lower()}"] = array
    return arrays
