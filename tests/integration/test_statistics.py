"""Triton's statistics extension and its `nv_inference_*` metrics, against a real stack of two
gateways: counts with Triton's meanings (per request, per execution, per batch size), times that
fit inside each other and inside what the clients measured, one entry per served version, and
/metrics saying the same numbers as the statistics."""
from __future__ import annotations

import concurrent.futures
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from prometheus_client.parser import text_string_to_metric_families

from tests.support.lifecycle_models import build_versioned, infer_body
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration

PARTS = ("queue", "compute_input", "compute_infer", "compute_output")  # what perf_analyzer adds up
PER_REQUEST = ("success", *PARTS)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("statistics")
    shutil.copytree(demo_repo / "mlp", repo / "mlp")
    build_versioned(repo, "multi", (1, 2, 3), version_policy={"all": {}}, weight_bytes=64)
    return repo


@pytest.fixture(scope="module")
def stack(repo: Path):
    # (held, not 503, while the other gateway has yet to hear from the worker)
    with running_stack(repo, "--gateways", "2", "--grpc-port", str(free_port()), "--hold-when-unavailable-s", "30") as s:
        s.grpc_port = int(s.args[s.args.index("--grpc-port") + 1])
        poll_for(lambda: all(g["state"] == "up" for g in s.status()["gateways"]), 60, what="both gateways up")
        yield s


def stats_of(stack: Stack, path: str = "/v2/models/mlp/versions/1/stats") -> dict:
    status, doc = stack.get(path)
    assert status == 200, doc
    (stats,) = doc["model_stats"]
    return stats


def delta(after: dict, before: dict) -> dict:
    """after - before of every count and ns (the other tests of the module share the stack)."""
    out = {"inference_count": after["inference_count"] - before["inference_count"],
           "execution_count": after["execution_count"] - before["execution_count"]}
    for name in (*PER_REQUEST, "fail"):
        a, b = after["inference_stats"][name], before["inference_stats"][name]
        out[name] = {"count": int(a["count"]) - int(b["count"]), "ns": int(a["ns"]) - int(b["ns"])}
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    out["batches"] = {b["batch_size"]: b["compute_infer"]["count"] - sizes.get(b["batch_size"], 0)
                      for b in after["batch_stats"]}
    return out


def timed_post(stack: Stack, body: dict) -> float:
    started = time.perf_counter_ns()
    status, answer = stack.post("/v2/models/mlp/infer", body)
    assert status == 200, answer
    return time.perf_counter_ns() - started


