"""Model code that never returns from Python (`while True: pass`), where the heartbeat thread beats on:
in execute, initialize and finalize. Each call is bounded (its model's parameters.*_timeout_s, or the
flags' defaults): the worker is killed with the hook's reason, the batch replays on the successor, a
load that hangs every time is quarantined, and the other models serve on without a failed request."""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.python_models import fp32, write_python_model
from tests.support.stack import Stack, poll_for

pytestmark = pytest.mark.chaos

# y = 2x. parameters.hang_in names the hook that loops forever in Python (execute: only for x < 0;
# initialize also while <model dir>/hang_in_initialize exists); <model dir>/<hook>.started is
# written as the hook starts.
HANGS = """
import json
import os

import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def started(hook):
    with open(os.path.join(HERE, hook + ".started"), "a") as f:
        f.write(f"{os.getpid()}\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.hang_in = json.loads(args["model_config"]).get("parameters", {}).get("hang_in", {}).get("string_value")
        if self.hang_in == "initialize" or os.path.exists(os.path.join(HERE, "hang_in_initialize")):
            started("initialize")
            while True:
                pass

    def execute(self, requests):
        x = [r.inputs()[0].as_numpy() for r in requests]
        if self.hang_in == "execute" and any(float(v.min()) < 0 for v in x):
            started("execute")
            while True:
                pass
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * v)]) for v in x]

    def finalize(self):
        if self.hang_in == "finalize":
            started("finalize")
            while True:
                pass
"""


def build(repo: Path, name: str, hang_in: str | None = None, policy: str = "eager", ttl_s: float = 0,
          **parameters: str) -> Path:
    config: dict = {"max_batch_size": 0, "input": [fp32("x", [1])], "output": [fp32("y", [1])],
                    "model_load_policy": policy, "ttl_s": ttl_s}
    if hang_in is not None:
        parameters["hang_in"] = hang_in
    if parameters:
        config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return write_python_model(repo, name, HANGS, config)


def body(value: float = 3.0) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [value]}]}


def restarts(stack: Stack, reason: str) -> int:
    return sum(w["restarts"].get(reason, 0) for w in stack.status()["workers"])


class Background:
    """Threads that keep probing readiness (the server's, each model's) and sending the innocent model
    requests until stopped."""

    def __init__(self, stack: Stack, model: str, probed: tuple[str, ...] = ()) -> None:
        self.stack, self.model = stack, model
        self.stop = threading.Event()
        self.ready: dict[str, list[int]] = {path: [] for path in (
            "/v2/health/ready", *(f"/v2/models/{m}/ready" for m in (model, *probed)))}
        self.answers: list[tuple[int, object]] = []
        self.threads = [threading.Thread(target=self._probe), threading.Thread(target=self._serve)]

    def _probe(self) -> None:
        while not self.stop.is_set():
            for path, codes in self.ready.items():
                codes.append(self.stack.get(path)[0])
            time.sleep(0.05)

    def _serve(self) -> None:
        while not self.stop.is_set():
            status, doc = self.stack.post(f"/v2/models/{self.model}/infer", body(1.0))
            self.answers.append((status, doc if status != 200 else doc["outputs"][0]["data"]))
            time.sleep(0.05)

    def __enter__(self) -> Background:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)

    def report(self) -> str:
        probes = "; ".join(f"{path}: {dict(Counter(codes))}" for path, codes in self.ready.items())
        return f"{probes}; {self.model}'s answers: {dict(Counter(s for s, _ in self.answers))}"


