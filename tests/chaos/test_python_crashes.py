"""A model.py that crashes the worker natively: real segfaults, a GIL-holding hang, a crash at import."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.python_models import build_crashy, build_hanging, write_python_model
from tests.support.stack import poll_for

pytestmark = pytest.mark.chaos

POISON = "the inference worker crashed (SIGSEGV) while running this request; it was retried alone and crashed again"


def body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


async def post_all(url: str, model: str, xs: list[np.ndarray]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        return await asyncio.gather(*(http.post(f"/v2/models/{model}/infer", json=body(x)) for x in xs))


def test_a_model_py_that_segfaults_on_one_input_of_a_batch_of_8_fails_that_request_alone(start_stack,
                                                                                         tmp_path: Path) -> None:
    build_crashy(tmp_path, max_batch_size=8, delay_us=2_000_000)  # the 8 requests below form one batch
    stack = start_stack(tmp_path)
    xs = [np.full((1, 4), i, np.float32) for i in range(8)]
    xs[5] = np.array([[-7, 0, 0, 0]], np.float32)

    responses = asyncio.run(post_all(stack.url, "crashy", xs))

    for i, (x, r) in enumerate(zip(xs, responses)):
        if i == 5:
            assert (r.status_code, r.json()["error"]) == (500, POISON)
        else:
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(np.asarray(r.json()["outputs"][0]["data"]).reshape(1, 4), 2 * x + 1)
    executes = [int(n) for n in (tmp_path / "crashy" / "executes.log").read_text().split()]
    assert executes[0] == 8  # the first execute got the whole batch, and died in it
    assert stack.status()["workers"][0]["restarts"]["SIGSEGV"] >= 3  # twice whole, then the halves with it
    assert stack.metric("ringserve_poison_requests_total", model="crashy") == 1
    assert stack.metric("ringserve_worker_restarts_total", reason="SIGSEGV") >= 3
    assert stack.post("/v2/models/crashy/infer", body(np.ones((1, 4), np.float32)))[0] == 200


def test_a_model_py_wedged_in_native_code_is_killed_by_the_hang_timeout(start_stack, tmp_path: Path) -> None:
    hang_timeout_s = 1.5
    build_hanging(tmp_path)
    stack = start_stack(tmp_path, "--hang-timeout-s", str(hang_timeout_s))
    pid = stack.worker_pid()

    status, doc = stack.post("/v2/models/hangs/infer", body(np.full((1, 4), -1, np.float32)))

    assert status == 500 and "crashed (hung)" in doc["error"]
    assert stack.status()["workers"][0]["restarts"].get("hung", 0) >= 2 and stack.worker_pid() != pid
    poll_for(lambda: stack.status()["ready"], 30, what="a replacement worker")
    status, doc = stack.post("/v2/models/hangs/infer", body(np.ones((1, 4), np.float32)))
    assert status == 200 and doc["outputs"][0]["data"] == [3.0] * 4


def test_a_model_py_stuck_in_python_is_bounded_by_the_batch_timeout(start_stack, tmp_path: Path) -> None:
    """A sleep (or loop) in Python lets the heartbeat thread beat: it is no hang to the supervisor, and
    --batch-timeout-s is what ends it."""
    build_hanging(tmp_path)
    stack = start_stack(tmp_path, "--batch-timeout-s", "1.5", "--hang-timeout-s", "30")

    status, doc = stack.post("/v2/models/hangs/infer", body(np.full((1, 4), -2, np.float32)))

    assert status == 500 and "crashed (batch_timeout)" in doc["error"]
    assert stack.status()["workers"][0]["restarts"].get("batch_timeout", 0) >= 2
    poll_for(lambda: stack.status()["ready"], 30, what="a replacement worker")
    assert stack.post("/v2/models/hangs/infer", body(np.ones((1, 4), np.float32)))[0] == 200


# Crashes while the worker imports it, at start-up (the scan runs auto_complete_config there).
CRASH_AT_IMPORT = """
import ctypes

ctypes.string_at(0)
"""


def test_a_model_py_that_crashes_at_import_is_quarantined_and_the_others_serve(start_stack, tmp_path: Path) -> None:
    write_python_model(tmp_path, "doomed", CRASH_AT_IMPORT, {"max_batch_size": 0, "input": [
        {"name": "x", "data_type": "TYPE_FP32", "dims": [4]}], "output": [{"name": "y", "data_type": "TYPE_FP32",
                                                                           "dims": [4]}]})
    build_crashy(tmp_path)
    stack = start_stack(tmp_path)  # ready once the fourth worker, skipping the quarantined model, is up

    status, doc = stack.post("/v2/models/doomed/infer", body(np.ones(4, np.float32)))

    assert status == 503 and "quarantined" in doc["error"] and "doomed" in doc["error"]
    assert stack.post("/v2/models/crashy/infer", body(np.ones((1, 4), np.float32)))[0] == 200
    crashes = {w["index"]: w["restarts"].get("SIGSEGV", 0) for w in stack.status()["workers"]}
    assert sum(crashes.values()) >= 3
    if len(crashes) > 1:  # --lanes model: the crashes were doomed's lane's alone; crashy's never died
        assert crashes[stack.lane("crashy")] == 0, crashes
