"""Reloads and repository loads that meet a broken model file, on the real stack.

- SIGHUP while a served model's file is garbage: the new generation fails that model, so it
  is refused and the old one serves on; not one request fails, and the log, the metric,
  /admin/status and systemd's STATUS= say so.
- A model that failed at start-up is served by a repository load once its file is fixed; until
  then it answers 503 without Retry-After (retrying cannot help).
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.lifecycle_models import WIDTH, build_versioned, infer_body
from tests.support.stack import Stack, poll_for, running_stack
from .test_systemd import Load, NotifySocket

pytestmark = pytest.mark.integration

GARBAGE = b"this is not an ONNX model\n" * 8


def run_in_this_process(model_bytes: bytes, value: float) -> np.ndarray:
    """What ONNX Runtime answers for infer_body(value=value), run here on the same file."""
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.full((1, WIDTH), value, np.float32)})[0]


def answer_of(text: str) -> np.ndarray:
    out = json.loads(text)["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def reload_over(stack: Stack, generation: int) -> dict | None:
    """/admin/status once the reload has settled: its new generation serves, or it was refused."""
    status = stack.status()
    reload = status.get("reload", {})
    refused = "m" in reload.get("kept_models", {}) and not reload.get("replacing")
    return status if refused or status["workers"][0]["generation"] != generation else None


def test_a_reload_that_reads_a_broken_file_keeps_the_old_generation_serving_that_model(tmp_path: Path, capfd):
    repo = tmp_path / "models"
    model_file = build_versioned(repo, "m", weight_bytes=1 << 16) / "1" / "model.onnx"
    expected = run_in_this_process(model_file.read_bytes(), value=0.5)
    notify = NotifySocket()
    try:
        with running_stack(repo, env={"NOTIFY_SOCKET": notify.path}) as stack:
            before = stack.status()["workers"][0]
            load = Load(stack.url, "/v2/models/m/infer", infer_body(value=0.5), clients=4).start()
            try:
                poll_for(lambda: load.count(200) >= 20, 30, what="load to run")
                model_file.write_bytes(GARBAGE)
                hup_at = time.monotonic()
                os.kill(stack.pid, signal.SIGHUP)
                status = poll_for(lambda: reload_over(stack, before["generation"]), 60, 0.05,
                                  what="the reload to finish")
                settled_at = time.monotonic()
                poll_for(lambda: sum(o.ended > settled_at for o in list(load.outcomes)) >= 20, 30,
                         what="load after the reload")
            finally:
                load.stop()
            assert load.failures() == []
            (body,) = {o.text for o in load.outcomes}
            np.testing.assert_allclose(answer_of(body), expected, rtol=1e-6)
            assert load.count(200, after=hup_at) >= 20

            worker = status["workers"][0]
            assert (worker["pid"], worker["generation"], worker["state"]) == (before["pid"], before["generation"],
                                                                              "ready")
            assert "INVALID_PROTOBUF" in status["reload"]["kept_models"]["m"]
            assert stack.metric("ringserve_reload_failures_total", model="m") == 1
            poll_for(lambda: any("reload failed for m: the old generation serves on" in s for s in notify.statuses()),
                     10, what="STATUS= to say that the reload failed for m")
            notify.first("READY", after=hup_at, timeout_s=10)  # systemd is not left in "reloading"
            assert stack.post("/v2/models/m/infer", infer_body(value=0.5))[0] == 200
    finally:
        notify.close()
    log = capfd.readouterr().err
    assert "the replacement generation 2 failed model(s) that generation 1 serves" in log
    assert "generation 1 serves on" in log


def served(stack: Stack, model: str) -> tuple[float, list[str], int]:
    """What the gateway serves as `model`: the answer to infer_body() (4 + the version), the
    versions its metadata lists, and the max_batch_size of its config."""
    status, doc = stack.post(f"/v2/models/{model}/infer", infer_body())
    assert status == 200, doc
    return (doc["outputs"][0]["data"][0], stack.get(f"/v2/models/{model}")[1]["versions"],
            stack.get(f"/v2/models/{model}/config")[1]["max_batch_size"])


def test_a_reload_with_one_broken_file_applies_another_models_change_only_once_it_is_fixed(tmp_path: Path, capfd):
    """A successor that fails a model the old generation serves is refused as a whole
    (docs/architecture.md: "Other models' changes wait for the next reload, once the file is
    fixed"): n's change read by that reload applies neither in the gateway (its config, its
    versions) nor in the worker (its answers), until a reload reads the fixed file; then both do."""
    repo = tmp_path / "models"
    model_file = build_versioned(repo, "m", weight_bytes=1 << 16) / "1" / "model.onnx"
    good_bytes = model_file.read_bytes()
    other = build_versioned(repo, "n", versions=(1, 2), weight_bytes=1 << 16,
                            version_policy={"specific": {"versions": [1]}})
    changed = {**json.loads((other / "config.json").read_text()), "max_batch_size": 8,
               "version_policy": {"specific": {"versions": [2]}}}
    expected_m = run_in_this_process(good_bytes, value=1.0)
    # (one worker with both models: with lanes, n's lane reloads on its own and m's broken file keeps only m's)
    with running_stack(repo, "--lanes", "shared") as stack:
        first = stack.status()["workers"][0]
        assert served(stack, "n") == (5.0, ["1"], 64)

        model_file.write_bytes(GARBAGE)
        (other / "config.json").write_text(json.dumps(changed))
        os.kill(stack.pid, signal.SIGHUP)
        status = poll_for(lambda: reload_over(stack, first["generation"]), 60, 0.05, what="the reload to finish")

        worker = status["workers"][0]
        assert (worker["pid"], worker["generation"]) == (first["pid"], first["generation"])  # it was refused
        assert list(status["reload"]["kept_models"]) == ["m"]
        assert stack.metric("ringserve_reload_failures_total", model="m") == 1
        assert served(stack, "n") == (5.0, ["1"], 64)  # n's change waits with the refused generation
        np.testing.assert_allclose(answer_of(json.dumps(stack.post("/v2/models/m/infer", infer_body())[1])),
                                   expected_m, rtol=1e-6)

        model_file.write_bytes(good_bytes)
        os.kill(stack.pid, signal.SIGHUP)
        poll_for(lambda: stack.status()["workers"][0]["generation"] > worker["generation"] + 1, 60, 0.05,
                 what="a generation that read the fixed file to serve")
        poll_for(lambda: served(stack, "n") == (6.0, ["2"], 8), 10, what="n's new config to apply")
        status = stack.status()
        assert status["reload"]["kept_models"] == {} and status["workers"][0]["state"] == "ready"
        np.testing.assert_allclose(answer_of(json.dumps(stack.post("/v2/models/m/infer", infer_body())[1])),
                                   expected_m, rtol=1e-6)
        assert stack.metric("ringserve_reload_failures_total", model="m") == 1
    log = capfd.readouterr().err
    assert "the replacement generation 2 failed model(s) that generation 1 serves" in log


@pytest.mark.parametrize("broken", ["config", "file"])
def test_a_model_that_failed_at_start_answers_503_without_retry_after_and_loads_once_fixed(tmp_path: Path,
                                                                                           broken: str):
    repo = tmp_path / "models"
    build_versioned(repo, "good")
    model_dir = build_versioned(repo, "late", versions=(3,))
    good_bytes = (model_dir / "3" / "model.onnx").read_bytes()
    (model_dir / "3" / "model.onnx").write_bytes(GARBAGE)
    if broken == "config":  # no config.json: the config is read from the graph, which cannot be read
        (model_dir / "config.json").unlink()
    with running_stack(repo) as stack, httpx.Client(base_url=stack.url, timeout=60) as http:
        refused = http.post("/v2/models/late/infer", json=infer_body(value=2.0))
        assert refused.status_code == 503 and "retry-after" not in refused.headers, refused.text
        assert http.post("/v2/models/good/infer", json=infer_body()).status_code == 200

        (model_dir / "3" / "model.onnx").write_bytes(good_bytes)
        loaded = http.post("/v2/repository/models/late/load", json={})
        assert loaded.status_code == 200, loaded.text

        poll_for(lambda: http.get("/v2/models/late/ready").status_code == 200, 30, what="'late' to be ready")
        answered = http.post("/v2/models/late/infer", json=infer_body(value=2.0))
        assert answered.status_code == 200, answered.text
        np.testing.assert_allclose(answer_of(answered.text), run_in_this_process(good_bytes, value=2.0), rtol=1e-6)


def test_a_reload_after_removing_versions_serves_the_one_left_at_once(tmp_path: Path):
    """Versions 3 and 2 of a model served with policy `all` are deleted and the server reloads: version 1,
    the default now, answers as soon as the reloaded generation serves (it used to answer 503 "no
    inference worker is ready" for 40 s and more, as the gateway filed the new worker's version 1 under
    the key it had as a non-default version), and a repository load of it is a load like any other."""
    repo = tmp_path / "models"
    model_dir = build_versioned(repo, "m", versions=(1, 2, 3), weight_bytes=1 << 12, version_policy={"all": {}})
    with running_stack(repo) as stack:
        assert stack.get("/v2/models/m")[1]["versions"] == ["1", "2", "3"]
        assert stack.post("/v2/models/m/infer", infer_body())[1]["outputs"][0]["data"] == [7.0]  # 4 + version 3
        first = stack.status()["workers"][0]["generation"]
        for version in ("2", "3"):
            for path in sorted((model_dir / version).iterdir()):
                path.unlink()
            (model_dir / version).rmdir()
        os.kill(stack.pid, signal.SIGHUP)
        poll_for(lambda: stack.get("/v2/models/m")[1].get("versions") == ["1"]
                 and stack.status()["workers"][0]["generation"] > first, 60, 0.05, what="the reload to apply")
        for path in ("/v2/models/m/infer", "/v2/models/m/versions/1/infer"):
            status, doc = stack.post(path, infer_body())
            assert (status, doc["outputs"][0]["data"] if status == 200 else doc) == (200, [5.0]), path
        assert stack.get("/v2/models/m/ready")[0] == 200
        assert stack.get("/v2/models/m/versions/1/ready")[0] == 200
        assert stack.get("/v2/models/m/versions/3/ready")[0] == 404
        assert stack.post("/v2/repository/models/m/unload", {})[0] == 200
        assert stack.post("/v2/repository/models/m/load", {})[0] == 200
        status, doc = stack.post("/v2/models/m/infer", infer_body())
        assert (status, doc["outputs"][0]["data"] if status == 200 else doc) == (200, [5.0])
        index = stack.post("/v2/repository/index", {})[1]
        assert [(e["name"], e["version"], e["state"]) for e in index if e["name"] == "m"] == [("m", "1", "READY")]
