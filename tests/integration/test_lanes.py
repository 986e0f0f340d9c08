"""Lanes: each model's batches run in worker processes of its own (supervision/lanes.py).

A slow model no longer delays a fast one, instance_group's count runs that many executions at once, and
a crash in one model's lane costs other models nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.repository.demo import build_demo_models
from tests.support.python_models import build_pipeline, fp32, preprocess_then_mlp, write_python_model
from tests.support.stack import Stack, poll_for, running_stack

from .test_model_kinds import outputs, post_all, tensor

pytestmark = pytest.mark.integration

SLEEPER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = time.time()
        time.sleep({sleep_s})
        ended = time.time()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", np.array([started, ended], np.float64))])
                for _ in requests]
"""


def sleeper(repo: Path, name: str, sleep_s: float, count: int | None = None) -> None:
    config = {
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "SPAN", "data_type": "TYPE_FP64", "dims": [2]}],
    }
    if count is not None:
        config["instance_group"] = [{"kind": "KIND_CPU", "count": count}]
    write_python_model(repo, name, SLEEPER.format(sleep_s=sleep_s), config)


def infer(stack: Stack, model: str, doc: dict, timeout_s: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(f"{stack.url}/v2/models/{model}/infer", data=json.dumps(doc).encode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SLEEPER_DOC = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
MLP_DOC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": [0.5] * 512}]}


def fast_latency_ms(stack: Stack, samples: int = 30) -> float:
    latencies = []
    for _ in range(samples):
        started = time.perf_counter()
        assert infer(stack, "mlp", MLP_DOC)[0] == 200
        latencies.append(1e3 * (time.perf_counter() - started))
    return statistics.median(latencies)


@pytest.mark.parametrize("lanes", ["model", "shared"])
def test_a_fast_model_beside_a_busy_slow_one(tmp_path: Path, lanes: str):
    build_demo_models(tmp_path)
    sleeper(tmp_path, "slow", 0.2)
    stop = threading.Event()
    with running_stack(tmp_path, "--lanes", lanes) as stack:
        alone_ms = fast_latency_ms(stack)

        def keep_busy() -> None:
            while not stop.is_set():
                infer(stack, "slow", SLEEPER_DOC)

        busy = [threading.Thread(target=keep_busy) for _ in range(4)]
        for t in busy:
            t.start()
        try:
            time.sleep(0.5)
            beside_ms = fast_latency_ms(stack)
        finally:
            stop.set()
            for t in busy:
                t.join(30)
    if lanes == "model":  # its own lane: what it costs alone, give or take a loaded 2-core machine's noise
        assert beside_ms < alone_ms + 50, (alone_ms, beside_ms)
    else:  # one worker for both: the fast model's batches wait behind 200 ms executions
        assert beside_ms > alone_ms + 50, (alone_ms, beside_ms)


def test_instance_group_count_two_runs_two_executions_at_once(tmp_path: Path):
    sleeper(tmp_path, "twice", 1.0, count=2)
    with running_stack(tmp_path, "--lanes", "model") as stack:
        # its two lanes (the server is ready once one lane has the model: the other may not be known yet)
        poll_for(lambda: [w["state"] for w in stack.status()["workers"]] == ["ready", "ready"], 60,
                 what="both lanes ready")
        spans: list[list[float]] = []

        def call() -> None:
            status, answer = infer(stack, "twice", SLEEPER_DOC)
            assert status == 200
            spans.append(answer["outputs"][0]["data"])

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    (a_start, a_end), (b_start, b_end) = spans
    assert max(a_start, b_start) < min(a_end, b_end), spans  # the two executions overlapped


def test_a_crash_in_one_models_lane_costs_other_models_nothing(tmp_path: Path):
    build_demo_models(tmp_path)
    failures: list[tuple[int, dict]] = []
    answered = [0]
    stop = threading.Event()
    env = {"RINGSERVE_FAULT_INJECTION": "1"}
    with running_stack(tmp_path, "--lanes", "model", "--warm-spare=false", env=env) as stack:
        workers = {tuple(sorted(w["models"])): w for w in stack.status()["workers"]}
        mlp_pid = workers[("mlp",)]["pid"]

        def keep_serving_mlp() -> None:
            while not stop.is_set():
                status, answer = infer(stack, "mlp", MLP_DOC)
                if status != 200:
                    failures.append((status, answer))
                answered[0] += 1

        serving = threading.Thread(target=keep_serving_mlp)
        serving.start()
        try:
            encoder = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 8], "data": [1] * 8},
                                  {"name": "attention_mask", "datatype": "INT64", "shape": [1, 8], "data": [1] * 8}],
                       "parameters": {"ringserve_fault": "segv"}}
            status, _ = infer(stack, "encoder", encoder)
            assert status == 500  # the poison request, isolated (it crashed its lane twice)
            poll_for(lambda: stack.is_ready(), 60, what="the encoder's lane back")
        finally:
            stop.set()
            serving.join(30)
        after = {tuple(sorted(w["models"])): w for w in stack.status()["workers"]}
    assert failures == [] and answered[0] > 0
    assert after[("mlp",)]["pid"] == mlp_pid and after[("mlp",)]["restarts_total"] == 0
    assert after[("encoder",)]["restarts_total"] >= 1