@pytest.mark.parametrize("lanes", ["shared", "model"])
def test_a_python_loop_in_execute_is_killed_at_its_bound_the_request_answered_once_and_the_rest_serve(
        start_stack, tmp_path: Path, lanes: str) -> None:
    build(tmp_path, "loops", "execute", execute_timeout_s="1.5")
    build(tmp_path, "fine")
    # (--lanes shared: while its one worker is replaced a new request waits for the successor, not 503)
    stack = start_stack(tmp_path, "--max-attempts", "2", "--lanes", lanes, "--hold-when-unavailable-s", "30")
    index, pid = next((w["index"], w["pid"]) for w in stack.status()["workers"] if "loops" in w["models"])
    assert stack.post("/v2/models/loops/infer", body(2.0))[1]["outputs"][0]["data"] == [4.0]

    with Background(stack, "fine", probed=("loops",)) as background:
        time.sleep(0.3)
        started = time.monotonic()
        status, doc = stack.post("/v2/models/loops/infer", body(-1.0))
        took = time.monotonic() - started
        time.sleep(0.5)
    print(f"--lanes {lanes}: the hung request: {status} after {took:.1f} s; {background.report()}")

    # Its one answer: killed at the bound on each attempt (max-attempts 2), then given up.
    assert status == 500 and "execute_timeout" in doc["error"], doc
    assert 2 * 1.5 <= took < 30
    assert restarts(stack, "execute_timeout") == 2
    assert stack.worker_pid(index) != pid
    assert stack.metric("ringserve_worker_restarts_total", reason="execute_timeout") == 2
    # The other model: not one failed request, served before, between and after the kills.
    assert background.answers and all(answer == (200, [2.0]) for answer in background.answers), [
        answer for answer in background.answers if answer != (200, [2.0])]
    if lanes == "model":  # in a lane of its own: ready throughout, and so is the server, which serves it
        assert set(background.ready["/v2/models/fine/ready"]) == {200}
        assert set(background.ready["/v2/health/ready"]) == {200}
    poll_for(lambda: stack.get("/v2/health/ready")[0] == 200 and stack.get("/v2/models/loops/ready")[0] == 200,
             30, what="ready again once the successor serves")
    assert stack.post("/v2/models/loops/infer", body(2.0))[1]["outputs"][0]["data"] == [4.0]


def test_a_hang_in_an_eager_models_initialize_is_bounded_and_quarantines_it_and_the_rest_serve(
        start_stack, tmp_path: Path) -> None:
    build(tmp_path, "stuck", "initialize", load_timeout_s="1")
    build(tmp_path, "fine")
    stack = start_stack(tmp_path)  # ready once a worker that skips the quarantined model serves

    status, doc = stack.post("/v2/models/stuck/infer", body())

    assert status == 503 and "quarantined" in doc["error"] and "load_timeout" in doc["error"], doc
    assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]
    assert restarts(stack, "load_timeout") == 3
    assert stack.get("/v2/models/stuck/ready")[0] == 503 and stack.get("/v2/models/fine/ready")[0] == 200
    # A repository load lifts the quarantine, and new workers load it again: the answer is how that went.
    status, doc = stack.post("/v2/repository/models/stuck/load", {})
    assert status == 400 and "died while loading it (load_timeout)" in doc["error"], doc
    assert restarts(stack, "load_timeout") == 4
    assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]


def test_a_hang_in_a_lazy_models_initialize_answers_its_requests_and_the_rest_serve(
        start_stack, tmp_path: Path) -> None:
    build(tmp_path, "stuck", "initialize", policy="lazy", load_timeout_s="1")
    build(tmp_path, "fine")
    stack = start_stack(tmp_path, "--hold-when-unavailable-s", "30")

    with Background(stack, "fine") as background:
        status, doc = stack.post("/v2/models/stuck/infer", body())
    print(f"the lazy load's request: {status} {doc}; {background.report()}")

    assert status == 503 and "quarantined" in doc["error"] and "load_timeout" in doc["error"], doc
    assert restarts(stack, "load_timeout") == 3
    assert background.answers and all(answer == (200, [2.0]) for answer in background.answers), [
        answer for answer in background.answers if answer != (200, [2.0])]
    assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]


