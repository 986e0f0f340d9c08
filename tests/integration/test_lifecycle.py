"""Model lifecycle on the real stack: lazy loads, LRU under a memory budget, TTL, versions,
refcounts during a long batch, a corrupt model, and load/unload cycles that must not leak."""
from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from bench import lifecycle as lifecycle_bench
from ringserve.common.repository.demo import build_slow_model

from tests.support.lifecycle_models import build_corrupt, build_versioned, infer_body, measured_footprint
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.integration

WEIGHT_BYTES = 2 << 20


def states(stack: Stack) -> dict[str, str]:
    """model key ('m' or 'm/2') -> the state the workers report, as /admin/status shows it."""
    return {key: m["model_state"] for key, m in stack.status()["models"].items()}


def answer(stack: Stack, path: str, value: float = 1.0) -> float:
    status, doc = stack.post(path, infer_body(value=value))
    assert status == 200, doc
    return doc["outputs"][0]["data"][0]


# -- LRU eviction under a budget for three of six models ----------------------------------------
@pytest.fixture(scope="module")
def budget_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("budget")
    for i in range(6):
        build_versioned(repo, f"m{i}", weight_bytes=WEIGHT_BYTES, model_load_policy="lazy")
    budget = int(measured_footprint(repo, "m0") * 3.5)
    # (one worker with every model: a budget is a worker's, and lanes would give each model its own)
    with running_stack(repo, "--model-memory-budget", str(budget), "--lanes", "shared") as stack:
        yield stack, budget


def test_six_models_with_a_budget_for_three_are_evicted_least_recently_used_first(budget_stack):
    stack, budget = budget_stack
    assert set(states(stack).values()) == {"unloaded"}  # lazy: nothing loaded before the first request
    loaded = lambda: {k for k, state in states(stack).items() if state == "ready"}  # noqa: E731

    evicted = []
    for model, expect_ready in [("m0", {"m0"}), ("m1", {"m0", "m1"}), ("m2", {"m0", "m1", "m2"}),
                                ("m0", {"m0", "m1", "m2"}), ("m3", {"m0", "m2", "m3"}),
                                ("m4", {"m0", "m3", "m4"}), ("m0", {"m0", "m3", "m4"}),
                                ("m5", {"m0", "m4", "m5"})]:
        before = loaded()
        assert answer(stack, f"/v2/models/{model}/infer") == 5.0  # sum of four ones, plus version 1
        poll_for(lambda: loaded() == expect_ready, 10, what=f"{sorted(expect_ready)} loaded after {model}")
        evicted += sorted(before - expect_ready)

    assert evicted == ["m1", "m2", "m3"]
    for model in ("m1", "m2", "m3"):
        assert stack.metric("ringserve_model_unloads_total", model=model, reason="lru") == 1
    assert stack.metric("ringserve_model_loads_total", model="m0") == 1  # never evicted: always recently used
    assert stack.metric("ringserve_model_memory_budget_bytes") == budget
    assert 0 < stack.metric("ringserve_model_memory_bytes") <= budget


# -- eviction_priority orders eviction against LRU; a load the budget refuses is counted ------------
@pytest.fixture(scope="module")
def priority_stack(tmp_path_factory: pytest.TempPathFactory):
    """Room for two of three same-sized lazy models, which differ only in eviction_priority
    (lower = evicted later), and a lazy model larger than the whole budget."""
    repo = tmp_path_factory.mktemp("priority")
    for name, priority in (("pinned", -1), ("plain", 0), ("spare", 5)):
        build_versioned(repo, name, weight_bytes=WEIGHT_BYTES, model_load_policy="lazy", eviction_priority=priority)
    budget = int(measured_footprint(repo, "plain") * 2.5)
    build_versioned(repo, "huge", weight_bytes=2 * budget, model_load_policy="lazy")  # its files alone overflow it
    with running_stack(repo, "--model-memory-budget", str(budget), "--workers", "1", "--lanes", "shared") as stack:
        yield stack


