"""The warm spare (worker/spare.py, supervision/spares.py) with real processes and real signals: it takes
a dead or hung worker's place, a spare that dies is replaced and counted apart, it serves nothing it has
not loaded, and no spare outlives the server."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest
from onnx import TensorProto, helper

from ringserve.common.repository.demo import MLP_HIDDEN, MLP_IN, MLP_OUT, make_model, write_model_dir
from ringserve.supervision.spares import SPARE_SILENCE_S

from tests.support.python_models import build_crashy, fp32, write_python_model
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.chaos


class LoggedStack(Stack):
    """A stack whose processes' stderr (one JSON object a line) goes to `log_path`, for the test to read."""

    log_path: Path

    def start(self, *args, **kwargs) -> Stack:
        with self.log_path.open("ab") as self.stderr:  # the children keep their own copy of the fd
            return super().start(*args, **kwargs)

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]


def logged(tmp_path: Path) -> type[Stack]:
    return type("LoggedStack", (LoggedStack,), {"log_path": tmp_path / "stack.log"})


LOGGED = ("--log-format", "json", "--log-level", "INFO")


def ready_spare(stack: Stack, other_than: int = 0, timeout_s: float = 30.0) -> dict:
    """The spare of device 0 once it is primed (/admin/status, from the supervisor's snapshot)."""
    def spare() -> dict | None:
        spares = stack.status()["spares"]
        found = spares[0] if spares else None
        return found if found and found["state"] == "ready" and found["pid"] not in (0, other_than) else None

    return poll_for(spare, timeout_s, 0.05, "a primed spare")


def serving_pid(stack: Stack, pid: int, timeout_s: float, index: int = 0) -> float:
    """Seconds until process `pid` serves worker `index` and the server is ready."""
    started = time.monotonic()

    def serves() -> bool:
        status = stack.status()
        worker = status["workers"][index]
        return status["ready"] and worker["pid"] == pid and worker["state"] == "ready"

    poll_for(serves, timeout_s, 0.01, f"process {pid} to serve worker {index}")
    return time.monotonic() - started


def first(lines: list[dict], predicate) -> int:
    """The position of the first log line that `predicate` holds for."""
    return next(i for i, line in enumerate(lines) if predicate(line))