def test_each_request_counts_once_in_every_stage_and_its_stages_fit_inside_its_time(stack):
    before = stats_of(stack)
    rows = [1 + i % 3 for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # concurrent: batches of several requests form
        client_ns = list(pool.map(lambda n: timed_post(stack, infer_body_mlp(n)), rows))

    d = delta(stats_of(stack), before)

    assert {name: d[name]["count"] for name in PER_REQUEST} == dict.fromkeys(PER_REQUEST, 24)
    assert d["fail"]["count"] == 0
    assert d["inference_count"] == sum(rows)
    # Executions, not requests: every execution is in batch_stats once, with all the rows it ran.
    assert 1 <= d["execution_count"] <= 24 and sum(d["batches"].values()) == d["execution_count"]
    assert sum(size * count for size, count in d["batches"].items()) == sum(rows)
    assert all(d[name]["ns"] > 0 for name in PER_REQUEST)
    # Each stage is a part of the request's time at the server, which is a part of the client's.
    assert sum(d[name]["ns"] for name in PARTS) <= d["success"]["ns"] <= sum(client_ns)


def test_grpc_and_its_stream_are_counted_as_http(stack):
    before = stats_of(stack)
    client = triton.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    x = triton.InferInput("x", [2, 512], "FP32")
    x.set_data_from_numpy(np.ones((2, 512), np.float32))
    answers: list = []
    try:
        for _ in range(3):
            client.infer("mlp", [x])
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        for _ in range(2):
            client.async_stream_infer("mlp", [x])
        poll_for(lambda: len(answers) == 2, 30, what="the stream's two answers")
        client.stop_stream()
        grpc_stats = client.get_inference_statistics("mlp", "1", as_json=True)["model_stats"][0]
    finally:
        client.close()

    assert not [a for a in answers if isinstance(a, Exception)]
    d = delta(stats_of(stack), before)
    assert {name: d[name]["count"] for name in PER_REQUEST} == dict.fromkeys(PER_REQUEST, 5)
    assert d["inference_count"] == 10
    for name in PER_REQUEST:  # gRPC's ModelStatistics is the same document
        assert int(grpc_stats["inference_stats"][name]["count"]) == stats_of(stack)["inference_stats"][name]["count"]


def test_every_served_version_has_its_entry_when_no_version_is_named(stack):
    assert stack.post("/v2/models/multi/versions/2/infer", infer_body())[0] == 200

    versions = [(m["name"], m["version"]) for m in stack.get("/v2/models/multi/stats")[1]["model_stats"]]
    every = [(m["name"], m["version"]) for m in stack.get("/v2/models/stats")[1]["model_stats"]]
    by_version = {m["version"]: m["inference_count"] for m in stack.get("/v2/models/multi/stats")[1]["model_stats"]}
    client = triton.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    try:
        grpc_versions = [(m["name"], m["version"])
                         for m in client.get_inference_statistics("multi", as_json=True)["model_stats"]]
    finally:
        client.close()

    assert versions == grpc_versions == [("multi", "1"), ("multi", "2"), ("multi", "3")]
    assert every == [("mlp", "1"), ("multi", "1"), ("multi", "2"), ("multi", "3")]
    assert by_version == {"1": 0, "2": 1, "3": 0}
    assert [m["version"] for m in stack.get("/v2/models/multi/versions/3/stats")[1]["model_stats"]] == ["3"]


def nv_samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name.removesuffix("_total"), tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("nv_inference_")}


def test_triton_metrics_say_what_the_statistics_say(stack):
    for n in (1, 3):
        assert stack.post("/v2/models/mlp/infer", infer_body_mlp(n))[0] == 200
    assert stack.post("/v2/models/mlp/infer", {"inputs": []})[0] == 400  # a failure, reason OTHER

    text = stack.get("/metrics")[1]
    stats = stats_of(stack)  # (nothing is sent in between: the same numbers)

    found = nv_samples(text)
    labels = (("model", "mlp"), ("version", "1"))
    inference = stats["inference_stats"]
    assert found[("nv_inference_request_success", labels)] == inference["success"]["count"]
    assert found[("nv_inference_count", labels)] == stats["inference_count"]
    assert found[("nv_inference_exec_count", labels)] == stats["execution_count"]
    for metric, name in [("request_duration_us", "success"), ("queue_duration_us", "queue"),
                         ("compute_input_duration_us", "compute_input"),
                         ("compute_infer_duration_us", "compute_infer"),
                         ("compute_output_duration_us", "compute_output")]:
        # Each gateway's share is its ns // 1000: the sum is at most 1 µs a gateway under the whole's.
        assert 0 <= inference[name]["ns"] // 1000 - found[("nv_inference_" + metric, labels)] <= 2, metric
    failures = {reason: found[("nv_inference_request_failure", (*labels[:1], ("reason", reason), labels[1]))]
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": inference["fail"]["count"]}
    assert inference["fail"]["count"] >= 1
    assert found[("nv_inference_pending_request_count", labels)] == 0
    for version in ("1", "2", "3"):  # every served version, from its first scrape
        assert ("nv_inference_request_success", (("model", "multi"), ("version", version))) in found
    # Triton's names, as its dashboards query them: no `_total` on the counters' series.
    assert '\nnv_inference_request_success{model="mlp",version="1"} ' in text
    assert "# TYPE nv_inference_request_success counter\n" in text and "nv_inference_count_total" not in text


def infer_body_mlp(rows: int) -> dict:
    return {"inputs": [{"name": "x", "shape": [rows, 512], "datatype": "FP32", "data": [0.5] * (512 * rows)}]}
