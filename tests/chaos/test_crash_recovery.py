"""Worker deaths under load: real processes, real signals, real native crashes (ctypes)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.repository.demo import build_slow_model

from tests.support.stack import Stack, poll_for

pytestmark = pytest.mark.chaos

FAULTS = {"RINGSERVE_FAULT_INJECTION": "1"}
POISON_MESSAGE = ("the inference worker crashed (SIGSEGV) while running this request; "
                  "it was retried alone and crashed again")


def mlp_body(x: np.ndarray, **parameters: str) -> dict:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters:
        body["parameters"] = parameters
    return body


def output_of(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def set_batching(model_dir: Path, max_batch_size: int, max_queue_delay_us: int) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config["max_batch_size"] = max_batch_size
    config["dynamic_batching"] = {"max_queue_delay_microseconds": max_queue_delay_us}
    (model_dir / "config.json").write_text(json.dumps(config))


def wait_replaced(stack: Stack, old_pid: int, timeout_s: float) -> float:
    """Seconds until a worker other than old_pid is ready and the server says ready."""
    started = time.monotonic()

    def replaced() -> bool:
        status = stack.status()
        return status["ready"] and all(w["pid"] != old_pid and w["state"] == "ready" for w in status["workers"])

    poll_for(replaced, timeout_s, 0.01, f"worker {old_pid} to be replaced")
    return time.monotonic() - started


def test_no_request_is_lost_while_the_worker_keeps_dying(start_stack, demo_repo: Path) -> None:
    stack = start_stack(demo_repo, env=FAULTS)
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(16)]
    session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    expected = [session.run(None, {"x": x})[0] for x in inputs]
    lane = stack.lane("mlp")  # the worker that runs mlp's batches (the encoder has its own)
    before = stack.status()["workers"][lane]
    clients = 32
    sent = [0] * clients
    outcomes: list[tuple[int, int, dict]] = []
    recovery_s: list[float] = []
    chaos_over = asyncio.Event()
    after_recovery: list[int] = []  # statuses of the requests sent once the server was ready again

    async def infer(http: httpx.AsyncClient, c: int, i: int) -> int:
        sent[c] += 1
        r = await http.post("/v2/models/mlp/infer", json=mlp_body(inputs[i]))
        outcomes.append((i, r.status_code, r.json()))
        return r.status_code

    async def client(http: httpx.AsyncClient, c: int) -> None:
        # Clients keep sending until the chaos is over (a fixed count could be spent on 503s
        # during the outages), then each sends two more that must all succeed.
        k = 0
        while not chaos_over.is_set():
            await infer(http, c, (c + k) % len(inputs))
            k += 1
            await asyncio.sleep(0.01)
        for _ in range(2):
            after_recovery.append(await infer(http, c, (c + k) % len(inputs)))
            k += 1

    async def chaos(http: httpx.AsyncClient) -> tuple[int, dict]:
        for sig in (signal.SIGKILL, signal.SIGSEGV):
            await asyncio.to_thread(poll_for, lambda: len(outcomes) > 100 * (1 + len(recovery_s)), 30)
            pid = await asyncio.to_thread(stack.worker_pid, lane)
            os.kill(pid, sig)
            recovery_s.append(await asyncio.to_thread(wait_replaced, stack, pid, 10))
        r = await http.post("/v2/models/mlp/infer", json=mlp_body(inputs[0], ringserve_fault="segv"),
                            headers={"x-request-id": "the-poison"})
        await asyncio.to_thread(poll_for, lambda: stack.serves("mlp"), 10, 0.01,
                                "ready after the poison request")
        chaos_over.set()
        return r.status_code, r.json()

    async def run() -> tuple[int, dict]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60,
                                     limits=httpx.Limits(max_connections=clients + 1)) as http:
            *_, poisoned = await asyncio.gather(*(client(http, c) for c in range(clients)), chaos(http))
        return poisoned

    poisoned = asyncio.run(run())
    assert poisoned == (500, {"error": POISON_MESSAGE, "request_id": "the-poison"})
    assert len(outcomes) == sum(sent)  # exactly one response each; none dropped
    codes = [status for _, status, _ in outcomes]
    assert codes.count(200) > 100  # every answer before the first kill, at least
    assert after_recovery == [200] * (2 * clients)
    for i, status, doc in outcomes:
        if status == 200:
            np.testing.assert_allclose(output_of(doc), expected[i], atol=1e-5)
        else:
            assert status in (503, 504) and doc["error"], (status, doc)
    assert all(s < 2.0 for s in recovery_s), recovery_s
    poll_for(lambda: stack.serves("mlp"), 5, what="ready after the poison request")
    after = stack.status()["workers"][lane]
    deaths = {k: after["restarts"].get(k, 0) - before["restarts"].get(k, 0) for k in after["restarts"]}
    assert deaths["SIGKILL"] == 1
    assert deaths["SIGSEGV"] >= 3  # one from outside, at least max_attempts from the poison request
    assert set(deaths) == {"SIGKILL", "SIGSEGV"}
    assert after["generation"] - before["generation"] == sum(deaths.values())
    assert stack.metric("ringserve_poison_requests_total", model="mlp") == 1
    assert stack.metric("ringserve_worker_restarts_total", reason="SIGSEGV") == after["restarts"]["SIGSEGV"]


def test_batch_in_flight_when_the_worker_is_killed_is_answered_after_restart(start_stack, tmp_path: Path) -> None:
    build_slow_model(tmp_path / "slow", width=1024, layers=256)  # ~0.4 s per 64-row batch
    set_batching(tmp_path / "slow", 64, 500_000)
    stack = start_stack(tmp_path)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((8, 1024)).astype(np.float32) for _ in range(8)]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            sends = [asyncio.create_task(http.post("/v2/models/slow/infer", json=mlp_body(x))) for x in inputs]
            await asyncio.to_thread(poll_for, lambda: stack.status()["workers"][0]["in_flight_batches"] == 1,
                                    10, 0.005, "the batch to be in flight")
            os.kill(stack.worker_pid(), signal.SIGKILL)
            return await asyncio.gather(*sends)

    responses = asyncio.run(run())
    session = ort.InferenceSession(str(tmp_path / "slow/1/model.onnx"), providers=["CPUExecutionProvider"])
    for x, r in zip(inputs, responses):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(output_of(r.json()), session.run(None, {"x": x})[0], atol=1e-5)
    assert stack.metric("ringserve_batches_requeued_total", model="slow") == 1
    assert stack.metric("ringserve_worker_restarts_total", reason="SIGKILL") == 1


def test_poison_request_in_a_batch_of_nine_fails_alone(start_stack, demo_repo: Path, tmp_path: Path) -> None:
    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    set_batching(tmp_path / "mlp", 9, 2_000_000)  # the 9 requests below form one batch
    stack = start_stack(tmp_path, env=FAULTS)
    rng = np.random.default_rng(9)
    inputs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(9)]
    bodies = [mlp_body(x) for x in inputs]
    bodies[4] = mlp_body(inputs[4], ringserve_fault="segv")

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v2/models/mlp/infer", json=b) for b in bodies))

    responses = asyncio.run(run())
    session = ort.InferenceSession(str(tmp_path / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    for i, (x, r) in enumerate(zip(inputs, responses)):
        if i == 4:
            assert (r.status_code, r.json()) == (500, {"error": POISON_MESSAGE, "request_id": r.headers["x-request-id"]})
        else:
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(output_of(r.json()), session.run(None, {"x": x})[0], atol=1e-5)
    # ringserve_batch_size counts executions that came back, by the rows each ran: the halves that
    # succeeded hold the 8 good rows between them (no execution that held the poison ever returned).
    assert stack.metric("ringserve_batch_size_sum", model="mlp") == 8
    assert stack.metric("ringserve_batch_size_count", model="mlp") >= 2
    assert stack.metric("ringserve_poison_requests_total", model="mlp") == 1
    assert stack.status()["workers"][0]["restarts"]["SIGSEGV"] >= 2


def test_hung_worker_is_killed_and_replaced(start_stack, demo_repo: Path) -> None:
    hang_timeout_s = 2.0
    stack = start_stack(demo_repo, "--hang-timeout-s", str(hang_timeout_s), env=FAULTS)
    lane = stack.lane("mlp")  # the worker that runs mlp's batches (the encoder has its own)
    pid = stack.worker_pid(lane)
    os.kill(pid, signal.SIGSTOP)
    assert wait_replaced(stack, pid, hang_timeout_s + 2) < hang_timeout_s + 2
    assert stack.status()["workers"][lane]["last_exit"]["reason"] == "hung"
    # A native call that holds the GIL: no heartbeats, so it is a hang too; alone, it is isolated.
    status, doc = stack.post("/v2/models/mlp/infer", mlp_body(np.zeros((1, 512), np.float32), ringserve_fault="hang"))
    assert status == 500 and "crashed (hung)" in doc["error"]
    assert stack.status()["workers"][lane]["restarts"] == {"hung": 3}
    poll_for(lambda: stack.serves("mlp"), hang_timeout_s + 2, what="the third replacement")
    assert stack.post("/v2/models/mlp/infer", mlp_body(np.zeros((1, 512), np.float32)))[0] == 200


def test_model_that_crashes_on_load_is_quarantined_others_keep_serving_and_a_load_retries_it(
        start_stack, demo_repo: Path, tmp_path: Path) -> None:
    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    crashy = shutil.copytree(demo_repo / "mlp", tmp_path / "crashy")
    config = json.loads((crashy / "config.json").read_text())
    config["name"] = "crashy"
    config["parameters"] = {"ringserve_fault_on_load": {"string_value": "segv"}}
    (crashy / "config.json").write_text(json.dumps(config))
    stack = start_stack(tmp_path, env=FAULTS)
    assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
    status, doc = stack.post("/v2/models/crashy/infer", mlp_body(np.ones((1, 512), np.float32)))
    assert status == 503 and "quarantined" in doc["error"] and "while loading" in doc["error"]
    assert stack.get("/v2/models/crashy/ready")[0] == 503
    assert stack.get("/v2/models/mlp/ready")[0] == 200
    assert stack.metric("ringserve_model_quarantined", model="crashy") == 1
    assert stack.metric("ringserve_model_quarantined", model="mlp") == 0
    assert stack.status()["workers"][0]["restarts"] == {"SIGSEGV": 3}

    # Fixed on disk and loaded through the repository API: the quarantine is lifted in the gateway
    # and in the supervisor, the workers are replaced by ones that load it, and it serves.
    del config["parameters"]
    (crashy / "config.json").write_text(json.dumps(config))
    status, doc = stack.post("/v2/repository/models/crashy/load", {})
    assert status == 200, doc
    poll_for(lambda: stack.get("/v2/models/crashy/ready")[0] == 200, 30, what="crashy loaded by new workers")
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    status, doc = stack.post("/v2/models/crashy/infer", mlp_body(x))
    session = ort.InferenceSession(str(crashy / "1/model.onnx"), providers=["CPUExecutionProvider"])
    assert status == 200 and np.allclose(output_of(doc), session.run(None, {"x": x})[0], atol=1e-5)
    assert stack.metric("ringserve_model_quarantined", model="crashy") == 0
    assert stack.status()["workers"][0]["restarts"] == {"SIGSEGV": 3, "reload": 1}
    assert stack.post("/v2/models/mlp/infer", mlp_body(x))[0] == 200


def test_a_load_that_lifts_a_poison_quarantine_starts_the_poison_count_again(start_stack, demo_repo: Path) -> None:
    """3 requests isolated as poison within the window quarantine their model; a repository load lifts
    the quarantine, and the next poison request is the count's first, not its fourth."""
    stack = start_stack(demo_repo, "--max-attempts", "1", env=FAULTS)  # one crash isolates a request alone
    x = np.ones((1, 512), np.float32)
    for _ in range(3):
        poll_for(lambda: stack.serves("mlp"), 30, what="a worker to send the next poison request to")
        assert stack.post("/v2/models/mlp/infer", mlp_body(x, ringserve_fault="segv"))[0] == 500
    status, doc = stack.post("/v2/models/mlp/infer", mlp_body(x))
    assert status == 503 and "quarantined" in doc["error"]

    assert stack.post("/v2/repository/models/mlp/load", {})[0] == 200
    poll_for(lambda: stack.post("/v2/models/mlp/infer", mlp_body(x))[0] == 200, 30, what="the quarantine lifted")
    poll_for(lambda: stack.metric("ringserve_model_quarantined", model="mlp") == 0, 10, what="every gateway lifted it")
    status, doc = stack.post("/v2/models/mlp/infer", mlp_body(x, ringserve_fault="segv"))

    assert status == 500 and "crashed (SIGSEGV)" in doc["error"], doc
    poll_for(lambda: stack.serves("mlp"), 30, what="a replacement worker")
    status, doc = stack.post("/v2/models/mlp/infer", mlp_body(x))
    assert status == 200, doc  # one poison request since the load: not quarantined again
    assert stack.metric("ringserve_model_quarantined", model="mlp") == 0