# A BLS caller in a lane of its own: per request parameters.mode says how it calls mlp (another lane):
# "sync" one exec(), "async" two async_exec() gathered (their sum), "fault" one exec() whose BLS request
# carries ringserve_fault=segv (the mlp lane crashes on it, never this one).
CALLER = """
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def ask(x, parameters=None):
    return pb_utils.InferenceRequest(model_name="mlp", requested_output_names=["y"], inputs=[x],
                                     parameters=parameters or {})


class Failed(Exception):
    pass


def y_of(answer):
    if answer.has_error():
        raise Failed(answer.error().message())
    return pb_utils.get_output_tensor_by_name(answer, "y").as_numpy()


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x")
            mode = json.loads(request.parameters() or "{}").get("mode", "sync")
            try:
                if mode == "async":
                    a, b = await asyncio.gather(ask(x).async_exec(), ask(x).async_exec())
                    y = y_of(a) + y_of(b)
                elif mode == "fault":
                    y = y_of(ask(x, {"ringserve_fault": "segv"}).exec())
                else:
                    y = y_of(ask(x).exec())
            except Failed as exc:  # this request's error alone (the batch's others are answered)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""

# N -> N, by N BLS calls of itself (one lane: each is run in the process, never waits for its own lane)
COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            if n > 0:
                inner = pb_utils.InferenceRequest(
                    model_name="countdown", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("N", np.array([n - 1], np.int32))]).exec()
                if inner.has_error():
                    raise pb_utils.TritonModelException(inner.error().message())
                n = int(pb_utils.get_output_tensor_by_name(inner, "OUT").as_numpy()[0]) + 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
        return responses
"""


def calls_repo(repo: Path) -> Path:
    demo = repo.parent / "demo"
    build_demo_models(demo)
    shutil.copytree(demo / "mlp", repo / "mlp")
    build_pipeline(repo)
    for name in ("bls_mlp", "bls_lazy", "mlp_lazy"):  # (build_pipeline's BLS models: `caller` is this test's)
        shutil.rmtree(repo / name, ignore_errors=True)
    write_python_model(repo, "caller", CALLER, {"max_batch_size": 8, "input": [fp32("x", [512])],
                                                "output": [fp32("y", [10])], "dynamic_batching": {}})
    write_python_model(repo, "countdown", COUNTDOWN, {
        "max_batch_size": 0, "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        "input": [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]})
    return repo


def caller_doc(x: np.ndarray, mode: str) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
            "parameters": {"mode": mode}}


def test_bls_calls_and_ensemble_steps_reach_models_in_other_lanes_through_the_gateway(tmp_path: Path):
    repo = calls_repo(tmp_path / "repo")
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(6)]
    raws = [rng.integers(0, 256, (2, 512)).astype(np.uint8) for _ in range(4)]
    session = ort.InferenceSession(str(repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    with running_stack(repo, "--lanes", "model", "--warm-spare=false") as stack:
        lanes = sorted(tuple(w["models"]) for w in stack.status()["workers"])
        assert lanes == [("caller",), ("countdown",), ("mlp",), ("pipeline",), ("preprocess",)]
        before = stack.metric("ringserve_batch_size_count", model="mlp")

        sync = asyncio.run(post_all(stack.url, "caller", [caller_doc(x, "sync") for x in xs], 6))
        gathered = asyncio.run(post_all(stack.url, "caller", [caller_doc(x, "async") for x in xs], 6))
        piped = asyncio.run(post_all(stack.url, "pipeline", [{"inputs": [tensor("IMAGE", r, "UINT8")]} for r in raws], 4))
        status, counted = stack.post("/v2/models/countdown/infer",
                                     {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [5]}]})

        # every call ran in mlp's own lane (its batches), none in the caller's process
        assert stack.metric("ringserve_batch_size_count", model="mlp") - before >= 1
        assert stack.metric("ringserve_requests_total", model="mlp", code="200") >= 2 * len(xs) + len(raws)
    for x, r in zip(xs, sync):
        np.testing.assert_allclose(outputs(r)["y"], session.run(None, {"x": x})[0], atol=1e-5)
    for x, r in zip(xs, gathered):
        np.testing.assert_allclose(outputs(r)["y"], 2 * session.run(None, {"x": x})[0], atol=1e-5)
    for raw, r in zip(raws, piped):
        np.testing.assert_allclose(outputs(r)["SCORES"], preprocess_then_mlp(repo / "mlp/1/model.onnx", raw), atol=1e-5)
    assert status == 200 and counted["outputs"][0]["data"] == [5]  # a lane that calls itself waits for no lane


