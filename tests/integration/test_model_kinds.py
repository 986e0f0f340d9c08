"""Models that do not batch the usual way, served by the real stack."""
from __future__ import annotations

import asyncio

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.models import build_op_switch, build_segment_sum, build_unbatched
from tests.support.stack import running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kinds_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("kinds")
    build_unbatched(repo)
    build_segment_sum(repo)
    build_op_switch(repo)
    with running_stack(repo) as stack:
        yield stack, repo


def tensor(name: str, array: np.ndarray, datatype: str) -> dict:
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": array.ravel().tolist()}


async def post_all(url: str, model: str, bodies: list[dict], clients: int) -> list[httpx.Response]:
    semaphore = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as http:
        async def one(body: dict) -> httpx.Response:
            async with semaphore:
                return await http.post(f"/v2/models/{model}/infer", json=body)
        return await asyncio.gather(*(one(b) for b in bodies))


def outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def test_max_batch_size_0_takes_tensors_as_sent_one_execution_each(kinds_stack) -> None:
    stack, repo = kinds_stack
    status, meta = stack.get("/v2/models/unbatched")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [4, 8]}]  # no batch dim
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(48)]
    before = stack.metric("ringserve_batch_size_count", model="unbatched")
    responses = asyncio.run(post_all(stack.url, "unbatched", [{"inputs": [tensor("x", x, "FP32")]} for x in xs], 16))
    session = ort.InferenceSession(str(repo / "unbatched/1/model.onnx"), providers=["CPUExecutionProvider"])
    for x, r in zip(xs, responses):
        np.testing.assert_allclose(outputs(r)["y"], session.run(None, {"x": x})[0], atol=1e-6)
    assert stack.metric("ringserve_batch_size_count", model="unbatched") - before == len(xs)
    status, doc = stack.post("/v2/models/unbatched/infer", {"inputs": [tensor("x", np.zeros((1, 4, 8), np.float32), "FP32")]})
    assert status == 400 and "[4,8]" in doc["error"]


def test_ragged_segment_sum_batches_and_equals_each_request_alone(kinds_stack) -> None:
    stack, repo = kinds_stack
    rng = np.random.default_rng(2)
    # Small integers: float32 sums are exact, whatever the order of accumulation.
    pieces = [rng.integers(-10, 10, (1, int(rng.integers(1, 40)))).astype(np.float32) for _ in range(64)]
    before = stack.metric("ringserve_batch_size_count", model="segsum")
    bodies = [{"inputs": [tensor("INPUT", p, "FP32")]} for p in pieces]
    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "segsum", bodies, 32)))
    session = ort.InferenceSession(str(repo / "segsum/1/model.onnx"), providers=["CPUExecutionProvider"])
    for piece, r in zip(pieces, responses):
        alone = session.run(None, {"INPUT": piece.ravel(), "OFFSETS": np.array([0, piece.size], np.int32)})[0]
        np.testing.assert_array_equal(outputs(r)["SUM"], alone)
        assert outputs(r)["SUM"].shape == (1, 1)
    batches = stack.metric("ringserve_batch_size_count", model="segsum") - before
    assert batches < len(pieces)  # requests of different lengths did share executions


def test_op_switch_requests_never_share_an_execution(kinds_stack) -> None:
    stack, repo = kinds_stack
    rng = np.random.default_rng(3)
    cases = [(rng.standard_normal((1, 4)).astype(np.float32), np.array([[i % 2]], np.int64)) for i in range(96)]
    bodies = [{"inputs": [tensor("x", x, "FP32"), tensor("OP", op, "INT64")]} for x, op in cases]
    before = stack.metric("ringserve_batch_size_count", model="opswitch")
    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "opswitch", bodies, 32)))
    for (x, op), r in zip(cases, responses):
        out = outputs(r)
        assert out["SPREAD"].tolist() == [[0]]  # the batch it ran in held one OP only
        np.testing.assert_allclose(out["y"], x + 100 if op[0, 0] else 2 * x, atol=1e-5)
    assert stack.metric("ringserve_batch_size_count", model="opswitch") - before < len(cases)
