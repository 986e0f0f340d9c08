"""Models whose config is Triton's config.pbtxt, each beside its config.json twin.

The pbtxt texts are written as Triton's own examples write them (the model configuration and
ragged batching pages); each `*_JSON` is the same config as config.json would hold it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model, write_model_dir

from .models import build_segment_sum

# Dynamic batching with preferred sizes, priority levels and queue policies.
BATCHING_PBTXT = """\
name: "twice"
platform: "onnxruntime_onnx"
max_batch_size: 2
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
# Triton's model-configuration page spells the batcher this way.
dynamic_batching {
  preferred_batch_size: [ 2 ]
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy {
    key: 1
    value: {
      timeout_action: REJECT
      default_timeout_microseconds: 2000000
      max_queue_size: 16
    }
  }
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
version_policy: { specific: { versions: [ 1 ] } }
"""
BATCHING_JSON = {
    "name": "twice", "platform": "onnxruntime_onnx", "max_batch_size": 2,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    "dynamic_batching": {
        "preferred_batch_size": [2], "max_queue_delay_microseconds": 100, "priority_levels": 3,
        "default_priority_level": 2,
        "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 5000000,
                                 "allow_timeout_override": True, "max_queue_size": 64},
        "priority_queue_policy": {"1": {"timeout_action": "REJECT", "default_timeout_microseconds": 2000000,
                                        "max_queue_size": 16}},
    },
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    "version_policy": {"specific": {"versions": [1]}},
}


def ragged_pbtxt(kind: str = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO") -> str:
    """Triton's ragged-batching example: a ragged INPUT and the batch_input that says where each
    request's elements end."""
    return f"""\
name: "segsum"
max_batch_size: 16
input [
  {{
    name: "INPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
    allow_ragged_batch: true
  }}
]
batch_input [
  {{
    kind: {kind}
    target_name: "OFFSETS"
    data_type: TYPE_INT32
    source_input: "INPUT"
  }}
]
output [
  {{
    name: "SUM"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: 20000
}}
"""


def ragged_json(kind: str = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO") -> dict:
    return {"name": "segsum", "max_batch_size": 16,
            "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
            "batch_input": [{"kind": kind, "target_name": ["OFFSETS"], "data_type": "TYPE_INT32",
                             "source_input": ["INPUT"]}],
            "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [1]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 20000}}


# No batch dim: the model takes its tensors as sent, although its graph's first dim is symbolic
# (left out, the field would be auto-completed to 64 from that graph).
UNBATCHED_PBTXT = """\
name: "twice"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
"""
UNBATCHED_JSON = {"name": "twice", "max_batch_size": 0,
                  "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
                  "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]}


def build_twice(repo: Path, config: str | dict | None, name: str = "twice") -> Path:
    """x [b, 4] -> y = 2x + 1; `config`: a config.pbtxt text, a config.json doc, or None."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])
    nodes = [helper.make_node("Mul", ["x", "two"], ["doubled"]), helper.make_node("Add", ["doubled", "one"], ["y"])]
    weights = {"two": np.array(2, np.float32), "one": np.array(1, np.float32)}
    model_path = write_model_dir(repo, name, make_model(name, nodes, [x], [y], weights),
                                 config if isinstance(config, dict) else None)
    if isinstance(config, str):
        (repo / name / "config.pbtxt").write_text(config)
    return model_path


def build_segsum(repo: Path, config: str | dict) -> Path:
    """tests/support/models.py's segment sum, its config replaced by `config` (pbtxt text or json doc)."""
    build_segment_sum(repo, "segsum")
    (repo / "segsum" / "config.json").unlink()
    if isinstance(config, str):
        (repo / "segsum" / "config.pbtxt").write_text(config)
    else:
        (repo / "segsum" / "config.json").write_text(json.dumps(config))
    return repo / "segsum" / "1" / "model.onnx"


def as_pbtxt(repo: Path, name: str, text: str) -> None:
    """Replace `<repo>/<name>/config.json` by `text` as config.pbtxt."""
    (repo / name / "config.json").unlink(missing_ok=True)
    (repo / name / "config.pbtxt").write_text(text)


__all__ = ["BATCHING_JSON", "BATCHING_PBTXT", "UNBATCHED_JSON", "UNBATCHED_PBTXT", "as_pbtxt", "build_segsum",
           "build_twice", "ragged_json", "ragged_pbtxt"]
