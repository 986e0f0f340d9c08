"""Sequences through crashes: a step is never lost and never applied twice, and a poison step fails alone.

The accumulator answers the running sum of its sequence's inputs (tests/support/sequence_models.py), so
a step applied twice, lost, or run on a stale state shows in every later answer of its sequence. Every
expected answer is computed here with numpy from what the test sent.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.sequence_models import build_accumulator, expected_sums
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.chaos


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    build_accumulator(tmp_path, max_batch_size=8)
    return tmp_path


def http_sequence(stack: Stack, key: int, values: list[float], got: dict) -> None:
    answers = []
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}", network_timeout=60) as client:
        for k, value in enumerate(values):
            tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            try:
                result = client.infer("accumulator", [tensor], sequence_id=key, sequence_start=k == 0,
                                      sequence_end=k == len(values) - 1)
                answers.append(float(result.as_numpy("OUTPUT")[0, 0]))
            except InferenceServerException as exc:
                answers.append(exc)
    got[key] = answers


def grpc_sequence(stack: Stack, key: int, values: list[float], got: dict) -> None:
    answers: list = []
    done = threading.Event()

    def callback(result, error) -> None:
        answers.append(error if error is not None else float(result.as_numpy("OUTPUT")[0, 0]))
        if len(answers) == len(values):
            done.set()

    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        client.start_stream(callback=callback)
        for k, value in enumerate(values):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            client.async_stream_infer("accumulator", [tensor], sequence_id=key, sequence_start=k == 0,
                                      sequence_end=k == len(values) - 1)
            time.sleep(0.002)
        done.wait(120)
        client.stop_stream()
    got[key] = answers


def worker_pid(stack: Stack) -> int | None:
    return next((w["pid"] for w in stack.status()["workers"] if w["state"] == "ready"), None)


def test_no_step_is_lost_or_applied_twice_while_the_worker_is_killed(repo: Path):
    rng = random.Random(38)
    values = {key: [float(rng.randint(1, 9)) for _ in range(60)] for key in range(1, 13)}
    got: dict[int, list] = {}
    grpc_port = free_port()
    with running_stack(repo, "--grpc-port", str(grpc_port), "--hold-when-unavailable-s", "20") as stack:
        stack.grpc_port = grpc_port
        threads = [
            threading.Thread(target=http_sequence if key % 2 else grpc_sequence, args=(stack, key, seq, got))
            for key, seq in values.items()
        ]
        for t in threads:
            t.start()
        for _ in range(2):  # killed during steps: every client is mid-sequence
            time.sleep(0.4)
            victim = worker_pid(stack)
            os.kill(victim, signal.SIGKILL)
            poll_for(lambda v=victim: worker_pid(stack) not in (None, v), 30, what="a new worker")
        for t in threads:
            t.join(180)
        restarts = stack.status()["workers"][0]["restarts_total"]
    assert restarts == 2
    for key, seq in values.items():
        assert got[key] == expected_sums(seq), f"sequence {key}"


def test_a_step_that_kills_the_worker_fails_alone_and_its_sequence_keeps_its_state(repo: Path):
    env = {"RINGSERVE_FAULT_INJECTION": "1"}
    with running_stack(repo, "--hold-when-unavailable-s", "20", env=env) as stack:
        conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=120)

        def step(key: int, value: float, **params) -> tuple[int, dict]:
            body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
                    "parameters": {"sequence_id": key, **params}}
            conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body))
            response = conn.getresponse()
            return response.status, json.loads(response.read())

        for key in (1, 2, 3):
            assert step(key, 1, sequence_start=True)[0] == 200
        # Three steps in one batch (sent together), the middle one kills the worker each time it runs.
        results: dict[int, tuple[int, dict]] = {}

        def send(key: int, value: float, **params) -> None:
            own = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=120)
            body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
                    "parameters": {"sequence_id": key, **params}}
            try:
                own.request("POST", "/v2/models/accumulator/infer", json.dumps(body))
                response = own.getresponse()
                results[key] = (response.status, json.loads(response.read()))
            finally:
                own.close()

        threads = [threading.Thread(target=send, args=(1, 10)),
                   threading.Thread(target=send, args=(2, 10), kwargs={"ringserve_fault": "segv"}),
                   threading.Thread(target=send, args=(3, 10))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results[2][0] == 500 and "crashed" in results[2][1]["error"]
        assert [results[1][0], results[3][0]] == [200, 200]
        assert [results[k][1]["outputs"][0]["data"] for k in (1, 3)] == [[11.0], [11.0]]
        # The poison step changed nothing: sequence 2 goes on from its state before it.
        status, answer = step(2, 5)
        conn.close()
        assert (status, answer["outputs"][0]["data"]) == (200, [6.0])


def gateway_pids(stack: Stack) -> list[int]:
    pids = []
    for child in psutil.Process(stack.pid).children():
        try:
            if "ringserve.gateway" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def test_with_two_gateways_a_sequence_goes_on_at_either_and_one_gateways_death_applies_no_step_twice(repo: Path):
    """Each step on a new connection, so steps land at either gateway. A step whose connection died with its
    gateway may or may not have been applied: the later answers must fit exactly one of the two, never both."""
    rng = random.Random(2)
    values = {key: [float(rng.randint(1, 9)) for _ in range(40)] for key in range(1, 9)}
    got: dict[int, list] = {}

    def run(stack: Stack, key: int, seq: list[float]) -> None:
        answers: list = []
        for k, value in enumerate(seq):
            body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
                    "parameters": {"sequence_id": key, "sequence_start": k == 0, "sequence_end": k == len(seq) - 1}}
            conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=60)
            try:
                conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body))
                response = conn.getresponse()
                doc = json.loads(response.read())
                answers.append(doc["outputs"][0]["data"][0] if response.status == 200 else response.status)
            except (ConnectionError, http.client.HTTPException):
                answers.append(None)  # its gateway died with it: applied or not, unknown to the client
            finally:
                conn.close()
        got[key] = answers

    with running_stack(repo, "--gateways", "2", "--hold-when-unavailable-s", "20") as stack:
        poll_for(lambda: len(gateway_pids(stack)) == 2, 30, what="two gateways")
        threads = [threading.Thread(target=run, args=(stack, key, seq)) for key, seq in values.items()]
        for t in threads:
            t.start()
        time.sleep(0.5)
        victim = gateway_pids(stack)[1]
        os.kill(victim, signal.SIGKILL)
        poll_for(lambda: victim not in gateway_pids(stack) and len(gateway_pids(stack)) == 2, 30,
                 what="the gateway's successor")
        for t in threads:
            t.join(120)
    unknown = 0
    for key, seq in values.items():
        total, pending = 0.0, []  # pending: steps whose answer died with their gateway
        for value, answer in zip(seq, got[key]):
            if answer is None:
                pending.append(value)
                unknown += 1
                continue
            if isinstance(answer, int):  # only a 503 (refused, not applied) may answer a step here
                assert answer == 503, f"sequence {key}: {got[key]}"
                continue
            # Each unanswered step before it was applied at most once: some subset of them is in the sum.
            possible = {total + value + sum(subset) for subset in _subsets(pending)}
            assert answer in possible, f"sequence {key}: {got[key]}"
            total, pending = answer, []
    assert unknown <= 8, got  # at most the steps in flight at the dead gateway


def _subsets(values: list[float]) -> list[list[float]]:
    subsets: list[list[float]] = [[]]
    for value in values:
        subsets += [[*subset, value] for subset in subsets]
    return subsets