def test_eviction_priority_picks_the_victim_where_lru_would_pick_another_and_a_refusal_is_counted(priority_stack):
    stack = priority_stack
    loaded = lambda: {k for k, state in states(stack).items() if state == "ready"}  # noqa: E731
    # Each step past the second must evict one idle model: least recently used would be "pinned"
    # both times (used first, and never since); priority takes the highest number instead.
    for model, expect_ready in [("pinned", {"pinned"}), ("spare", {"pinned", "spare"}),
                                ("plain", {"pinned", "plain"}),   # spare (5) goes, not pinned (LRU)
                                ("spare", {"pinned", "spare"})]:  # plain (0) goes, not pinned (LRU)
        assert answer(stack, f"/v2/models/{model}/infer") == 5.0
        poll_for(lambda: loaded() == expect_ready, 10, what=f"{sorted(expect_ready)} loaded after {model}")
    assert stack.metric("ringserve_model_unloads_total", model="pinned") == 0
    assert stack.metric("ringserve_model_unloads_total", model="spare", reason="lru") == 1
    assert stack.metric("ringserve_model_unloads_total", model="plain", reason="lru") == 1

    # A load that cannot fit even with every idle model evicted is refused, and evicts nothing.
    status, doc = stack.post("/v2/models/huge/infer", infer_body())
    assert status == 503 and doc["error"].startswith("model memory budget exhausted: model 'huge' version 1 needs "), doc
    assert loaded() == {"pinned", "spare"} and states(stack)["huge"] == "unloaded"
    scrape = stack.get("/metrics")[1]
    assert 'ringserve_model_budget_exhausted_total{model="huge",version="1"} 1.0' in scrape
    for model in ("pinned", "spare", "plain"):  # one batch at a time held each
        assert f'ringserve_model_peak_references{{model="{model}",version="1"}} 1.0' in scrape
    assert "ringserve_model_peak_references{model=\"huge\"" not in scrape  # never loaded, never held


# -- lazy loads, TTL, versions, a corrupt model, warmup, the repository API ------------------------
@pytest.fixture(scope="module")
def lifecycle_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("lifecycle")
    build_versioned(repo, "burst", model_load_policy="lazy")
    build_versioned(repo, "idle", model_load_policy="lazy", ttl_s=1)
    build_versioned(repo, "multi", (1, 2, 3), version_policy={"latest": {"num_versions": 2}},
                    model_load_policy="lazy")
    build_versioned(repo, "warm", warmup=True)
    build_corrupt(repo, "broken")
    with running_stack(repo) as stack:
        yield stack


def test_an_eager_model_with_warmup_is_loaded_before_the_server_is_ready(lifecycle_stack):
    stack = lifecycle_stack
    assert states(stack)["warm"] == "ready"
    assert stack.metric("ringserve_model_loads_total", model="warm", policy="eager") == 1
    assert stack.metric("ringserve_model_load_seconds_count", model="warm") == 1


def test_twenty_concurrent_first_requests_to_a_lazy_model_load_it_once(lifecycle_stack):
    stack = lifecycle_stack
    assert states(stack)["burst"] == "unloaded"

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60, limits=httpx.Limits(max_connections=20)) as http:
            return await asyncio.gather(*(http.post("/v2/models/burst/infer", json=infer_body(value=float(i)))
                                          for i in range(20)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 20
    assert [r.json()["outputs"][0]["data"][0] for r in responses] == [4.0 * i + 1 for i in range(20)]
    assert stack.metric("ringserve_model_loads_total", model="burst", policy="lazy") == 1
    # The requests waited for the load in their queue: the wait shows in queue time.
    assert stack.metric("ringserve_queue_seconds_count", model="burst") == 20


def test_ttl_unloads_an_idle_model_and_its_next_request_loads_it_again(lifecycle_stack):
    stack = lifecycle_stack
    assert answer(stack, "/v2/models/idle/infer") == 5.0
    poll_for(lambda: states(stack)["idle"] == "unloaded", 15, what="the TTL to unload 'idle'")
    assert stack.metric("ringserve_model_unloads_total", model="idle", reason="ttl") == 1
    assert stack.get("/v2/models/idle/ready")[0] == 200  # unloaded, but servable: it loads on demand
    assert answer(stack, "/v2/models/idle/infer") == 5.0
    assert stack.metric("ringserve_model_loads_total", model="idle") == 2


def test_a_versioned_request_reaches_exactly_that_version(lifecycle_stack):
    stack = lifecycle_stack
    assert answer(stack, "/v2/models/multi/versions/2/infer") == 6.0
    assert answer(stack, "/v2/models/multi/versions/3/infer") == 7.0
    assert answer(stack, "/v2/models/multi/infer") == 7.0  # no version: the highest the policy serves
    status, doc = stack.post("/v2/models/multi/versions/1/infer", infer_body())
    assert status == 404 and "it serves version 2, 3" in doc["error"]
    assert stack.get("/v2/models/multi")[1]["versions"] == ["2", "3"]
    assert stack.get("/v2/models/multi/versions/2/ready")[0] == 200
    index = [e for e in stack.post("/v2/repository/index", {})[1] if e["name"] == "multi"]
    assert [(e["version"], e["model_state"]) for e in index] == [("2", "ready"), ("3", "ready")]
    assert stack.metric("ringserve_model_loads_total", model="multi", version="2") == 1


def test_a_corrupt_model_is_failed_with_the_runtimes_message_and_the_others_serve(lifecycle_stack):
    stack = lifecycle_stack
    (entry,) = [e for e in stack.post("/v2/repository/index", {})[1] if e["name"] == "broken"]
    assert (entry["state"], entry["model_state"]) == ("UNAVAILABLE", "failed")
    assert "INVALID_PROTOBUF" in entry["reason"] and "Protobuf parsing failed" in entry["reason"]
    for _ in range(2):  # every 503 carries the load error
        status, doc = stack.post("/v2/models/broken/infer", infer_body())
        assert status == 503 and "failed to load" in doc["error"] and "INVALID_PROTOBUF" in doc["error"]
    status, doc = stack.get("/v2/models/broken/ready")
    assert status == 503 and "INVALID_PROTOBUF" in doc["error"]
    assert answer(stack, "/v2/models/warm/infer") == 5.0


def test_a_repository_unload_frees_the_workers_memory_and_a_load_serves_again(lifecycle_stack):
    stack = lifecycle_stack
    assert stack.post("/v2/repository/models/warm/unload", {})[0] == 200
    poll_for(lambda: states(stack)["warm"] == "unloaded", 10, what="the worker to unload 'warm'")
    assert stack.metric("ringserve_model_unloads_total", model="warm", reason="api") == 1
    assert stack.metric("ringserve_model_memory_bytes", model="warm") == 0
    assert stack.post("/v2/models/warm/infer", infer_body())[0] == 503

    assert stack.post("/v2/repository/models/warm/load", {})[0] == 200
    poll_for(lambda: states(stack)["warm"] == "ready", 10, what="the worker to load 'warm' again")
    assert answer(stack, "/v2/models/warm/infer") == 5.0
    assert stack.metric("ringserve_model_loads_total", model="warm") == 2


# -- a long batch holds its model: the budget refuses a load rather than evict it ------------------
# ~200 ms per long batch on this project's 2-vCPU machines: 64 rows took 40 ms, and the poll below
# could miss the whole batch and time out waiting to see it in flight. More rows, not more layers:
# the footprint (and so the budget) stays what it was, and rows cost memory only while running.
SLOW_WIDTH, SLOW_ROWS, SLOW_LAYERS = 512, 320, 120


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("slow")
    for name in ("slow", "other"):
        build_slow_model(repo / name, width=SLOW_WIDTH, layers=SLOW_LAYERS)
        config_path = repo / name / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "max_batch_size": SLOW_ROWS}))
    budget = int(measured_footprint(repo, "slow") * 1.5)  # one of them fits, two do not
    # One ORT thread: the long batch takes about as long on any machine.
    with running_stack(repo, "--model-memory-budget", str(budget), "--workers", "1", "--intra-op-threads", "1",
                       "--lanes", "shared") as stack:
        yield stack, repo, budget


