"""What Triton users do by habit, on the real stack: a misspelt config field, model.onnx without a
version folder, a model the runtime cannot load; --strict-readiness and --exit-on-error."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringserve.common.exits import EXIT_MODEL_ERROR

from tests.support.lifecycle_models import build_corrupt, build_versioned, infer_body
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.integration

TYPO = "unknown field 'max_batch_sze' (did you mean 'max_batch_size'?)"


def build_typo(repo: Path) -> None:
    """A misspelt field: `max_batch_sze: 8` left max_batch_size to auto-complete (64)."""
    build_versioned(repo, "typo", weight_bytes=64)
    doc = json.loads((repo / "typo" / "config.json").read_text())
    doc["max_batch_sze"] = doc.pop("max_batch_size") // 8
    (repo / "typo" / "config.json").write_text(json.dumps(doc))


def build_flat(repo: Path) -> None:
    """model.onnx beside config.json, not in 1/."""
    build_versioned(repo, "flat", weight_bytes=64)
    (repo / "flat" / "1" / "model.onnx").rename(repo / "flat" / "model.onnx")
    (repo / "flat" / "1").rmdir()


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("broken")
    build_versioned(repo, "good", weight_bytes=64, backend="onnxruntime",  # Triton's fields it ignores
                    model_transaction_policy={"decoupled": False})
    build_typo(repo)
    build_flat(repo)
    build_corrupt(repo, "corrupt")  # its config is fine: the worker's runtime fails to load it
    return repo


class WorkersReady(Stack):
    """Started once a worker is ready, whatever /v2/health/ready says."""

    def start(self, ready_timeout_s: float = 60.0, wait_ready: bool = True) -> Stack:
        super().start(wait_ready=False)
        poll_for(self.a_worker_is_ready, ready_timeout_s, 0.05, "a ready worker")
        return self

    def a_worker_is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"ringserve exited with {self.process.returncode}")
        try:
            return any(w["state"] == "ready" for w in self.status()["workers"])
        except OSError:
            return False


def serving(repo: Path, *args: str) -> contextlib.AbstractContextManager[Stack]:
    return running_stack(repo, *args, stack_class=WorkersReady)


def index_reasons(stack: Stack) -> dict[str, str]:
    status, index = stack.post("/v2/repository/index", {})
    assert status == 200, index
    return {entry["name"]: entry["reason"] for entry in index if entry["state"] == "UNAVAILABLE"}


def test_broken_models_say_why_and_the_good_one_serves(broken_repo: Path):
    with serving(broken_repo) as stack:
        # the default: the others serve, ready as before (once every lane has announced its model)
        poll_for(lambda: stack.get("/v2/health/ready")[0] == 200, 30, what="ready")
        status, doc = stack.get("/v2/models/typo")
        assert status == 503 and TYPO in doc["error"], doc
        reasons = index_reasons(stack)
        assert TYPO in reasons["typo"]
        assert (f"found model.onnx directly in {broken_repo / 'flat'}, outside a version folder; expected "
                f"{broken_repo / 'flat'}/<version>/model.onnx") in reasons["flat"]
        poll_for(lambda: "corrupt" in index_reasons(stack), 10, what="the corrupt model's failed load")
        status, doc = stack.post("/v2/models/good/infer", infer_body())
        assert status == 200 and doc["outputs"][0]["data"] == [pytest.approx(5.0)], doc


def test_strict_readiness_is_not_ready_while_a_model_cannot_be_served(broken_repo: Path):
    with serving(broken_repo, "--strict-readiness") as stack:
        status, doc = stack.get("/v2/health/ready")
        assert (status, doc) == (503, {"ready": False})
        assert stack.status()["ready"] is False  # what `ringserve status` shows says the same
        # the good one still serves, once its lane has announced it (a ready worker may be another lane)
        poll_for(lambda: stack.get("/v2/models/good/ready")[0] == 200, 30, what="good's lane")
        assert stack.post("/v2/models/good/infer", infer_body())[0] == 200
        assert stack.get("/v2/health/ready")[0] == 503  # and the server as a whole is still not ready


def test_strict_readiness_is_ready_when_every_model_serves(tmp_path: Path):
    build_versioned(tmp_path, "good", weight_bytes=64)
    with serving(tmp_path, "--strict-readiness", "--exit-on-error") as stack:
        poll_for(lambda: stack.get("/v2/health/ready")[0] == 200, 10, what="ready")


def test_a_repository_whose_only_model_lacks_its_version_folder_is_not_ready(tmp_path: Path):
    build_flat(tmp_path)
    with serving(tmp_path) as stack:
        assert stack.get("/v2/health/ready")[0] == 503  # it was 200, serving nothing
        assert stack.status()["ready"] is False
        assert "outside a version folder" in index_reasons(stack)["flat"]


def test_exit_on_error_exits_before_serving_naming_each_model_and_why(broken_repo: Path):
    done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository",
                           str(broken_repo), "--port", "0", "--exit-on-error"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_MODEL_ERROR, done.stderr
    assert "--exit-on-error: not serving, 3 model(s) cannot be served" in done.stderr
    assert f"model 'typo': config field 'config.json': {TYPO}" in done.stderr
    assert "model 'flat': config field 'version': found model.onnx directly in" in done.stderr
    assert f"model 'corrupt': config field 'model.onnx': {broken_repo / 'corrupt' / '1' / 'model.onnx'} cannot be read" \
        in done.stderr
    assert "started gateway" not in done.stderr  # before any process starts (the log level is INFO)


# A Python model: the gateway reads its config.json as is (no ONNX graph to check the dims against).
IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", r.inputs()[0].as_numpy())]) for r in requests]
"""


