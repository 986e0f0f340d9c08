"""Model code that tries to take the server down from Python: sys.exit() in a hook, a BLS call in
initialize to a model not loaded yet, a forked child that would outlive its worker. Each fails its own
model's call (or dies with its worker); the worker, its loader thread and the other models go on."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.support.python_models import fp32, write_python_model
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.chaos


class LoggedStack(Stack):
    """A stack whose processes' stderr (every log line) goes to `log_path`, for the test to read."""

    log_path: Path

    def start(self, *args, **kwargs) -> Stack:
        with self.log_path.open("ab") as self.stderr:  # the children keep their own copy of the fd
            return super().start(*args, **kwargs)


def logged_to(path: Path) -> type[Stack]:
    return type("LoggedStack", (LoggedStack,), {"log_path": path})


# y = 2x; the config's parameters.exit_in names the hook that calls sys.exit(2) (argparse's way to fail).
EXITING = """
import json
import sys

import triton_python_backend_utils as pb_utils


def exit_in(config):
    return config.get("parameters", {}).get("exit_in", {}).get("string_value")


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if exit_in(config.as_dict()) == "auto_complete_config":
            sys.exit(2)
        return config

    def initialize(self, args):
        self.exit_in = exit_in(json.loads(args["model_config"]))
        if self.exit_in == "initialize":
            sys.exit(2)

    def execute(self, requests):
        if self.exit_in == "execute":
            sys.exit(2)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * r.inputs()[0].as_numpy())]) for r in requests]

    def finalize(self):
        if self.exit_in == "finalize":
            sys.exit(2)
"""


def build_exiting(repo: Path, name: str, exit_in: str | None, policy: str) -> None:
    config = {"max_batch_size": 0, "input": [fp32("x", [1])], "output": [fp32("y", [1])],
              "model_load_policy": policy}
    if exit_in is not None:
        config["parameters"] = {"exit_in": {"string_value": exit_in}}
    write_python_model(repo, name, EXITING, config)


def body(value: float = 3.0) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [value]}]}


def restarts(stack: Stack) -> int:
    return sum(sum(w["restarts"].values()) for w in stack.status()["workers"])


HOOKS = ("auto_complete_config", "initialize", "execute", "finalize")


@pytest.fixture(scope="module")
def exiting_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("exiting")
    for policy in ("eager", "lazy"):
        build_exiting(repo, f"fine_{policy}", None, policy)
        for hook in HOOKS:
            build_exiting(repo, f"{hook}_{policy}", hook, policy)
    log_path = repo.parent / "exiting.log"
    with running_stack(repo, "--log-level", "INFO", stack_class=logged_to(log_path)) as stack:
        yield stack, log_path


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_sys_exit_in_initialize_fails_that_models_load_and_the_worker_serves_on(exiting_stack, policy: str) -> None:
    stack, log_path = exiting_stack
    pid = stack.worker_pid()

    # eager: it failed at the worker's start; lazy: the first request has the loader thread load it.
    infer_status, infer_doc = stack.post(f"/v2/models/initialize_{policy}/infer", body())
    load_status, load_doc = stack.post(f"/v2/repository/models/initialize_{policy}/load", {})  # a retry

    assert infer_status == 503 and "failed to load" in infer_doc["error"] and "SystemExit" in infer_doc["error"]
    assert load_status == 400 and "SystemExit" in load_doc["error"], load_doc
    assert stack.get(f"/v2/models/initialize_{policy}/ready")[0] == 503
    # The loader thread survived: it loads the next model asked of it; the worker is the same process.
    assert stack.post(f"/v2/models/fine_{policy}/infer", body())[1]["outputs"][0]["data"] == [6.0]
    assert stack.post(f"/v2/repository/models/fine_{policy}/load", {})[0] == 200
    assert stack.worker_pid() == pid and restarts(stack) == 0
    log = log_path.read_text()
    assert "Traceback" in log and "in initialize" in log and "sys.exit(2)" in log


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_sys_exit_in_auto_complete_config_fails_that_model_alone(exiting_stack, policy: str) -> None:
    stack, log_path = exiting_stack

    status, doc = stack.post(f"/v2/models/auto_complete_config_{policy}/infer", body())

    index = {e["name"]: e for e in stack.post("/v2/repository/index", {})[1]}
    assert status == 503 and "failed to load" in doc["error"] and "SystemExit" in doc["error"], doc
    assert index[f"auto_complete_config_{policy}"]["state"] == "UNAVAILABLE", index
    assert "SystemExit" in index[f"auto_complete_config_{policy}"]["reason"], index
    assert stack.get(f"/v2/models/auto_complete_config_{policy}/ready")[0] == 503
    assert stack.post(f"/v2/models/fine_{policy}/infer", body())[0] == 200
    assert restarts(stack) == 0
    assert "in auto_complete_config" in log_path.read_text()


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_sys_exit_in_execute_fails_that_batch_and_the_next_one_runs(exiting_stack, policy: str) -> None:
    stack, log_path = exiting_stack
    pid = stack.worker_pid()

    status, doc = stack.post(f"/v2/models/execute_{policy}/infer", body())

    assert status == 500 and "SystemExit" in doc["error"], doc
    assert stack.post(f"/v2/models/fine_{policy}/infer", body())[0] == 200
    assert stack.post(f"/v2/models/execute_{policy}/infer", body())[0] == 500  # its own failure again, no crash
    assert stack.worker_pid() == pid and restarts(stack) == 0
    assert "in execute" in log_path.read_text()


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_sys_exit_in_finalize_is_logged_and_the_unload_and_next_load_go_on(exiting_stack, policy: str) -> None:
    stack, log_path = exiting_stack
    pid = stack.worker_pid()
    model = f"finalize_{policy}"
    assert stack.post(f"/v2/models/{model}/infer", body())[0] == 200  # loaded (the lazy one here)

    assert stack.post(f"/v2/repository/models/{model}/unload", {})[0] == 200
    poll_for(lambda: stack.status()["models"][model]["model_state"] == "unloaded", 30, what="the unload")
    assert stack.post(f"/v2/repository/models/{model}/load", {})[0] == 200
    assert stack.post(f"/v2/models/{model}/infer", body())[1]["outputs"][0]["data"] == [6.0]
    assert stack.worker_pid() == pid and restarts(stack) == 0
    assert "in finalize" in log_path.read_text()


