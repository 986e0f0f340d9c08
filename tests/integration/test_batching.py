"""Dynamic batching on the real stack: padded, bucketed batches give unbatched answers."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.stack import Stack, held_requests

pytestmark = pytest.mark.integration


def encoder_copy(demo_repo: Path, repo: Path, name: str, buckets: list[int]) -> None:
    shutil.copytree(demo_repo / "encoder", repo / name)
    config = json.loads((repo / name / "config.json").read_text())
    config["name"] = name
    config["dynamic_batching"]["sequence_buckets"] = buckets
    (repo / name / "config.json").write_text(json.dumps(config))


def encoder_body(ids: np.ndarray, mask: np.ndarray | None) -> dict:
    inputs = [{"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}]
    if mask is not None:
        inputs.append({"name": "attention_mask", "shape": list(mask.shape), "datatype": "INT64",
                       "data": mask.ravel().tolist()})
    return {"inputs": inputs}


def test_mixed_lengths_batch_padded_and_bucketing_halves_the_waste(start_stack, demo_repo: Path, tmp_path: Path) -> None:
    encoder_copy(demo_repo, tmp_path, "bucketed", [16, 32, 64, 128, 256, 512])
    encoder_copy(demo_repo, tmp_path, "flat", [])
    stack: Stack = start_stack(tmp_path)
    rng = np.random.default_rng(21)
    cases = []
    for i in range(256):
        length = int(rng.integers(1, 513))
        ids = rng.integers(0, 1000, (1, length), dtype=np.int64)
        mask = None
        if i % 2:  # half send their own mask with trailing padding; the other half leave it out
            mask = np.ones((1, length), np.int64)
            mask[0, rng.integers(1, length + 1):] = 0
        cases.append((ids, mask))
    session = ort.InferenceSession(str(demo_repo / "encoder/1/model.onnx"), providers=["CPUExecutionProvider"])

    async def run(model: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(cases))
        async with httpx.AsyncClient(base_url=stack.url, timeout=120, limits=limits) as http:
            semaphore = asyncio.Semaphore(len(cases))

            async def one(ids: np.ndarray, mask: np.ndarray | None) -> httpx.Response:
                async with semaphore:
                    return await http.post(f"/v2/models/{model}/infer", json=encoder_body(ids, mask))

            return await asyncio.gather(*(one(ids, mask) for ids, mask in cases))

    for model in ("bucketed", "flat"):
        # Every request waits in the queue before the first batch forms (the worker stopped meanwhile), so
        # the batches, and their padding, do not depend on how fast this machine answers the first ones:
        # on a starved CPU requests went in smaller batches, with less padding to save.
        answers = stack.send_while_stopped(lambda: asyncio.run(run(model)),
                                           until=lambda status: held_requests(status) >= len(cases) // 2)
        for (ids, mask), response in zip(cases, answers):
            assert response.status_code == 200, response.text
            out = response.json()["outputs"][0]
            alone = session.run(None, {"input_ids": ids, "attention_mask": mask if mask is not None else np.ones_like(ids)})[0]
            np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), alone, rtol=0, atol=1e-5)
        # Requests did share batches.
        assert stack.metric("ringserve_batch_size_count", model=model) < len(cases)

    def waste(model: str) -> float:
        return stack.metric("ringserve_padded_elements_total", model=model) / stack.metric(
            "ringserve_real_elements_total", model=model)

    assert waste("flat") > 0
    assert waste("bucketed") <= 0.5 * waste("flat"), (waste("bucketed"), waste("flat"))


def test_priority_parameter_and_queue_policy_are_enforced_over_http(start_stack, demo_repo: Path, tmp_path: Path) -> None:
    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    config = json.loads((tmp_path / "mlp/config.json").read_text())
    config["dynamic_batching"].update(priority_levels=2, default_queue_policy={"max_queue_size": 1000})
    (tmp_path / "mlp/config.json").write_text(json.dumps(config))
    stack = start_stack(tmp_path)
    body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}],
            "parameters": {"priority": 1, "timeout": 5_000_000}}
    assert stack.post("/v2/models/mlp/infer", body)[0] == 200
    body["parameters"]["priority"] = 3
    status, doc = stack.post("/v2/models/mlp/infer", body)
    assert status == 400 and "2 priority level(s)" in doc["error"]
