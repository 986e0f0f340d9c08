"""A worker that replaces a killed one warms its models before it takes traffic (Triton's model_warmup)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.stack import poll_for
from tests.support.warmup_models import build_slow_first, executes

pytestmark = pytest.mark.chaos


def body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def test_a_replacement_worker_runs_the_warmup_before_its_first_request(start_stack, tmp_path: Path) -> None:
    model_dir = build_slow_first(tmp_path, first_run_s=3.0, batch_size=1, count=1)
    stack = start_stack(tmp_path)
    old = stack.worker_pid()
    assert stack.post("/v2/models/slow_first/infer", body(np.ones((1, 4), np.float32)))[0] == 200

    os.kill(old, signal.SIGKILL)
    poll_for(lambda: stack.status()["ready"] and stack.worker_pid() != old, 60, what="a replacement worker")
    new = stack.worker_pid()
    started = time.monotonic()
    status, doc = stack.post("/v2/models/slow_first/infer", body(np.ones((1, 4), np.float32)))
    first_s = time.monotonic() - started

    assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 4
    assert [(kind, n) for pid, kind, n in executes(model_dir) if pid == new] == [("warm", 1), ("real", 1)]
    assert first_s < 2.0  # its cold first run (3 s) was the warm-up's, before the worker was ready
