"""Python models (model.py), BLS and ensembles served by the real stack: batching, errors, tensors."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from ringserve.common.repository.demo import build_demo_models

from tests.support.python_models import (build_crashy, build_inspect, build_pipeline, copy_example, preprocess_then_mlp,
                             write_python_model)
from tests.support.stack import poll_for, running_stack
from .test_model_kinds import outputs, post_all, tensor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def python_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("python-models")
    demo = tmp_path_factory.mktemp("demo")
    build_demo_models(demo)
    shutil.copytree(demo / "mlp", repo / "mlp")
    build_crashy(repo)
    build_inspect(repo)
    build_pipeline(repo)
    with running_stack(repo) as stack:
        yield stack, repo


def crashy_body(x: np.ndarray) -> dict:
    return {"inputs": [tensor("x", x, "FP32")]}


def test_execute_sees_several_requests_of_a_batch_and_answers_each(python_stack) -> None:
    stack, repo = python_stack
    log = repo / "crashy" / "executes.log"
    log.unlink(missing_ok=True)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((int(rng.integers(1, 3)), 4)).astype(np.float32) for _ in range(24)]

    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "crashy", [crashy_body(x) for x in xs],
                                                                      24)))

    for x, r in zip(xs, responses):
        np.testing.assert_allclose(outputs(r)["y"], 2 * x + 1, rtol=1e-6)
    per_execute = [int(n) for n in log.read_text().split()]
    assert sum(per_execute) == len(xs) and max(per_execute) > 1  # one InferenceRequest per client request


def test_an_exception_in_execute_fails_its_batch_with_the_message_and_kills_nothing(python_stack) -> None:
    stack, repo = python_stack
    pid = stack.worker_pid()

    refused = stack.post("/v2/models/crashy/infer", crashy_body(np.array([[-8, 0, 0, 0]], np.float32)))
    bug = stack.post("/v2/models/crashy/infer", crashy_body(np.array([[-9, 0, 0, 0]], np.float32)))

    assert refused[0] == 400 and "TritonModelException: x[0] = -8 is refused" in refused[1]["error"]
    assert bug[0] == 500 and "KeyError: 'no such key'" in bug[1]["error"]
    assert stack.worker_pid() == pid and stack.status()["workers"][0]["restarts"] == {}


def test_a_response_carrying_an_error_fails_its_own_request_only(python_stack) -> None:
    stack, repo = python_stack
    xs = [np.full((1, 4), i, np.float32) for i in range(6)]
    xs[3] = np.array([[-10, 1, 2, 3]], np.float32)
    log = repo / "crashy" / "executes.log"
    log.unlink(missing_ok=True)

    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "crashy", [crashy_body(x) for x in xs],
                                                                      6)))

    assert max(int(n) for n in log.read_text().split()) > 1  # the refused one shared an execute
    for i, (x, r) in enumerate(zip(xs, responses)):
        if i == 3:
            assert r.status_code == 400 and r.json()["error"] == "model 'crashy' failed on this request: x[0] = -10 is refused"
        else:
            np.testing.assert_allclose(outputs(r)["y"], 2 * x + 1)


def test_tensors_are_writable_bytes_are_bytes_and_ragged_inputs_are_each_requests_own(python_stack) -> None:
    stack, repo = python_stack
    rng = np.random.default_rng(6)
    cases = [(f"word {i}".encode(), rng.integers(-5, 5, (1, int(rng.integers(1, 30)))).astype(np.float32))
             for i in range(12)]
    bodies = [{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text.decode()]},
                          tensor("seq", seq, "FP32")]} for text, seq in cases]

    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "inspect", bodies, 12)))

    for (text, seq), r in zip(cases, responses):
        out = outputs(r)
        assert out["kind"].tolist() == [["bytes writable"]]
        assert out["echo"].tolist() == [[text[::-1].decode()]]
        assert out["total"].tolist() == [[float(seq.sum())]] and out["seen"].tolist() == [[1, seq.size]]
    assert stack.metric("ringserve_batch_size_count", model="inspect") < len(cases)  # ragged requests shared


def test_model_py_is_imported_by_the_workers_only(python_stack) -> None:
    stack, repo = python_stack
    importers = {int(pid) for pid in (repo / "inspect" / "imported_by").read_text().split()}
    workers = {w["pid"] for w in stack.status()["workers"]}

    assert importers and importers <= workers
    assert stack.pid not in importers


def test_bls_from_a_python_model_to_an_onnx_one_equals_the_onnx_model_run_here(python_stack) -> None:
    stack, repo = python_stack
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(8)]
    session = ort.InferenceSession(str(repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])

    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "bls_mlp", [crashy_body(x) for x in xs],
                                                                      8)))

    for x, r in zip(xs, responses):
        np.testing.assert_allclose(outputs(r)["y"], session.run(None, {"x": x})[0], atol=1e-5)


def test_an_ensemble_python_then_onnx_equals_both_steps_computed_here(python_stack) -> None:
    stack, repo = python_stack
    rng = np.random.default_rng(8)
    raws = [rng.integers(0, 256, (int(rng.integers(1, 3)), 512)).astype(np.uint8) for _ in range(10)]
    bodies = [{"inputs": [tensor("IMAGE", raw, "UINT8")]} for raw in raws]
    before = stack.metric("ringserve_batch_size_count", model="pipeline")

    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, "pipeline", bodies, 10)))

    for raw, r in zip(raws, responses):
        np.testing.assert_allclose(outputs(r)["SCORES"], preprocess_then_mlp(repo / "mlp/1/model.onnx", raw), atol=1e-5)
    assert stack.metric("ringserve_batch_size_count", model="pipeline") - before < len(raws)  # batched as one model
    status, config = stack.get("/v2/models/pipeline/config")
    assert status == 200 and config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["preprocess", "mlp"]


def test_binary_tensors_reach_a_python_model_as_they_do_an_onnx_one(python_stack) -> None:
    stack, repo = python_stack
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "parameters": {"binary_data_size": 32}}],
              "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    head = orjson.dumps(header)
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post("/v2/models/crashy/infer", content=head + x.tobytes(),
                      headers={"inference-header-content-length": str(len(head))})
    assert r.status_code == 200, r.text
    length = int(r.headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(r.content[length:], np.float32).reshape(2, 4), 2 * x + 1)


FINALIZING = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.mark = os.path.join(args["model_repository"], "finalized")
        self.args = args

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", r.inputs()[0].as_numpy())]) for r in requests]

    def finalize(self):
        with open(self.mark, "a") as f:
            f.write(f"{self.args['model_name']} {self.args['model_version']} {self.args['model_instance_kind']}\\n")
"""


