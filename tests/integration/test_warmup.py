"""Triton's model_warmup: a model runs its warm-up samples inside its load, and is not ready until they ran."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ringserve.common.repository.demo import mlp_model, write_model_dir
from tests.support.stack import Stack, poll_for
from tests.support.warmup_models import build_decoupled, build_failing_infer, build_slow_first, executes


def body(x: np.ndarray, name: str = "x") -> dict:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def test_a_model_is_not_ready_until_its_warmup_samples_have_run(tmp_path: Path) -> None:
    model_dir = build_slow_first(tmp_path, first_run_s=3.0, batch_size=2, count=3)
    stack = Stack(tmp_path)
    try:
        stack.start(wait_ready=False)
        poll_for(lambda: executes(model_dir), 60, what="the first warm-up execute")  # it sleeps 3 s in there

        assert stack.get("/v2/models/slow_first/ready")[0] != 200
        assert stack.get("/v2/health/ready")[0] == 503

        poll_for(lambda: stack.get("/v2/models/slow_first/ready")[0] == 200, 60, what="the model to be ready")
        (pid,) = {pid for pid, _, _ in executes(model_dir)}
        assert executes(model_dir) == [(pid, "warm", 2)] * 3  # count 3 executions of batch_size 2 requests
        started = time.monotonic()
        status, doc = stack.post("/v2/models/slow_first/infer", body(np.ones((1, 4), np.float32)))
        assert status == 200 and doc["outputs"][0]["data"] == [2.0] * 4
        assert time.monotonic() - started < 2.0  # the cold first run was the warm-up's
        assert executes(model_dir)[-1] == (pid, "real", 1)
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()


def test_a_warmup_sample_that_fails_fails_the_load_with_tritons_words(start_stack, tmp_path: Path) -> None:
    """Triton's L0_warmup failing_infer: its model answers the warm-up with an error, so the load fails."""
    build_failing_infer(tmp_path)
    write_model_dir(tmp_path, "mlp", mlp_model(), None)  # so that the server serves something and gets ready
    stack = start_stack(tmp_path)

    assert stack.get("/v2/models/failing_infer/ready")[0] != 200
    _, index = stack.post("/v2/repository/index", {})
    (entry,) = [e for e in index if e["name"] == "failing_infer"]
    assert entry["state"] == "UNAVAILABLE" and "failed to run warmup sample 'zero sample'" in entry["reason"]
    status, doc = stack.post("/v2/models/failing_infer/infer", body(np.ones(4, np.float32), "INPUT"))
    assert status == 503 and "failed to run warmup sample 'zero sample': An Error Occurred; " in doc["error"], doc


def test_a_decoupled_model_is_warmed_through_its_response_senders(start_stack, tmp_path: Path) -> None:
    """Triton's L0_warmup decoupled case: the sample's responses come through senders, up to the final flag."""
    model_dir = build_decoupled(tmp_path)
    stack = start_stack(tmp_path)

    assert stack.get("/v2/models/decoupled/ready")[0] == 200
    assert [(kind, n) for _, kind, n in executes(model_dir)] == [("warm", 1)]


def test_an_onnx_models_warmup_reads_its_data_file_and_a_missing_one_fails_the_load(start_stack,
                                                                                    tmp_path: Path) -> None:
    for name, data_file in (("warm", "ones"), ("nofile", "missing")):
        model = write_model_dir(tmp_path, name, mlp_model(), None).parent.parent
        (model / "config.pbtxt").write_text(f"""\
name: "{name}"
platform: "onnxruntime_onnx"
model_warmup [ {{
  name: "from file"
  batch_size: 8
  count: 2
  inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ 512 ] input_data_file: "{data_file}" }} }}
}} ]
""")
    (tmp_path / "warm" / "warmup").mkdir()
    (tmp_path / "warm" / "warmup" / "ones").write_bytes(np.ones(512, np.float32).tobytes())
    stack = start_stack(tmp_path)

    assert stack.get("/v2/models/warm/ready")[0] == 200
    assert stack.get("/v2/models/nofile/ready")[0] != 200
    _, index = stack.post("/v2/repository/index", {})
    (entry,) = [e for e in index if e["name"] == "nofile"]
    assert "failed to run warmup sample 'from file': [Errno 2] No such file" in entry["reason"], entry
    assert "nofile/warmup/missing'; " in entry["reason"]
