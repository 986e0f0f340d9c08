"""ONNX models built by the tests for the kinds of batching Triton users bring."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model, write_model_dir


def build_unbatched(repo: Path, name: str = "unbatched") -> None:
    """max_batch_size 0: x [4, 8] -> y = 2x + 1, shapes taken exactly as sent (no batch dim)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    nodes = [helper.make_node("Mul", ["x", "two"], ["twice"]), helper.make_node("Add", ["twice", "one"], ["y"])]
    weights = {"two": np.array(2, np.float32), "one": np.array(1, np.float32)}
    # No config.json: auto-complete sees a fixed first dim and sets max_batch_size 0.
    write_model_dir(repo, name, make_model(name, nodes, [x], [y], weights), config=None)


def build_segment_sum(repo: Path, name: str = "segsum") -> None:
    """Ragged INPUT (concatenated 1-D) + BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO offsets -> SUM per request.

    SUM[i] = cumsum(INPUT)[offsets[i+1]] - cumsum(INPUT)[offsets[i]], with a 0 in front.
    """
    inputs = [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["elements"]),
              helper.make_tensor_value_info("OFFSETS", TensorProto.INT32, ["requests_plus_one"])]
    out = helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["requests", 1])
    nodes = [
        helper.make_node("Concat", ["zero", "INPUT"], ["padded"], axis=0),
        helper.make_node("CumSum", ["padded", "axis0"], ["running"]),
        helper.make_node("Cast", ["OFFSETS"], ["offsets"], to=TensorProto.INT64),
        helper.make_node("Slice", ["offsets", "start1", "end_max", "axis0_1d"], ["ends"]),
        helper.make_node("Slice", ["offsets", "start0", "end_minus1", "axis0_1d"], ["starts"]),
        helper.make_node("Gather", ["running", "ends"], ["at_end"]),
        helper.make_node("Gather", ["running", "starts"], ["at_start"]),
        helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axis1_1d"], ["SUM"]),
    ]
    weights = {"zero": np.zeros(1, np.float32), "axis0": np.array(0, np.int64),
               "start1": np.array([1], np.int64), "start0": np.array([0], np.int64),
               "end_max": np.array([np.iinfo(np.int64).max], np.int64), "end_minus1": np.array([-1], np.int64),
               "axis0_1d": np.array([0], np.int64), "axis1_1d": np.array([1], np.int64)}
    config = {"max_batch_size": 16,
              "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
              "batch_input": [{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "target_name": ["OFFSETS"],
                               "data_type": "TYPE_INT32", "source_input": ["INPUT"]}],
              "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [1]}],
              "dynamic_batching": {"max_queue_delay_microseconds": 20000}}
    write_model_dir(repo, name, make_model(name, nodes, inputs, [out], weights), config)


def build_op_switch(repo: Path, name: str = "opswitch") -> None:
    """x [b, 4] and OP [b, 1] (0: y = 2x, 1: y = x + 100). SPREAD = max(OP) - min(OP) over the
    whole executed batch, per row: non-zero in any answer means a batch mixed two OPs."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
              helper.make_tensor_value_info("OP", TensorProto.INT64, ["b", 1])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4]),
               helper.make_tensor_value_info("SPREAD", TensorProto.INT64, ["b", 1])]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Add", ["x", "hundred"], ["shifted"]),
        helper.make_node("Cast", ["OP"], ["is_shift"], to=TensorProto.BOOL),
        helper.make_node("Where", ["is_shift", "shifted", "doubled"], ["y"]),
        helper.make_node("ReduceMax", ["OP"], ["op_max"], keepdims=1),
        helper.make_node("ReduceMin", ["OP"], ["op_min"], keepdims=1),
        helper.make_node("Sub", ["op_max", "op_min"], ["spread"]),
        helper.make_node("Mul", ["OP", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "spread"], ["SPREAD"]),
    ]
    weights = {"two": np.array(2, np.float32), "hundred": np.array(100, np.float32), "zero": np.array(0, np.int64)}
    config = {"max_batch_size": 32,
              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]},
                        {"name": "OP", "data_type": "TYPE_INT64", "dims": [1]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]},
                         {"name": "SPREAD", "data_type": "TYPE_INT64", "dims": [1]}],
              "dynamic_batching": {"max_queue_delay_microseconds": 20000, "separate_by_inputs": ["OP"]}}
    write_model_dir(repo, name, make_model(name, nodes, inputs, outputs, weights), config)


def session_settings(**overrides):
    """A worker's ONNX Runtime options as `ringserve serve --cpu-only` gives them (the defaults of
    common/settings.py), but for `overrides`."""
    import dataclasses

    from ringserve.common.settings import Settings
    from ringserve.worker.session import SessionSettings

    server = SessionSettings.from_settings(Settings(model_repository="/models", cpu_only=True), 0)
    return dataclasses.replace(server, **overrides)
