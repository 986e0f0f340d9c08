"""Small ONNX models for the model lifecycle tests (and bench/lifecycle.py).

`build_versioned`: x [batch, 4] -> y [batch, 1] = sum(x) + version, over a weight matrix of
`weight_bytes` (the memory each loaded copy takes), so a test can tell versions apart by the
answer and size a memory budget by the footprint.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 4


def versioned_model(name: str, version: int, weight_bytes: int):
    columns = max(1, weight_bytes // (4 * WIDTH))
    weights = {"w": np.full((WIDTH, columns), 1.0 / columns, np.float32),
               "axis": np.array([1], np.int64), "version": np.array([float(version)], np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["spread"]),
             helper.make_node("ReduceSum", ["spread", "axis"], ["total"], keepdims=1),
             helper.make_node("Add", ["total", "version"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])
    return make_model(name, nodes, [x], [y], weights)


def build_versioned(repo: Path, name: str, versions: tuple[int, ...] = (1,), *, weight_bytes: int = 1 << 20,
                    **config: Any) -> Path:
    """`<repo>/<name>/<v>/model.onnx` for each version, and a config.json with `config` merged in."""
    doc = {"max_batch_size": 64,
           "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
           "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
           "dynamic_batching": {}, **config}
    for version in versions:
        model = versioned_model(name, version, weight_bytes)
        onnx.checker.check_model(model)
        path = Path(repo) / name / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
    (Path(repo) / name / "config.json").write_text(json.dumps(doc, indent=2))
    return Path(repo) / name


def build_corrupt(repo: Path, name: str) -> Path:
    """A model whose config.json is complete but whose model.onnx is not ONNX at all."""
    build_versioned(repo, name, weight_bytes=64)
    (Path(repo) / name / "1" / "model.onnx").write_bytes(b"this is not an ONNX model\n" * 8)
    return Path(repo) / name


def infer_body(rows: int = 1, value: float = 1.0) -> dict:
    return {"inputs": [{"name": "x", "shape": [rows, WIDTH], "datatype": "FP32", "data": [value] * (rows * WIDTH)}]}


def measured_footprint(repo: Path, key: str) -> int:
    """What a worker measures for one model version, measured the same way: as the first load of a
    fresh process, as a worker's eager load is. Measured in the test process, whose heap already
    holds what earlier tests freed, it came out up to 1.5x smaller than the worker's, and a budget
    of 1.5x it then held neither of two models meant to fit one at a time."""
    code = "import sys; from tests.support.lifecycle_models import _first_load_footprint as f; print(f(sys.argv[1], sys.argv[2]))"
    run = subprocess.run([sys.executable, "-c", code, str(repo), key], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    return int(run.stdout.split()[-1])


def _first_load_footprint(repo: str, key: str) -> int:
    from ringserve.common.repository.scan import scan_repository
    from ringserve.worker.footprint import one_heap
    from ringserve.worker.models import ModelRegistry
    from ringserve.worker.onnx_model import OnnxModel
    from ringserve.worker.session import CPU, prime_runtime

    from tests.support.models import session_settings

    one_heap()
    settings = session_settings()
    prime_runtime(settings, [CPU])
    (config,) = [c for c in scan_repository(Path(repo)).all_versions() if c.key == key]
    registry = ModelRegistry([config], open_session=lambda c: OnnxModel(c, settings, [CPU]))
    entry = registry.acquire(config.name, config.version)
    registry.release(entry)
    return entry.memory_bytes
