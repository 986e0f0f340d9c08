"""Triton's response cache on a real stack of two gateways (--cache-config local,size=N): a hit is answered
without the worker, with the numbers ONNX Runtime computes; the statistics and the nv_cache_* metrics count
hits and misses; the least recently used response goes first; both gateways share one store; decoupled and
sequence models are refused a cache with Triton's words; and the store leaves nothing in /dev/shm."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton

from tests.support.python_models import copy_example
from tests.support.sequence_models import build_accumulator
from tests.support.stack import Stack, free_port, poll_for, running_stack, shm_segments

from .test_gateways import gateway_client, gateway_ready

pytestmark = pytest.mark.integration

CACHE_BYTES = 4096  # 64 blocks of 64 bytes; one mlp answer (1 row) takes 2: 16 entries at most
WIDTH = 512  # the demo mlp's input


def cached_copy(demo_repo: Path, repo: Path, name: str, enable: bool | None = True) -> None:
    """The demo mlp as `name`, with response_cache { enable: <enable> } (None: no such field)."""
    shutil.copytree(demo_repo / "mlp", repo / name)
    config = json.loads((repo / name / "config.json").read_text())
    config["name"] = name
    if enable is not None:
        config["response_cache"] = {"enable": enable}
    (repo / name / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("response_cache")
    for name in ("stopped", "counted", "shared", "lru"):
        cached_copy(demo_repo, repo, name)
    cached_copy(demo_repo, repo, "plain", enable=None)
    # Triton refuses a cache on these at load (core model_config_utils.cc); written as Triton's users write them.
    copy_example(repo, "decoupled_cached", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    pbtxt = repo / "decoupled_cached" / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace('name: "square_int32"', 'name: "decoupled_cached"')
                     + "\nresponse_cache { enable: true }\n")
    build_accumulator(repo, "sequence_cached")
    config = json.loads((repo / "sequence_cached" / "config.json").read_text())
    (repo / "sequence_cached" / "config.json").write_text(json.dumps({**config, "response_cache": {"enable": True}}))
    return repo


@pytest.fixture(scope="module")
def runtime_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="rs-rc-")  # short: a Unix socket's path may not pass 107 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(repo: Path, runtime_dir: str) -> Iterator[Stack]:
    grpc_port = free_port()
    # --hang-timeout-s: a worker held by SIGSTOP for a while is not replaced meanwhile
    with running_stack(repo, "--gateways", "2", "--runtime-dir", runtime_dir, "--grpc-port", str(grpc_port),
                       "--cache-config", f"local,size={CACHE_BYTES}", "--hang-timeout-s", "60",
                       "--hold-when-unavailable-s", "30") as s:
        s.grpc_port = grpc_port
        poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in (0, 1)), 60, what="both gateways ready")
        yield s


def body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def sample(seed: float) -> np.ndarray:
    return np.linspace(-1, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH) * np.float32(seed)


def infer(stack: Stack, model: str, x: np.ndarray) -> np.ndarray:
    status, doc = stack.post(f"/v2/models/{model}/infer", body(x))
    assert status == 200, doc
    out = doc["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def stats(stack: Stack, model: str) -> dict:
    status, doc = stack.get(f"/v2/models/{model}/versions/1/stats")
    assert status == 200, doc
    return doc["model_stats"][0]


def counts(doc: dict) -> dict[str, int]:
    s = doc["inference_stats"]
    return {"success": int(s["success"]["count"]), "hit": int(s["cache_hit"]["count"]),
            "miss": int(s["cache_miss"]["count"]), "compute": int(s["compute_infer"]["count"]),
            "queue": int(s["queue"]["count"]), "inferences": int(doc["inference_count"]),
            "executions": int(doc["execution_count"])}


def hits(stack: Stack, model: str) -> int:
    return counts(stats(stack, model))["hit"]


def onnxruntime_answer(repo: Path, model: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_cached_request_is_answered_while_the_worker_is_stopped_and_an_uncached_one_waits(stack, repo):
    x, other = sample(0.5), sample(-0.25)
    expected = onnxruntime_answer(repo, "stopped", x)
    np.testing.assert_allclose(infer(stack, "stopped", x), expected, rtol=1e-5, atol=1e-6)  # the miss: stored
    pid = stack.worker_pid(stack.lane("stopped"))
    os.kill(pid, signal.SIGSTOP)
    try:
        answered = infer(stack, "stopped", x)  # the hit: no worker runs while it is stopped
        request = urllib.request.Request(f"{stack.url}/v2/models/stopped/infer", data=json.dumps(body(other)).encode(),
                                         headers={"content-type": "application/json"})
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            urllib.request.urlopen(request, timeout=1.5)  # a miss needs the worker: it waits
    finally:
        os.kill(pid, signal.SIGCONT)

    np.testing.assert_array_equal(answered, infer(stack, "stopped", x))
    np.testing.assert_allclose(answered, expected, rtol=1e-5, atol=1e-6)
    assert hits(stack, "stopped") == 2


def test_statistics_and_nv_cache_metrics_count_hits_and_misses_as_tritons(stack):
    server_before = {name: stack.metric(name) for name in ("nv_cache_num_lookups", "nv_cache_num_hits",
                                                           "nv_cache_num_misses")}
    before = counts(stats(stack, "counted"))
    xs = [sample(seed) for seed in (1.0, 2.0, 3.0)]
    for x in xs:
        first = infer(stack, "counted", x)  # a miss
        for _ in range(2):
            np.testing.assert_array_equal(infer(stack, "counted", x), first)  # two hits

    after = counts(stats(stack, "counted"))
    delta = {k: after[k] - before[k] for k in after}
    # Triton's: a hit is a success with no compute, no inference and no execution (tritonserver.cc's compute
    # count is success less cache hits); a miss ran the model.
    assert delta == {"success": 9, "hit": 6, "miss": 3, "compute": 3, "queue": 9, "inferences": 3, "executions": 3}
    doc = stats(stack, "counted")["inference_stats"]
    assert int(doc["cache_hit"]["ns"]) > 0 and int(doc["cache_miss"]["ns"]) > 0
    labels = {"model": "counted", "version": "1"}
    assert stack.metric("nv_cache_num_hits_per_model", **labels) == after["hit"]
    assert stack.metric("nv_cache_num_misses_per_model", **labels) == after["miss"]
    for family, part in (("nv_cache_hit_duration_per_model", "cache_hit"), ("nv_cache_miss_duration_per_model",
                                                                           "cache_miss")):
        # (µs, each gateway's share rounded down before they are added up)
        assert 0 <= int(doc[part]["ns"]) // 1000 - stack.metric(family, **labels) <= 2
    server = {name: stack.metric(name) - server_before[name] for name in server_before}
    assert server == {"nv_cache_num_lookups": 9, "nv_cache_num_hits": 6, "nv_cache_num_misses": 3}
    assert 0 < stack.metric("nv_cache_util") <= 1 and stack.metric("nv_cache_num_entries") >= 1
    with triton.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        grpc_stats = client.get_inference_statistics("counted", "1", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(grpc_stats["cache_hit"]["count"]) == after["hit"]
    assert int(grpc_stats["cache_miss"]["count"]) == after["miss"]


def test_a_request_over_grpc_finds_the_response_an_http_request_stored(stack):
    x = sample(-3.0)
    expected = infer(stack, "counted", x)
    before = hits(stack, "counted")
    with triton.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = client.infer("counted", [tensor]).as_numpy("y")

    np.testing.assert_array_equal(answer, expected)
    assert hits(stack, "counted") - before == 1


def test_a_model_whose_config_does_not_enable_it_never_uses_the_cache(stack):
    lookups = stack.metric("nv_cache_num_lookups")
    x = sample(7.0)
    for _ in range(3):
        infer(stack, "plain", x)

    assert stack.metric("nv_cache_num_lookups") == lookups
    assert counts(stats(stack, "plain"))["hit"] == 0
    assert "nv_cache_num_hits_per_model{model=\"plain\"" not in stack.get("/metrics")[1]


def test_the_least_recently_used_response_is_evicted_first(stack):
    evictions = stack.metric("nv_cache_num_evictions")
    kept = sample(0.125)
    infer(stack, "lru", kept)
    before = hits(stack, "lru")
    fillers = [sample(10.0 + i) for i in range(24)]  # more than the 16 entries (and 64 blocks) hold
    for x in fillers:
        infer(stack, "lru", x)
        infer(stack, "lru", kept)  # used again after every new one: never the least recently used
    assert hits(stack, "lru") - before == len(fillers)  # so never evicted: each of its requests was a hit

    infer(stack, "lru", fillers[0])  # the oldest filler was: a miss again
    assert hits(stack, "lru") - before == len(fillers)
    assert stack.metric("nv_cache_num_evictions") - evictions >= len(fillers) - 16


def test_both_gateways_share_one_cache_a_miss_through_one_is_a_hit_through_the_other(stack, runtime_dir):
    x = sample(0.75)
    answers, hit_by = [], []
    for k in (0, 1):
        with gateway_client(runtime_dir, k) as http:
            reply = http.post("/v2/models/shared/infer", json=body(x))
            assert reply.status_code == 200, reply.text
            answers.append(reply.json()["outputs"][0]["data"])
            own = http.get("/v2/models/shared/versions/1/stats", params={"scope": "gateway"}).json()
            hit_by.append(int(own["model_stats"][0]["inference_stats"]["cache_hit"]["count"]))

    assert answers[0] == answers[1]
    assert hit_by == [0, 1]  # gateway 0 ran the model and stored its answer; gateway 1 found it


def test_concurrent_requests_of_both_gateways_get_their_own_answers(stack, repo, runtime_dir):
    xs = [sample(0.01 * i) for i in range(12)]
    expected = [onnxruntime_answer(repo, "shared", x) for x in xs]

    def send(i: int) -> np.ndarray:
        with gateway_client(runtime_dir, i % 2) as http:
            reply = http.post("/v2/models/shared/infer", json=body(xs[i % len(xs)]))
            assert reply.status_code == 200, reply.text
            out = reply.json()["outputs"][0]
            return np.asarray(out["data"], np.float32).reshape(out["shape"])

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(send, range(48)))

    for i, answer in enumerate(got):
        np.testing.assert_allclose(answer, expected[i % len(xs)], rtol=1e-5, atol=1e-6)


def test_decoupled_and_sequence_models_are_refused_a_cache_with_tritons_words(stack):
    status, index = stack.post("/v2/repository/index", {})
    assert status == 200, index
    reasons = {entry["name"]: entry.get("reason", "") for entry in index}

    assert "Response Cache does not currently support model decoupled_cached with 'decoupled' transaction " \
           "policy. Please disable the response cache." in reasons["decoupled_cached"]
    assert "Response Cache does not currently support model sequence_cached with sequence batching scheduler. " \
           "Please disable the response cache." in reasons["sequence_cached"]
    assert stack.get("/v2/models/decoupled_cached/ready")[0] != 200


def test_the_store_is_one_segment_of_the_server_and_is_gone_after_its_stop(start_stack, demo_repo, tmp_path):
    repo = tmp_path / "models"
    cached_copy(demo_repo, repo, "mlp")
    stack = start_stack(repo, "--cache-config", "local,size=65536")
    infer(stack, "mlp", sample(1.0))
    assert len([name for name in shm_segments(stack.pid) if name.endswith("-cache")]) == 1

    assert stack.stop() == 0
    assert [name for name in shm_segments(stack.pid) if name.endswith("-cache")] == []