def mlp_output(stack: Stack, model_path: Path, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((2, MLP_IN)).astype(np.float32)
    status, doc = stack.post("/v2/models/mlp/infer", {"inputs": [
        {"name": "x", "shape": [2, MLP_IN], "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert status == 200, doc
    out = doc["outputs"][0]
    expected = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"]), expected


def write_other_mlp(repo: Path, seed: int) -> None:
    """The mlp's file replaced by one of the same signature with other weights (x -> relu(x W1) W2)."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((MLP_IN, MLP_HIDDEN)).astype(np.float32),
               "w2": rng.standard_normal((MLP_HIDDEN, MLP_OUT)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, MLP_IN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, MLP_OUT])
    write_model_dir(repo, "mlp", make_model("mlp", nodes, [x], [y], weights), config=None)


def test_a_sigkilled_worker_is_replaced_by_the_spare_and_the_next_spare_starts_once_it_serves(
        demo_repo: Path, tmp_path: Path) -> None:
    with running_stack(demo_repo, *LOGGED, stack_class=logged(tmp_path)) as stack:
        spare = ready_spare(stack)
        worker_pid = stack.worker_pid()
        t_kill = time.time()
        os.kill(worker_pid, signal.SIGKILL)
        serving_pid(stack, spare["pid"], 10)
        # The process that serves now was running before the kill: no interpreter was started for it.
        assert psutil.Process(spare["pid"]).create_time() < t_kill
        after = ready_spare(stack, other_than=spare["pid"])
        got, expected = mlp_output(stack, demo_repo / "mlp/1/model.onnx", seed=3)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert stack.metric("ringserve_spare_takeovers_total", device="0") == 1
        assert stack.metric("ringserve_worker_restarts_total", reason="SIGKILL") == 1
        assert stack.metric("ringserve_spare_deaths_total") == 0
        assert stack.metric("ringserve_spare_memory_bytes", device="0") > 2**20
        lines = stack.lines()
    # In order: the death, the spare's takeover, its READY as worker 0 generation 2, then the next spare.
    died = first(lines, lambda l: l["role"] == "supervisor" and f"(pid {worker_pid}) exited: SIGKILL" in l["message"])
    took = first(lines, lambda l: f"the spare (pid {spare['pid']}) takes over" in l["message"])
    ready = first(lines, lambda l: l["pid"] == spare["pid"] and "generation 2 ready for gateway 0" in l["message"])
    next_spare = first(lines, lambda l: f"started spare 0 generation 2 (pid {after['pid']})" in l["message"])
    assert died < took < ready < next_spare
    assert not [l for l in lines if "started worker 0 generation 2" in l["message"]]  # no fresh process


def test_a_spare_that_dies_itself_is_replaced_and_counted_apart_from_worker_restarts(demo_repo: Path) -> None:
    with running_stack(demo_repo, "--hang-timeout-s", "1") as stack:
        worker = stack.status()["workers"][0]
        killed = ready_spare(stack)
        os.kill(killed["pid"], signal.SIGKILL)
        stopped = ready_spare(stack, other_than=killed["pid"])
        os.kill(stopped["pid"], signal.SIGSTOP)  # a hung spare: killed at --hang-timeout-s, replaced
        third = ready_spare(stack, other_than=stopped["pid"])
        poll_for(lambda: stack.metric("ringserve_spare_deaths_total", reason="hung") == 1, 5, what="the hung count")
        assert stack.metric("ringserve_spare_deaths_total", device="0", reason="SIGKILL") == 1
        assert stack.status()["spares"][0]["deaths"] == {"SIGKILL": 1, "hung": 1}
        assert third["takeovers"] == 0 and stack.metric("ringserve_spare_takeovers_total") == 0
        # The worker was never touched: same process, same generation, no restart counted.
        now = stack.status()["workers"][0]
        assert (now["pid"], now["generation"], now["restarts"]) == (worker["pid"], worker["generation"], {})
        assert stack.metric("ringserve_worker_restarts_total") == 0


@pytest.mark.parametrize("lanes", ["shared", "model"])
def test_a_spare_serves_only_what_it_loaded_when_it_took_over(demo_repo: Path, tmp_path: Path, lanes: str) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(demo_repo, repo)
    with running_stack(repo, "--lanes", lanes) as stack:
        spare = ready_spare(stack)
        got, expected = mlp_output(stack, repo / "mlp/1/model.onnx", seed=5)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        # While it waits, the repository changes under it: mlp gets other weights, encoder a broken file.
        # A spare that had read or loaded anything before its takeover would serve the old ones.
        write_other_mlp(repo, seed=77)
        (repo / "encoder/1/model.onnx").write_bytes(b"not an onnx model")
        lane = stack.lane("mlp")  # shared: worker 0, which holds both models; model: mlp's own lane
        os.kill(stack.worker_pid(lane), signal.SIGKILL)
        serving_pid(stack, spare["pid"], 10, lane)
        got, expected_now = mlp_output(stack, repo / "mlp/1/model.onnx", seed=5)
        np.testing.assert_allclose(got, expected_now, atol=1e-4)
        assert not np.allclose(expected_now, expected, atol=1e-3)
        worker = stack.status()["workers"][lane]
        status, doc = stack.post("/v2/models/encoder/infer", {"inputs": [
            {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]}]})
        if lanes == "shared":  # the spare took over a worker that holds every model: it read the broken file
            assert "encoder" in worker["failed_models"] and "encoder" not in worker["models"]
            assert status == 503 and "encoder" in doc["error"], (status, doc)
        else:  # it took over mlp's lane: it loaded mlp alone, never the broken encoder, whose own lane goes on
            assert list(worker["models"]) == ["mlp"] and not worker["failed_models"], worker
            assert status == 200, (status, doc)


def test_a_sigstopped_worker_is_killed_at_the_hang_timeout_and_the_spare_serves_at_once(demo_repo: Path) -> None:
    hang_timeout_s = 2.0
    with running_stack(demo_repo, "--hang-timeout-s", str(hang_timeout_s)) as stack:
        spare = ready_spare(stack)
        worker_pid = stack.worker_pid()
        os.kill(worker_pid, signal.SIGSTOP)
        replaced_s = serving_pid(stack, spare["pid"], hang_timeout_s + 5)
        status = stack.status()
        assert status["workers"][0]["last_exit"]["reason"] == "hung"
        assert status["workers"][0]["last_exit"]["pid"] == worker_pid
        # The heartbeat interval, the supervisor's tick and the takeover: well under a fresh start.
        assert replaced_s < hang_timeout_s + 1.5, replaced_s
        poll_for(lambda: stack.metric("ringserve_spare_takeovers_total") == 1, 5, what="the takeover counted")


def test_a_stop_leaves_no_spare_behind(demo_repo: Path) -> None:
    stack = Stack(demo_repo)
    try:
        stack.start()
        first_spare = ready_spare(stack)["pid"]
        os.kill(stack.worker_pid(), signal.SIGKILL)  # the spare takes over, and another one starts
        serving_pid(stack, first_spare, 10)
        second_spare = ready_spare(stack, other_than=first_spare)["pid"]
        stack.remember_children()
        assert stack.stop(signal.SIGTERM) == 0
        stack.assert_nothing_left()
        assert not psutil.pid_exists(first_spare) and not psutil.pid_exists(second_spare)
    finally:
        stack.kill_everything()


def test_a_sigkilled_supervisor_leaves_no_spare_behind(demo_repo: Path) -> None:
    stack = Stack(demo_repo)
    try:
        stack.start()
        spare = ready_spare(stack)["pid"]
        stack.remember_children()
        stack.stop(signal.SIGKILL)
        poll_for(lambda: not psutil.pid_exists(spare) or psutil.Process(spare).status() == psutil.STATUS_ZOMBIE,
                 10, what="the spare to die with its supervisor")
        # Every child dies with it; its resource tracker, seeing it go, unlinks the rings.
        poll_for(lambda: stack.leftovers() == ([], []), 10, what="every child and ring to go with the supervisor")
    finally:
        stack.kill_everything()


# auto_complete_config runs in every worker's repository scan: once the test has created
# <model dir>/hang-scans, every later scan sleeps forever in Python, as a config read from a FIFO or a
# slow remote check would. (A file the test makes, not "every scan but the first": each lane's
# worker scans at the start.)
STUCK_ONCE_TOLD = """
import os
import time

import triton_python_backend_utils as pb_utils

HANG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hang-scans")


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if os.path.exists(HANG):
            time.sleep(3600)
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                                                            .as_numpy() * 2)]) for r in requests]
"""


def test_a_spare_that_hangs_in_its_takeover_scan_is_killed_at_the_start_timeout_and_the_model_quarantined(
        tmp_path: Path) -> None:
    start_timeout_s = 3.0
    build_crashy(tmp_path)
    write_python_model(tmp_path, "stuck", STUCK_ONCE_TOLD, {
        "max_batch_size": 8, "input": [fp32("x", [4])], "output": [fp32("y", [4])]})
    # One worker holding both models, so that the spare taking over reads stuck's model.py (with lanes, crashy's
    # lane would not import it at all: worker/python/python_model.py).
    with running_stack(tmp_path, "--worker-start-timeout-s", str(start_timeout_s), "--hang-timeout-s", "2",
                       "--lanes", "shared") as stack:
        spare = ready_spare(stack)
        (tmp_path / "stuck" / "hang-scans").touch()
        os.kill(stack.worker_pid(), signal.SIGKILL)
        t_kill = time.monotonic()
        # The spare takes over and sleeps in the scan; silent since its TakeOver, it is killed as hung.
        poll_for(lambda: stack.status()["workers"][0]["restarts"].get("hung", 0) >= 1, start_timeout_s + 10,
                 what="the stuck successor killed")
        killed_s = time.monotonic() - t_kill
        assert killed_s < start_timeout_s + 5, killed_s
        assert not psutil.pid_exists(spare["pid"])
        # Fresh workers hang the same way and are killed the same way; the third death blames the model,
        # and the next worker skips it and serves the rest.
        poll_for(lambda: stack.status()["models"]["stuck"]["quarantined"], 3 * (start_timeout_s + 5) + 30, 0.1,
                 "'stuck' quarantined")
        quarantined_s = time.monotonic() - t_kill
        x = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        served = poll_for(lambda: (r := stack.post("/v2/models/crashy/infer", x))[0] == 200 and r, 30, 0.1,
                          "crashy served by a worker without 'stuck'")
        print(f"stuck successor killed {killed_s:.1f} s after the crash, 'stuck' quarantined after "
              f"{quarantined_s:.1f} s, crashy served again after {time.monotonic() - t_kill:.1f} s")
        assert served[1]["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0], served
        restarts = stack.status()["workers"][0]["restarts"]
        assert restarts.get("hung", 0) == 3 and restarts.get("SIGKILL", 0) == 1, restarts
        code, doc = stack.post("/v2/models/stuck/infer", x)
        assert code == 503 and "quarantined" in doc["error"], (code, doc)


def test_a_stopped_spare_is_passed_over_and_a_fresh_worker_replaces_the_dead_one_quickly(
        demo_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(demo_repo / "mlp", repo / "mlp")  # one small model: a fresh start is about a second
    # A long hang timeout: a stopped spare handed the takeover costs at least this much (8 s at the 5 s default).
    with running_stack(repo, "--hang-timeout-s", "15") as stack:
        stopped = ready_spare(stack)
        worker_pid = stack.worker_pid()
        os.kill(stopped["pid"], signal.SIGSTOP)
        time.sleep(SPARE_SILENCE_S + 0.5)  # the spare's silence must be old enough to tell at the takeover
        os.kill(worker_pid, signal.SIGKILL)
        t_kill = time.monotonic()

        def fresh_worker_serves() -> bool:
            status = stack.status()
            return status["ready"] and status["workers"][0]["pid"] not in (worker_pid, stopped["pid"])

        poll_for(fresh_worker_serves, 30, 0.02, "a fresh worker to serve")
        gap_s = time.monotonic() - t_kill
        print(f"503 gap with a stopped spare: {gap_s:.2f} s")
        assert gap_s < 6.0, gap_s
        poll_for(lambda: not psutil.pid_exists(stopped["pid"]), 5, what="the stopped spare killed")
        poll_for(lambda: stack.metric("ringserve_spare_deaths_total", reason="hung") == 1, 5, what="its death counted")
        assert stack.metric("ringserve_spare_takeovers_total") == 0
        ready_spare(stack, other_than=stopped["pid"])  # and it is replaced, once the fresh worker serves
        got, expected = mlp_output(stack, repo / "mlp/1/model.onnx", seed=7)
        np.testing.assert_allclose(got, expected, atol=1e-5)