def test_a_hang_in_finalize_at_a_ttl_unload_holds_no_other_models_batch_and_is_bounded(
        start_stack, tmp_path: Path) -> None:
    stuck = build(tmp_path, "stuck", "finalize", policy="lazy", ttl_s=0.5, finalize_timeout_s="4")
    build(tmp_path, "fine")
    # One worker holding both models: the point is that its batch loop serves `fine` while `stuck`'s finalize
    # loops (with lanes each model has its own worker, and nothing would be shared to hold).
    stack = start_stack(tmp_path, "--lanes", "shared")
    pid = stack.worker_pid()
    assert stack.post("/v2/models/stuck/infer", body())[0] == 200  # loaded now; unloaded 0.5 s after

    poll_for(lambda: (stuck / "finalize.started").exists(), 30, what="the ttl unload's finalize")
    served: list[float] = []
    for _ in range(5):  # while finalize loops (its bound is 4 s): the same worker serves the other model
        started = time.monotonic()
        assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]
        served.append(time.monotonic() - started)
    same_worker = stack.worker_pid() == pid
    print(f"the other model's latencies while finalize looped: {[round(s, 3) for s in served]}")

    assert same_worker and restarts(stack, "finalize_timeout") == 0
    poll_for(lambda: restarts(stack, "finalize_timeout") == 1, 30, what="the kill at finalize's bound")
    poll_for(lambda: stack.get("/v2/health/ready")[0] == 200, 30, what="the successor")
    assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]
    assert stack.post("/v2/models/stuck/infer", body())[0] == 200


def test_a_repository_load_whose_initialize_hangs_answers_the_failure(start_stack, tmp_path: Path) -> None:
    stuck = build(tmp_path, "stuck", load_timeout_s="1")
    build(tmp_path, "fine")
    stack = start_stack(tmp_path)
    assert stack.post("/v2/repository/models/stuck/unload", {})[0] == 200
    poll_for(lambda: stack.status()["models"]["stuck"]["model_state"] == "unloaded", 30, what="the unload")
    (stuck / "hang_in_initialize").touch()

    started = time.monotonic()
    status, doc = stack.post("/v2/repository/models/stuck/load", {})
    took = time.monotonic() - started

    assert status == 400 and "died while loading it (load_timeout)" in doc["error"], doc
    assert took < 20 and restarts(stack, "load_timeout") == 1
    (stuck / "hang_in_initialize").unlink()
    # (with lanes the server stays ready while stuck's lane is replaced: wait for stuck itself)
    poll_for(lambda: stack.serves("stuck") and stack.serves("fine"), 30, what="the successor")
    assert stack.post("/v2/models/fine/infer", body())[1]["outputs"][0]["data"] == [6.0]
    assert stack.post("/v2/models/stuck/infer", body())[1]["outputs"][0]["data"] == [6.0]


def test_a_worker_whose_heartbeats_stop_is_not_ready_until_they_come_back(start_stack, tmp_path: Path) -> None:
    """SIGSTOP stands for a native call that holds the GIL: nothing of the worker runs. Under
    --hang-timeout-s (5 s) it is not killed, but neither is it counted ready meanwhile."""
    build(tmp_path, "fine")
    stack = start_stack(tmp_path)
    pid = stack.worker_pid()

    with Background(stack, "fine") as background:
        time.sleep(0.3)
        os.kill(pid, signal.SIGSTOP)
        try:
            wedged = poll_for(lambda: stack.status()["workers"][0]["wedged"], 2.5, what="the worker wedged")
            poll_for(lambda: 503 in background.ready["/v2/health/ready"], 2, what="a probe while wedged")
        finally:
            os.kill(pid, signal.SIGCONT)
        poll_for(lambda: stack.get("/v2/health/ready")[0] == 200, 10, what="ready again once it beats")
        time.sleep(0.3)
    print(f"a worker stopped until it was seen wedged: {background.report()}")

    health = background.ready["/v2/health/ready"]
    assert wedged and not stack.status()["workers"][0]["wedged"]
    assert 503 in health and health[0] == 200 and health[-1] == 200, health
    assert 503 in background.ready["/v2/models/fine/ready"]
    assert stack.worker_pid() == pid and sum(sum(w["restarts"].values()) for w in stack.status()["workers"]) == 0
    assert background.answers and all(answer == (200, [2.0]) for answer in background.answers), [
        answer for answer in background.answers if answer != (200, [2.0])]
