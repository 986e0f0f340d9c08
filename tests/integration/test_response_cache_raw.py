"""The response cache's raw-request index (gateway/cache/raw.py) on a real stack of two gateways with an API
key: the same request bytes again are answered from the answer stored for them, while the worker is stopped,
through either gateway, counted as Triton's cache hits; the same tensors in other JSON still hit Triton's key;
the key is checked before the cache is; requests with client shared-memory regions never use the index."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.utils.shared_memory as shm

from ringserve.common.repository.demo import MLP_IN, MLP_OUT

from tests.support.stack import Stack, poll_for, running_stack

from .test_gateways import gateway_client, gateway_ready

pytestmark = pytest.mark.integration

MODEL = "cached"
KEY = "raw-cache-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
KEY_PREFIX = "/rs-test-rawc-"


class KeyedStack(Stack):
    """Every GET (readiness, /admin/status) with the key."""

    def get(self, path: str) -> tuple[int, Any]:
        return self._call(urllib.request.Request(self.url + path, headers=AUTH))

    def is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"ringserve exited with {self.process.returncode} before it was ready")
        try:
            return httpx.get(self.url + "/v2/health/ready", headers=AUTH, timeout=1).status_code == 200
        except httpx.TransportError:
            return False


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("raw_cache")
    shutil.copytree(demo_repo / "mlp", repo / MODEL)
    config = json.loads((repo / MODEL / "config.json").read_text())
    (repo / MODEL / "config.json").write_text(json.dumps({**config, "name": MODEL, "response_cache": {"enable": True}}))
    return repo


@pytest.fixture(scope="module")
def runtime_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="rs-rr-")  # short: a Unix socket's path may not pass 107 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(repo: Path, runtime_dir: str) -> Iterator[Stack]:
    # --hang-timeout-s: a worker held by SIGSTOP for a while is not replaced meanwhile
    with running_stack(repo, "--gateways", "2", "--runtime-dir", runtime_dir, "--cache-config", "local,size=1048576",
                       "--hang-timeout-s", "60", "--allow-client-shm", "--client-shm-key-prefix", KEY_PREFIX,
                       env={"RINGSERVE_API_KEY": KEY}, stack_class=KeyedStack) as s:
        poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in (0, 1)), 60, what="both gateways ready")
        yield s


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, headers=AUTH, timeout=60) as client:
        yield client


def sample(seed: float) -> np.ndarray:
    return np.linspace(-1, 1, MLP_IN, dtype=np.float32).reshape(1, MLP_IN) * np.float32(seed)


def raw_body(x: np.ndarray, **extra) -> bytes:
    doc = {**extra, "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return json.dumps(doc).encode()


def post(client: httpx.Client, body: bytes, **headers: str) -> httpx.Response:
    reply = client.post(f"/v2/models/{MODEL}/infer", content=body, headers={"content-type": "application/json",
                                                                            **headers})
    assert reply.status_code == 200, reply.text
    return reply


def answer_of(reply: httpx.Response) -> np.ndarray:
    out = reply.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def onnxruntime_answer(repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def cache_counts(client: httpx.Client) -> dict[str, int]:
    stats = client.get(f"/v2/models/{MODEL}/versions/1/stats").json()["model_stats"][0]["inference_stats"]
    return {"success": int(stats["success"]["count"]), "hit": int(stats["cache_hit"]["count"]),
            "miss": int(stats["cache_miss"]["count"]), "compute": int(stats["compute_infer"]["count"])}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def raw_hits(stack: Stack) -> float:
    return stack.metric("ringserve_cache_raw_hits")


def test_the_same_bytes_again_are_answered_while_the_worker_is_stopped_and_counted_as_hits(stack, repo, http):
    x = sample(0.5)
    body = raw_body(x, id="first")
    before, before_raw = cache_counts(http), raw_hits(stack)
    server_before = {name: stack.metric(name) for name in ("nv_cache_num_lookups", "nv_cache_num_hits",
                                                           "nv_cache_num_misses", "nv_cache_num_entries")}
    miss = post(http, body, **{"x-request-id": "req-1"})  # the whole way: stored under Triton's key
    pid = stack.worker_pid(stack.lane(MODEL))
    os.kill(pid, signal.SIGSTOP)
    try:
        seen_twice = post(http, body, **{"x-request-id": "req-2"})  # Triton's key: stored under its bytes too
        raw_hit = post(http, body, **{"x-request-id": "req-3"})
        unnamed = post(http, body)
    finally:
        os.kill(pid, signal.SIGCONT)

    np.testing.assert_allclose(answer_of(raw_hit), onnxruntime_answer(repo, x), rtol=1e-5, atol=1e-6)
    assert miss.content == seen_twice.content == raw_hit.content == unnamed.content
    assert raw_hit.json()["id"] == "first"  # the body's id, in the key
    assert [r.headers["x-request-id"] for r in (miss, seen_twice, raw_hit)] == ["req-1", "req-2", "req-3"]
    assert unnamed.headers["x-request-id"] not in ("req-1", "req-2", "req-3")  # none sent: one made for it
    assert raw_hits(stack) - before_raw == 2
    assert delta(cache_counts(http), before) == {"success": 4, "hit": 3, "miss": 1, "compute": 1}
    labels = {"model": MODEL, "version": "1"}
    assert stack.metric("nv_cache_num_hits_per_model", **labels) == cache_counts(http)["hit"]
    server = {name: stack.metric(name) - server_before[name] for name in server_before}
    # Triton's numbers: one lookup per request, and one response stored (its raw answer is counted apart)
    assert server == {"nv_cache_num_lookups": 4, "nv_cache_num_hits": 3, "nv_cache_num_misses": 1,
                      "nv_cache_num_entries": 1}
    assert stack.metric("ringserve_cache_raw_entries") >= 1


def test_both_gateways_share_the_raw_answers(stack, runtime_dir):
    body = raw_body(sample(0.75))
    with gateway_client(runtime_dir, 0) as client:
        first = post(client, body).content
        post(client, body)  # seen twice: now stored under its bytes
    before_raw = raw_hits(stack)
    with gateway_client(runtime_dir, 1) as client:
        answer = post(client, body).content
        own = client.get(f"/v2/models/{MODEL}/versions/1/stats", params={"scope": "gateway"}).json()
    assert answer == first
    assert raw_hits(stack) - before_raw == 1  # gateway 1 found gateway 0's answer by its bytes
    assert int(own["model_stats"][0]["inference_stats"]["cache_hit"]["count"]) >= 1


def test_the_same_tensors_in_other_json_hit_tritons_key_and_then_their_own_bytes(stack, http):
    x = sample(-1.5)
    compact = raw_body(x)
    spaced = json.dumps(json.loads(compact), indent=2).encode()
    first = answer_of(post(http, compact))
    before, before_raw = cache_counts(http), raw_hits(stack)

    np.testing.assert_array_equal(answer_of(post(http, spaced)), first)  # other bytes: Triton's key
    assert (delta(cache_counts(http), before)["hit"], raw_hits(stack) - before_raw) == (1, 0)
    np.testing.assert_array_equal(answer_of(post(http, spaced)), first)  # now stored under its bytes too
    assert (delta(cache_counts(http), before)["hit"], raw_hits(stack) - before_raw) == (2, 1)
    assert delta(cache_counts(http), before)["compute"] == 0


def test_a_request_without_the_key_is_refused_though_its_bytes_are_cached(stack, http):
    body = raw_body(sample(2.5))
    post(http, body)
    post(http, body)  # seen twice: stored under its bytes
    before_raw = raw_hits(stack)
    with httpx.Client(base_url=stack.url, timeout=60) as anonymous:
        refused = anonymous.post(f"/v2/models/{MODEL}/infer", content=body)
        wrong = anonymous.post(f"/v2/models/{MODEL}/infer", content=body, headers={"Authorization": "Bearer no"})
    assert (refused.status_code, wrong.status_code) == (401, 401)
    assert "outputs" not in refused.text and "outputs" not in wrong.text
    assert raw_hits(stack) == before_raw
    post(http, body)
    assert raw_hits(stack) == before_raw + 1  # (it was there: with the key, a raw hit)


def test_a_request_whose_outputs_go_into_a_client_region_never_uses_the_raw_index(stack, repo, runtime_dir):
    x = sample(1.25)
    out_bytes = MLP_OUT * 4
    handle = shm.create_shared_memory_region("rawout", f"{KEY_PREFIX}{secrets.token_hex(4)}", out_bytes)
    try:
        with gateway_client(runtime_dir, 0) as client:
            registered = client.post("/v2/systemsharedmemory/region/rawout/register",
                                     json={"key": handle._shm_key, "offset": 0, "byte_size": out_bytes})
            assert registered.status_code == 200, registered.text
            body = raw_body(x, outputs=[{"name": "y", "parameters": {"shared_memory_region": "rawout",
                                                                     "shared_memory_byte_size": out_bytes}}])
            before_raw, lookups = raw_hits(stack), stack.metric("nv_cache_num_lookups")
            for _ in range(3):
                shm.set_shared_memory_region(handle, [np.zeros((1, MLP_OUT), np.float32)])
                post(client, body)
                written = shm.get_contents_as_numpy(handle, np.float32, [1, MLP_OUT])
                np.testing.assert_allclose(written, onnxruntime_answer(repo, x), rtol=1e-5, atol=1e-6)
            client.post("/v2/systemsharedmemory/region/rawout/unregister")
        assert raw_hits(stack) == before_raw
        assert stack.metric("nv_cache_num_lookups") == lookups  # (Triton's key is not used for them either)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_request_whose_inputs_come_from_a_client_region_is_answered_for_the_region_now(stack, repo, runtime_dir):
    in_bytes = MLP_IN * 4
    handle = shm.create_shared_memory_region("rawin", f"{KEY_PREFIX}{secrets.token_hex(4)}", in_bytes)
    try:
        with gateway_client(runtime_dir, 0) as client:
            registered = client.post("/v2/systemsharedmemory/region/rawin/register",
                                     json={"key": handle._shm_key, "offset": 0, "byte_size": in_bytes})
            assert registered.status_code == 200, registered.text
            body = json.dumps({"inputs": [{"name": "x", "shape": [1, MLP_IN], "datatype": "FP32", "parameters": {
                "shared_memory_region": "rawin", "shared_memory_byte_size": in_bytes}}]}).encode()
            before_raw = raw_hits(stack)
            for seed in (0.5, 0.5, -2.0):  # the same bytes each time; the region's contents change
                x = sample(seed)
                shm.set_shared_memory_region(handle, [x])
                np.testing.assert_allclose(answer_of(post(client, body)), onnxruntime_answer(repo, x),
                                           rtol=1e-5, atol=1e-6)
            client.post("/v2/systemsharedmemory/region/rawin/unregister")
        assert raw_hits(stack) == before_raw
    finally:
        shm.destroy_shared_memory_region(handle)
