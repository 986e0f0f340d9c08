"""A Python model's inputs are its own to write (Triton's `as_numpy()` is writable), and what it writes
never reaches the slot: a replay after a batch-mate's crash runs on the bytes the client sent."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.python_models import fp32, write_python_model

pytestmark = pytest.mark.chaos

# Triton's docs preprocess in place: pixels to [0, 1], then the answer is computed from them.
SCALES_IN_PLACE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            x /= 255
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + 1)]))
        return responses
"""

# Every request's x doubled in place first (setflags: a model that forces its way past a read-only
# view), y = the doubled x; then a request with parameter crash=true kills the worker natively, after
# its batch-mates' inputs were written. Every execute appends its batch size to <model dir>/executes.log.
DOUBLES_THEN_CRASHES = """
import ctypes
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executes.log")

    def execute(self, requests):
        with open(self.log, "a") as f:
            f.write(f"{len(requests)}\\n")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            x.setflags(write=True)
            x *= 2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.copy())]))
        if any(json.loads(r.parameters()).get("crash") for r in requests):
            ctypes.string_at(0)
        return responses
"""


def body(x: np.ndarray, **parameters) -> dict:
    doc: dict = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters:
        doc["parameters"] = parameters
    return doc


async def post_all(url: str, model: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        return await asyncio.gather(*(http.post(f"/v2/models/{model}/infer", json=b) for b in bodies))


def y_of(response: httpx.Response) -> np.ndarray:
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def test_a_model_py_that_scales_its_input_in_place_answers_right(start_stack, tmp_path: Path) -> None:
    write_python_model(tmp_path, "scales", SCALES_IN_PLACE, {
        "max_batch_size": 8, "input": [fp32("x", [4])], "output": [fp32("y", [4])],
        "dynamic_batching": {"max_queue_delay_microseconds": 500_000}})
    stack = start_stack(tmp_path)
    xs = [np.arange(4 * i, 4 * i + 4, dtype=np.float32).reshape(1, 4) * 10 for i in range(4)]

    responses = asyncio.run(post_all(stack.url, "scales", [body(x) for x in xs]))

    for x, r in zip(xs, responses):
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(y_of(r), x / np.float32(255) + 1)
    assert stack.metric("ringserve_batch_size_count", model="scales") < len(xs)  # they shared batches


# 4 floats a request: copies; 2**18 (1 MiB): a copy-on-write mapping of the slot (PRIVATE_MAPPING_MIN_BYTES).
@pytest.mark.parametrize("width", [4, 1 << 18], ids=["copied", "mapped"])
def test_a_replay_after_a_batch_mates_crash_runs_on_the_bytes_the_client_sent(start_stack, tmp_path: Path,
                                                                               width: int) -> None:
    write_python_model(tmp_path, "doubles", DOUBLES_THEN_CRASHES, {
        "max_batch_size": 2, "input": [fp32("x", [width])], "output": [fp32("y", [width])],
        "dynamic_batching": {"max_queue_delay_microseconds": 2_000_000}})  # the two requests form one batch
    stack = start_stack(tmp_path)
    innocent = np.resize(np.array([1.5, -2.0, 3.25, 1e6], np.float32), (1, width))
    poisoned = np.full((1, width), 7.0, np.float32)

    ok, crashed = asyncio.run(post_all(stack.url, "doubles", [body(innocent), body(poisoned, crash=True)]))

    assert crashed.status_code == 500 and "crashed (SIGSEGV)" in crashed.json()["error"], crashed.text
    assert ok.status_code == 200, ok.text
    np.testing.assert_array_equal(y_of(ok), innocent * np.float32(2))
    executes = [int(n) for n in (tmp_path / "doubles" / "executes.log").read_text().split()]
    assert executes[:2] == [2, 2]  # the whole batch ran twice (replayed once) before it was split
    assert stack.status()["workers"][0]["restarts"]["SIGSEGV"] >= 3
