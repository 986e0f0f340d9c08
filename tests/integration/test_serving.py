"""The real stack end to end: real processes, HTTP, shared memory, ZeroMQ and ORT."""
from __future__ import annotations

import asyncio
import signal
import tempfile
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.stack import Stack, held_requests, poll_for, running_stack, shm_segments

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(demo_repo: Path):
    with running_stack(demo_repo) as s:
        yield s


def local_session(repo: Path, model: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def make_cases(count: int, seed: int = 7) -> list[tuple[str, dict, dict[str, np.ndarray]]]:
    """(model, request body, inputs) — mlp and encoder alternating, encoder at several lengths."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        if i % 2 == 0:
            x = rng.standard_normal((1, 512)).astype(np.float32)
            body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": x.ravel().tolist()}]}
            cases.append(("mlp", body, {"x": x}))
        else:
            seq = int(rng.choice([3, 8, 17, 40]))
            ids = rng.integers(0, 1000, (1, seq), dtype=np.int64)
            mask = np.ones((1, seq), dtype=np.int64)
            mask[0, rng.integers(1, seq + 1):] = 0  # trailing padding on some rows
            body = {"inputs": [
                {"name": "input_ids", "shape": [1, seq], "datatype": "INT64", "data": ids.ravel().tolist()},
                {"name": "attention_mask", "shape": [1, seq], "datatype": "INT64", "data": mask.ravel().tolist()}]}
            cases.append(("encoder", body, {"input_ids": ids, "attention_mask": mask}))
    return cases


async def send_all(url: str, cases: list, clients: int) -> list[tuple[int, dict]]:
    results: list = [None] * len(cases)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(len(cases)):
        queue.put_nowait(i)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            model, body, _ = cases[i]
            r = await http.post(f"/v2/models/{model}/infer", json=body)
            results[i] = (r.status_code, r.json())

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return results


def test_concurrent_clients_get_their_own_correct_answers(stack: Stack, demo_repo: Path) -> None:
    cases = make_cases(240)
    batches_before = stack.metric("ringserve_batch_size_count", model="mlp")
    # Until all 32 are held: 16 of them mlp, behind at most 2 batches in flight, so mlp requests share
    # a batch whatever the arrival order. (Waiting for an mlp queue of 2 failed when all 16 arrived in
    # one loop step and went out as one batch: nothing was left to queue.)
    results = stack.send_while_stopped(lambda: asyncio.run(send_all(stack.url, cases, clients=32)),
                                       until=lambda status: held_requests(status) >= 32)
    sessions = {m: local_session(demo_repo, m) for m in ("mlp", "encoder")}
    for (model, _, inputs), (status, doc) in zip(cases, results):
        assert status == 200, doc
        (out,) = doc["outputs"]
        expected = sessions[model].run(None, inputs)[0]
        assert out["shape"] == list(expected.shape)
        np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(expected.shape), expected,
                                   rtol=0, atol=1e-5)
    # Batching happened: fewer mlp batches than mlp requests, and some batch held more than one row.
    mlp_batches = stack.metric("ringserve_batch_size_count", model="mlp") - batches_before
    assert 0 < mlp_batches < 120
    assert stack.metric("ringserve_batch_size_bucket", model="mlp", le="1.0") < stack.metric(
        "ringserve_batch_size_count", model="mlp")
    assert stack.metric("ringserve_requests_total", model="encoder", code="200") >= 120


def test_multi_row_request_and_requested_outputs(stack: Stack, demo_repo: Path) -> None:
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    status, doc = stack.post("/v2/models/mlp/versions/1/infer", {
        "id": "req-42", "inputs": [{"name": "x", "shape": [5, 512], "datatype": "FP32", "data": x.tolist()}],
        "outputs": [{"name": "y"}]})
    assert status == 200, doc
    assert doc["id"] == "req-42" and doc["model_name"] == "mlp" and doc["model_version"] == "1"
    expected = local_session(demo_repo, "mlp").run(None, {"x": x})[0]
    np.testing.assert_allclose(np.asarray(doc["outputs"][0]["data"], np.float32).reshape(5, 10), expected, atol=1e-5)


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    ({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}, 400, "[-1,512]"),
    ({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "INT32", "data": [0] * 512}]}, 400, "expects FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0] * 10}]}, 400, "needs 512 values"),
    ({"inputs": [{"name": "x", "shape": [65, 512], "datatype": "FP32", "data": [0] * 65 * 512}]}, 400, "max_batch_size 64"),
    ({"inputs": [{"name": "z", "shape": [1, 512], "datatype": "FP32", "data": [0] * 512}]}, 400, "takes: x (FP32 [-1,512])"),
    ({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": ["a"] * 512}]}, 400, "not a FP32 tensor"),
])
def test_bad_input_gets_4xx_that_says_what_is_accepted(stack: Stack, body, status: int, fragment: str) -> None:
    before = stack.status()["workers"][0]["batches_done"]
    got, doc = stack.post("/v2/models/mlp/infer", body)
    assert got == status
    assert fragment in doc["error"]
    assert stack.status()["workers"][0]["batches_done"] == before  # never reached the worker


def test_http_surface(stack: Stack) -> None:
    assert stack.get("/v2/health/live") == (200, {"live": True})
    assert stack.get("/v2/health/ready") == (200, {"ready": True})
    assert stack.get("/v2")[1]["name"] == "ringserve"
    status, meta = stack.get("/v2/models/encoder")
    assert status == 200
    assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                              {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]
    assert stack.get("/v2/models/mlp/versions/1/ready") == (200, {"name": "mlp", "ready": True})
    status, doc = stack.get("/v2/models/nope")
    assert status == 404 and "models: encoder, mlp" in doc["error"]
    assert stack.get("/v2/models/mlp/versions/9")[0] == 404
    assert stack.post("/v2/models/nope/infer", {"inputs": []})[0] == 404
    workers = stack.status()["workers"]
    # (one worker, or with --lanes model one per demo model: supervision/lanes.py)
    assert [(w["index"], w["state"], w["generation"]) for w in workers] == [(i, "ready", 1) for i in range(len(workers))]
    assert set(workers[0]) >= {"pid", "generation", "state", "restarts", "last_exit"}
    text = stack.get("/metrics")[1]
    for name in ("ringserve_requests_total", "ringserve_batch_size_bucket", "ringserve_queue_seconds_bucket",
                 "ringserve_compute_seconds_bucket", "ringserve_queue_depth", "ringserve_worker_up"):
        assert name in text


def test_request_larger_than_a_slot_gets_413(start_stack, demo_repo: Path) -> None:
    # 1 MiB slots: 64 rows of mlp fit (128 KiB), but a 40x4096-token encoder request does not.
    small = start_stack(demo_repo, "--slot-mb", "1", "--slot-count", "2")
    ids = [[1] * 4096] * 40
    status, doc = small.post("/v2/models/encoder/infer", {"inputs": [
        {"name": "input_ids", "shape": [40, 4096], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [40, 4096], "datatype": "INT64", "data": ids}]})
    assert status == 413
    assert "one batch slot holds" in doc["error"] and "--slot-mb" in doc["error"]


def test_sigterm_stops_everything_and_exits_0(demo_repo: Path) -> None:
    stack = Stack(demo_repo).start()
    try:
        assert shm_segments(stack.pid)
        assert len(stack.seen_pids) >= 2
        assert stack.stop(signal.SIGTERM) == 0
        stack.assert_nothing_left()
    finally:
        stack.kill_everything()


def test_supervisor_sigkill_takes_children_and_next_start_sweeps(demo_repo: Path) -> None:
    stack = Stack(demo_repo).start()
    try:
        runtime_dirs = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(f"ringserve-{stack.pid}-")]
        assert len(runtime_dirs) == 1 and oct(runtime_dirs[0].stat().st_mode & 0o777) == "0o700"
        stack.stop(signal.SIGKILL)
        poll_for(lambda: stack.leftovers()[0] == [], 10, what="children to die with their supervisor")
    finally:
        stack.kill_everything()
    # What a SIGKILLed supervisor could not remove, the next start does.
    stale = Path("/dev/shm") / f"ringserve-{stack.pid}-ring"
    if not stale.exists():
        stale.write_bytes(b"")  # stand in for a segment the resource tracker did not get to
    second = Stack(demo_repo).start()
    try:
        assert not stale.exists()
        assert not runtime_dirs[0].exists()
    finally:
        second.stop()
        second.kill_everything()
    second.assert_nothing_left()
    assert shm_segments(stack.pid) == []