def test_finalize_runs_at_an_unload_and_at_the_stop_with_tritons_args(tmp_path: Path) -> None:
    model = write_python_model(tmp_path, "fin", FINALIZING, {
        "max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}], "instance_group": [{"kind": "KIND_CPU"}]})
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [5]}]}
    with running_stack(tmp_path) as stack:
        assert stack.post("/v2/models/fin/infer", body)[1]["outputs"][0]["data"] == [5.0]
        assert stack.post("/v2/repository/models/fin/unload", {})[0] == 200
        poll_for(lambda: (model / "finalized").exists(), 30, what="finalize at the unload")
        assert (model / "finalized").read_text() == "fin 1 CPU\n"
        assert stack.post("/v2/repository/models/fin/load", {})[0] == 200
        assert stack.post("/v2/models/fin/infer", body)[0] == 200
    assert (model / "finalized").read_text() == "fin 1 CPU\nfin 1 CPU\n"  # again at the server's stop


def test_a_model_whose_model_py_completes_its_config_serves_that_config_and_loads_again(tmp_path: Path) -> None:
    copy_example(tmp_path, "batch_auto_complete", "auto_complete/batch_model.py", None)  # no config at all
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = {"inputs": [tensor("INPUT0", x, "FP32"), tensor("INPUT1", x, "FP32")]}
    with running_stack(tmp_path) as stack:
        status, config = stack.get("/v2/models/batch_auto_complete/config")
        assert status == 200 and config["max_batch_size"] == 4 and config["backend"] == "python"
        assert stack.post("/v2/repository/models/batch_auto_complete/load", {})[0] == 200
        status, doc = stack.post("/v2/models/batch_auto_complete/infer", body)
    assert status == 200 and doc["outputs"][0]["data"] == (2 * x).ravel().tolist()


def test_bls_loads_a_lazy_model_in_the_worker_that_calls_it(python_stack) -> None:
    stack, repo = python_stack
    state = lambda: {e["name"]: e.get("model_state") for e in stack.post("/v2/repository/index", {})[1]}["mlp_lazy"]
    assert state() == "unloaded"
    x = np.random.default_rng(9).standard_normal((1, 512)).astype(np.float32)

    status, doc = stack.post("/v2/models/bls_lazy/infer", crashy_body(x))

    session = ort.InferenceSession(str(repo / "mlp_lazy/1/model.onnx"), providers=["CPUExecutionProvider"])
    assert status == 200, doc
    np.testing.assert_allclose(np.asarray(doc["outputs"][0]["data"]).reshape(1, 10), session.run(None, {"x": x})[0],
                               atol=1e-5)
    poll_for(lambda: state() == "ready", 10, what="the lazy model reported loaded")