def test_a_model_in_use_during_a_long_batch_is_never_evicted_and_the_load_gets_503_with_numbers(slow_stack):
    stack, repo, budget = slow_stack
    # Both are eager, but only one fits: eager loads never evict, so the other waits for a request.
    assert states(stack) == {"other": "ready", "slow": "unloaded"}
    busy, idle = "other", "slow"
    x = np.random.default_rng(3).standard_normal((SLOW_ROWS, SLOW_WIDTH)).astype(np.float32)
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    one_row = {"inputs": [{"name": "x", "shape": [1, SLOW_WIDTH], "datatype": "FP32", "data": x[0].tolist()}]}
    long_batch: list = []
    running = threading.Thread(target=lambda: long_batch.append(stack.post(f"/v2/models/{busy}/infer", body)))
    running.start()
    poll_for(lambda: stack.status()["workers"][0]["in_flight_batches"] == 1, 10, what="the long batch to run")
    worker = stack.status()["workers"][0]  # what ops see while it runs: one batch of one request
    assert (worker["in_flight_batches"], worker["in_flight_requests"]) == (1, 1), worker

    status, doc = stack.post(f"/v2/models/{idle}/infer", one_row)
    still_running = running.is_alive()
    running.join(120)

    assert still_running, "the long batch must still run when the other model's load is refused"
    assert status == 503, doc
    assert doc["error"].startswith(f"model memory budget exhausted: model '{idle}' version 1 needs ")
    assert f"the budget is {budget} bytes" in doc["error"] and f"({busy} version 1)" in doc["error"]
    (status, result), = long_batch
    assert status == 200  # never evicted while it ran
    session = ort.InferenceSession(str(repo / busy / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.asarray(result["outputs"][0]["data"], np.float32).reshape(x.shape),
                               session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert stack.metric("ringserve_model_unloads_total", model=busy) == 0
    # Idle again, it is the one to go.
    status, doc = stack.post(f"/v2/models/{idle}/infer", one_row)
    assert status == 200, doc
    assert stack.metric("ringserve_model_unloads_total", model=busy, reason="lru") == 1


# -- load/unload cycles keep the worker's RSS flat (bench/lifecycle.py with fewer cycles) ----------
def test_load_unload_cycles_leave_worker_rss_within_10_percent():
    result = lifecycle_bench.run(cycles=25, weight_mb=8.0)
    assert result["ok"], result
    assert result["model_footprint_bytes"] > 8 << 20  # the 8 MiB of weights were measured, not guessed
