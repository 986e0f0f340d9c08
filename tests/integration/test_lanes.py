"""Lanes: each model's batches run in worker processes of its own (supervision/lanes.py).

A slow model no longer delays a fast one, instance_group's count runs that many executions at once, and
a crash in one model's lane costs other models nothing.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ringserve.common.repository.demo import build_demo_models
from tests.support.python_models import write_python_model
from tests.support.stack import Stack, poll_for, running_stack

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
        assert len(stack.status()["workers"]) == 2  # its two lanes
        # (the server is ready once one lane has the model: wait for the other's READY too)
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

