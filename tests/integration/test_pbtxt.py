"""Models configured by Triton's config.pbtxt, served by the real stack: the
answers equal ONNX Runtime's in this process, and /v2/models/{m}/config shows the pbtxt's values."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.exits import EXIT_MODEL_ERROR

from tests.support.pbtxt_models import BATCHING_PBTXT, UNBATCHED_PBTXT, build_segsum, build_twice, ragged_pbtxt
from tests.support.stack import poll_for, running_stack
from .test_model_kinds import outputs, post_all, tensor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pbtxt_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("pbtxt")
    build_twice(repo, BATCHING_PBTXT)
    build_segsum(repo, ragged_pbtxt("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"))
    build_twice(repo, UNBATCHED_PBTXT.replace('"twice"', '"flat"'), name="flat")
    assert not any(repo.glob("*/config.json"))
    with running_stack(repo) as stack:
        yield stack, repo


def session(repo, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def test_config_shows_the_pbtxts_values(pbtxt_stack) -> None:
    stack, _ = pbtxt_stack
    status, doc = stack.get("/v2/models/twice/config")
    assert status == 200, doc
    assert doc["max_batch_size"] == 2  # the config's own value: 2 stays 2, not auto-completed
    assert doc["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    batching = doc["dynamic_batching"]
    assert batching["preferred_batch_size"] == [2] and batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 3 and batching["default_priority_level"] == 2
    assert batching["default_queue_policy"] == {"timeout_action": "DELAY", "default_timeout_microseconds": 5000000,
                                                "allow_timeout_override": True, "max_queue_size": 64}
    assert batching["priority_queue_policy"]["1"]["max_queue_size"] == 16
    assert doc["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert doc["version_policy"] == {"specific": {"versions": [1]}}
    status, doc = stack.get("/v2/models/segsum/config")
    assert doc["batch_input"] == [{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "target_name": ["OFFSETS"],
                                   "data_type": "TYPE_INT32", "source_input": ["INPUT"]}]
    assert doc["input"][0]["allow_ragged_batch"] is True and doc["max_batch_size"] == 16
    status, doc = stack.get("/v2/models/flat/config")
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc


def test_dynamic_batching_model_answers_as_onnx_runtime(pbtxt_stack) -> None:
    stack, repo = pbtxt_stack
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((int(rng.integers(1, 3)), 4)).astype(np.float32) for _ in range(24)]
    responses = asyncio.run(post_all(stack.url, "twice", [{"inputs": [tensor("x", x, "FP32")]} for x in xs], 8))
    model = session(repo, "twice")
    for x, response in zip(xs, responses):
        np.testing.assert_allclose(outputs(response)["y"], model.run(None, {"x": x})[0], atol=1e-6)
    # max_batch_size 2 is in force: three rows in one request are refused.
    status, doc = stack.post("/v2/models/twice/infer", {"inputs": [tensor("x", np.zeros((3, 4), np.float32), "FP32")]})
    assert status == 400, doc


def test_ragged_model_answers_as_onnx_runtime(pbtxt_stack) -> None:
    stack, repo = pbtxt_stack
    rng = np.random.default_rng(8)
    pieces = [rng.integers(-10, 10, (1, int(rng.integers(1, 30)))).astype(np.float32) for _ in range(16)]
    responses = asyncio.run(post_all(stack.url, "segsum", [{"inputs": [tensor("INPUT", p, "FP32")]} for p in pieces], 8))
    model = session(repo, "segsum")
    for piece, response in zip(pieces, responses):
        alone = model.run(None, {"INPUT": piece.ravel(), "OFFSETS": np.array([0, piece.size], np.int32)})[0]
        np.testing.assert_array_equal(outputs(response)["SUM"], alone)


def test_unbatched_model_takes_tensors_as_sent(pbtxt_stack) -> None:
    stack, repo = pbtxt_stack
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    status, doc = stack.post("/v2/models/flat/infer", {"inputs": [tensor("x", x, "FP32")]})
    assert status == 200, doc
    y = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])
    np.testing.assert_allclose(y, session(repo, "flat").run(None, {"x": x})[0], atol=1e-6)


def test_exit_on_error_names_each_broken_pbtxt_and_why(tmp_path) -> None:
    build_twice(tmp_path, {"max_batch_size": 2}, name="both")
    (tmp_path / "both" / "config.pbtxt").write_text('name: "both"\nmax_batch_size: 2\n')
    build_twice(tmp_path, 'name: "garbled"\nmax_batch_size: two\n', name="garbled")
    unsupported = "instance_group [ { count: 1 passive: true } ]"  # (batch_output is served now: reshape.py)
    build_twice(tmp_path, f'name: "unsupported"\nmax_batch_size: 2\n{unsupported}\n', name="unsupported")
    done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(tmp_path),
                           "--port", "0", "--exit-on-error"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_MODEL_ERROR, done.stderr
    assert "3 model(s) cannot be served" in done.stderr
    assert f"{tmp_path / 'both'} holds both config.json and config.pbtxt; keep one" in done.stderr
    assert f"model 'garbled': config field 'config.pbtxt': {tmp_path / 'garbled' / 'config.pbtxt'}:2:17 : " \
        in done.stderr
    assert "model 'unsupported': config field 'instance_group[0]': Triton's field 'passive' is not supported" \
        in done.stderr


def test_a_refused_pbtxt_model_loads_once_its_pbtxt_is_fixed(tmp_path) -> None:
    """The repository load API re-reads config.pbtxt as it re-reads config.json."""
    fixed = BATCHING_PBTXT.replace('"twice"', '"late"')
    unsupported = "instance_group [ { count: 1 passive: true } ]\n"  # (refused: Triton's passive instances)
    build_twice(tmp_path, fixed.split("# Triton's model-configuration")[0] + unsupported, name="late")
    build_twice(tmp_path, BATCHING_PBTXT)
    with running_stack(tmp_path) as stack:
        x = np.ones((1, 4), np.float32)
        status, doc = stack.post("/v2/models/late/infer", {"inputs": [tensor("x", x, "FP32")]})
        assert status == 503 and "passive" in doc["error"], doc
        (tmp_path / "late" / "config.pbtxt").write_text(fixed)
        status, doc = stack.post("/v2/repository/models/late/load", {})
        assert status == 200, doc
        poll_for(lambda: stack.get("/v2/models/late/ready")[0] == 200, 30, what="'late' to be ready")
        status, doc = stack.post("/v2/models/late/infer", {"inputs": [tensor("x", x, "FP32")]})
        assert status == 200, doc
        np.testing.assert_allclose(doc["outputs"][0]["data"], session(tmp_path, "late").run(None, {"x": x})[0].ravel())
        assert stack.get("/v2/models/late/config")[1]["max_batch_size"] == 2