def test_a_bls_call_that_crashes_its_target_lane_fails_alone_and_costs_the_caller_nothing(tmp_path: Path):
    repo = calls_repo(tmp_path / "repo")
    x = np.random.default_rng(4).standard_normal((1, 512)).astype(np.float32)
    raw = {"inputs": [tensor("RAW", np.full((1, 512), 7, np.uint8), "UINT8")]}
    env = {"RINGSERVE_FAULT_INJECTION": "1"}
    # (the hold: mlp's own clients that arrive while its lane restarts wait for it, as its BLS calls do)
    with running_stack(repo, "--lanes", "model", "--warm-spare=false", "--hold-when-unavailable-s", "20",
                       env=env) as stack:
        workers = {tuple(w["models"]): w for w in stack.status()["workers"]}

        async def poison_among_good() -> list:
            return await asyncio.gather(post_all(stack.url, "caller", [caller_doc(x, "fault")], 1),
                                        post_all(stack.url, "caller", [caller_doc(x, "sync")] * 6, 3),
                                        post_all(stack.url, "mlp", [MLP_DOC] * 6, 3),
                                        post_all(stack.url, "preprocess", [raw] * 12, 2))

        (poisoned,), good_calls, good_mlp, other_lane = asyncio.run(poison_among_good())
        poll_for(lambda: stack.is_ready(), 60, what="the mlp lane back")
        # each lane's memory (the supervisor samples it once a second), busy time and pid
        poll_for(lambda: all(w["uss_bytes"] > 0 for w in stack.status()["workers"]), 10, what="every lane measured")
        status = stack.status()
        after = {tuple(w["models"]): w for w in status["workers"]}
        mlp = after[("mlp",)]
        lane_info = stack.metric("ringserve_lane_info", model="mlp", worker=str(mlp["index"]), pid=str(mlp["pid"]))
        busy = stack.metric("ringserve_worker_busy_seconds_total", worker=str(mlp["index"]))
        table = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "status", "--url", stack.url],
                               capture_output=True, text=True, timeout=30, check=True).stdout
    assert poisoned.status_code != 200 and "crashed" in poisoned.text, poisoned.text  # isolated: it alone fails
    assert [r.status_code for r in good_calls + good_mlp] == [200] * 12  # replayed on mlp's next process
    assert [r.status_code for r in other_lane] == [200] * 12
    for lane in (("caller",), ("preprocess",)):  # never touched
        assert after[lane]["pid"] == workers[lane]["pid"] and after[lane]["restarts_total"] == 0
    assert mlp["restarts_total"] >= 1
    assert status["models"]["mlp"]["lanes"] == [{"worker": mlp["index"], "pid": mlp["pid"], "state": "ready"}]
    assert mlp["busy_s"] > 0 and 0 < mlp["uss_bytes"] < mlp["rss_bytes"] and lane_info == 1 and busy > 0
    row = next(line.split() for line in table.splitlines() if line.endswith("(mlp)"))
    assert row[:2] == [str(mlp["index"]), str(mlp["pid"])] and "/" in row[6]  # busy s, then RSS/USS MiB
