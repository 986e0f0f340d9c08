"""Stateful ONNX models for the sequence batcher's tests (Triton's implicit state, its control inputs).

`accumulator`: the sum of a sequence's inputs so far, carried in the implicit state, as Triton's QA
models compute it (qa/common/gen_qa_implicit_models.py): OUTPUT = INPUT + (START ? 0 : INPUT_STATE),
and OUTPUT_STATE = OUTPUT. A step applied twice, lost, or run on another sequence's state gives a
different sum, so a test that knows the inputs checks every step's answer exactly (numpy, in the test).
`STEP_DELAY` (fp32 seconds of busy ONNX work is not available) is left out: tests slow a step with
the server's fault parameters instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model, write_model_dir


def accumulator_config(
    *,
    max_batch_size: int = 8,
    strategy: str = "oldest",
    candidates: int = 64,
    state_width: int = 1,
    max_sequence_idle_us: int = 5_000_000,
    **extra: Any,
) -> dict[str, Any]:
    sequence: dict[str, Any] = {
        "control_input": [
            {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
            {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]},
            {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
        ],
        "state": [
            {
                "input_name": "INPUT_STATE",
                "output_name": "OUTPUT_STATE",
                "data_type": "TYPE_FP32",
                "dims": [state_width],
            }
        ],
        "max_sequence_idle_microseconds": max_sequence_idle_us,
    }
    if strategy == "oldest":
        sequence["oldest"] = {"max_candidate_sequences": candidates}
    else:
        sequence["direct"] = {}
    return {
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [state_width]}],
        "output": [
            {"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [state_width]},
            {"name": "SEEN_CORRID", "data_type": "TYPE_UINT64", "dims": [1]},
        ],
        "sequence_batching": sequence,
        **extra,
    }


def build_accumulator(repo: Path, name: str = "accumulator", **config: Any) -> dict[str, Any]:
    """OUTPUT = INPUT + (1 - START) * INPUT_STATE; OUTPUT_STATE = OUTPUT; SEEN_CORRID = CORRID."""
    doc = accumulator_config(**config)
    width = doc["input"][0]["dims"][0]
    batch = ["b"] if doc["max_batch_size"] > 0 else []
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [*batch, width]),
        helper.make_tensor_value_info("INPUT_STATE", TensorProto.FLOAT, [*batch, width]),
        helper.make_tensor_value_info("START", TensorProto.INT32, [*batch, 1]),
        helper.make_tensor_value_info("READY", TensorProto.INT32, [*batch, 1]),
        helper.make_tensor_value_info("CORRID", TensorProto.UINT64, [*batch, 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [*batch, width]),
        helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.FLOAT, [*batch, width]),
        helper.make_tensor_value_info("SEEN_CORRID", TensorProto.UINT64, [*batch, 1]),
    ]
    nodes = [
        helper.make_node("Cast", ["START"], ["start_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "start_f"], ["keep"]),
        helper.make_node("Mul", ["INPUT_STATE", "keep"], ["carried"]),
        helper.make_node("Add", ["INPUT", "carried"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["CORRID"], ["SEEN_CORRID"]),
    ]
    weights = {"one": np.array(1, np.float32)}
    write_model_dir(repo, name, make_model(name, nodes, inputs, outputs, weights), doc)
    return doc


def expected_sums(values: list[float]) -> list[float]:
    """What the accumulator answers to a sequence's steps, computed here."""
    return list(np.cumsum(np.array(values, np.float32)))


PYTHON_ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The accumulator as a Python model: its state is Triton's implicit state (an input and an output),
    so it lives in the server, not in this process; correlation_id() and flags() are Triton's."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            total = value + (0 if start else state)
            seen = np.array([[request.correlation_id(), request.flags()]], np.uint64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total.astype(np.float32)),
                pb_utils.Tensor("OUTPUT_STATE", total.astype(np.float32)),
                pb_utils.Tensor("SEEN", seen),
            ]))
        return responses
'''


def build_python_accumulator(repo: Path, name: str = "py_accumulator") -> None:
    """The accumulator in model.py, run as Triton's python backend runs a sequence model's model.py."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(PYTHON_ACCUMULATOR)
    doc = accumulator_config(max_batch_size=8)
    doc["output"] = [
        {"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [1]},
        {"name": "SEEN", "data_type": "TYPE_UINT64", "dims": [2]},
    ]
    doc["sequence_batching"]["control_input"] = doc["sequence_batching"]["control_input"][:2]  # START, READY
    (repo / name / "config.json").write_text(json.dumps({"backend": "python", **doc}, indent=1))