def test_configs_past_the_bounds_of_dims_and_priority_levels_are_refused_with_a_4xx_naming_the_bound(tmp_path: Path):
    """65 dims once loaded, and its first request got a plain-text 500 (numpy cannot make the array);
    3,000,000 priority levels cost 5.3 s per request. Both are refused when the config is read."""
    from tests.support.python_models import fp32, write_python_model  # noqa: PLC0415 - only this test's models

    write_python_model(tmp_path, "deep", IDENTITY, {"max_batch_size": 0, "input": [fp32("x", [1] * 65)],
                                                    "output": [fp32("y", [1])]})
    write_python_model(tmp_path, "levels", IDENTITY, {
        "max_batch_size": 4, "input": [fp32("x", [1])], "output": [fp32("y", [1])],
        "dynamic_batching": {"priority_levels": 3_000_000}})
    write_python_model(tmp_path, "fine", IDENTITY, {"max_batch_size": 0, "input": [fp32("x", [1])],
                                                    "output": [fp32("y", [1])]})
    with running_stack(tmp_path) as stack:
        index = {e["name"]: e for e in stack.post("/v2/repository/index", {})[1]}
        deep = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 65, "data": [1.0]}]}
        infer_status, infer_doc = stack.post("/v2/models/deep/infer", deep)
        load_status, load_doc = stack.post("/v2/repository/models/deep/load", {})
        levels_status, levels_doc = stack.post("/v2/repository/models/levels/load", {})
        fine = stack.post("/v2/models/fine/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                                               "data": [2.0]}]})

    assert "65 dims" in index["deep"]["reason"] and "at most 64" in index["deep"]["reason"], index["deep"]
    assert infer_status in (400, 404, 503) and "at most 64" in infer_doc["error"], infer_doc
    assert load_status == 400 and "at most 64" in load_doc["error"], load_doc
    assert levels_status == 400 and "priority_levels" in levels_doc["error"] and "at most 64" in levels_doc["error"]
    assert "priority_levels" in index["levels"]["reason"]
    assert fine[0] == 200 and fine[1]["outputs"][0]["data"] == [2.0]