# initialize warms up through its dependency (parameters.target), as Triton's BLS examples do, and
# fails when the answer carries an error; execute answers y = warm + x (warm = the target's y of 1).
WARMS_UP_BY_BLS = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        target = json.loads(args["model_config"])["parameters"]["target"]["string_value"]
        x = pb_utils.Tensor("x", np.array([1.0], np.float32))
        answer = pb_utils.InferenceRequest(model_name=target, requested_output_names=["y"], inputs=[x]).exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        self.warm = pb_utils.get_output_tensor_by_name(answer, "y").as_numpy()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", self.warm + r.inputs()[0].as_numpy())])
                for r in requests]
"""


@pytest.mark.parametrize("lanes", ["shared", "model"])
def test_bls_in_initialize_works_on_a_loaded_model_and_fails_at_once_on_one_not_loaded(
        tmp_path: Path, lanes: str) -> None:
    # Shared: eager versions load in name order: a_dependency is ready before b_caller's initialize calls
    # it; z_lazy is not loaded when c_caller's initialize calls it (it once deadlocked the worker's loads).
    # Model (lanes): every call from an initialize goes to the target's own lane through the gateway, which
    # holds it until that lane is ready and loads a lazy model for it, as for any request: both work
    # (issue 40: a BLS call in initialize works or answers "not ready" at once, never a deadlock).
    build_exiting(tmp_path, "a_dependency", None, "eager")
    build_exiting(tmp_path, "z_lazy", None, "lazy")
    for caller, target in (("b_caller", "a_dependency"), ("c_caller", "z_lazy")):
        write_python_model(tmp_path, caller, WARMS_UP_BY_BLS, {
            "max_batch_size": 0, "input": [fp32("x", [1])], "output": [fp32("y", [1])],
            "parameters": {"target": {"string_value": target}}})

    with running_stack(tmp_path, "--lanes", lanes) as stack:  # ready: no load waits on another
        assert stack.post("/v2/models/b_caller/infer", body(3.0))[1]["outputs"][0]["data"] == [5.0]
        if lanes == "model":
            assert stack.post("/v2/models/c_caller/infer", body(3.0))[1]["outputs"][0]["data"] == [5.0]
            assert stack.post("/v2/models/z_lazy/infer", body(3.0))[1]["outputs"][0]["data"] == [6.0]
            return
        status, doc = stack.post("/v2/models/c_caller/infer", body(3.0))
        assert status == 503 and "failed to load" in doc["error"] and "not ready" in doc["error"], doc
        assert stack.post("/v2/models/z_lazy/infer", body(3.0))[1]["outputs"][0]["data"] == [6.0]
        assert stack.post("/v2/repository/models/c_caller/load", {})[0] == 200  # z_lazy is loaded now
        assert stack.post("/v2/models/c_caller/infer", body(3.0))[1]["outputs"][0]["data"] == [5.0]


# initialize starts a child process that would run forever (a data loader, a server of its own); its
# pid goes to <model dir>/children, one line per worker that loaded the model.
FORKS = """
import os
import subprocess
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"])
        with open(os.path.join(args["model_repository"], "children"), "a") as f:
            f.write(f"{self.child.pid}\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", r.inputs()[0].as_numpy())]) for r in requests]
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_a_model_forked_dies_with_its_worker_when_the_worker_is_killed(tmp_path: Path) -> None:
    write_python_model(tmp_path, "forks", FORKS, {"max_batch_size": 0, "input": [fp32("x", [1])],
                                                  "output": [fp32("y", [1])]})
    children = tmp_path / "forks" / "children"
    try:
        with running_stack(tmp_path) as stack:
            (first,) = map(int, children.read_text().split())
            assert alive(first)
            worker = stack.worker_pid()

            os.kill(worker, signal.SIGKILL)

            poll_for(lambda: not alive(first), 5, what="the model's child to die with its worker")
            poll_for(lambda: stack.is_ready() and stack.worker_pid() != worker, 30, what="a new worker")
            assert stack.post("/v2/models/forks/infer", body(3.0))[1]["outputs"][0]["data"] == [3.0]
            second = int(children.read_text().split()[-1])
            assert alive(second)
        assert not alive(second)  # the stop took the new worker's child too
    finally:
        for pid in map(int, children.read_text().split() if children.exists() else []):
            if alive(pid):  # (before the fix they outlived everything)
                os.kill(pid, signal.SIGKILL)
