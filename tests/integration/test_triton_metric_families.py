"""Triton's metric families beside the statistics' own (issue 45 item 7), each checked against a known load
on a real stack of 2 gateways, whose every scrape must be the whole server's, each thing counted once:
nv_model_load_duration_secs, nv_inference_first_response_histogram_ms, the nv_inference_*_summary_us
summaries (--metrics-config), nv_cpu_utilization and nv_cpu_memory_*_bytes."""
from __future__ import annotations

import queue
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.python_models import build_streamer, write_python_model
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration

LOAD_SLEEP_S = 3.0
EXECUTE_SLEEP_S = 0.05
QUANTILES = ("0.5", "0.9", "0.99")
SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")

# Loads in LOAD_SLEEP_S (and more); runs each request in EXECUTE_SLEEP_S (and more); y = x.
SLEEPY = f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({LOAD_SLEEP_S})

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep({EXECUTE_SLEEP_S})
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return responses
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("tritonfamilies")
    write_python_model(repo, "sleepy", SLEEPY, {
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]})
    build_streamer(repo)
    with running_stack(repo, "--gateways", "2", "--workers", "1", "--grpc-port", str(free_port()),
                       "--metrics-config", "summary_latencies=true",
                       "--metrics-config", "summary_quantiles=" + ",".join(f"{q}:0.01" for q in QUANTILES),
                       "--metrics-config", "histogram_latencies=true") as s:
        s.grpc_port = int(s.args[s.args.index("--grpc-port") + 1])
        poll_for(lambda: all(g["state"] == "up" for g in s.status()["gateways"]), 60, what="both gateways up")
        yield s


def scrape(stack: Stack) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of one /metrics answer; a sample written twice fails."""
    found: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(stack.get("/metrics")[1]):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, f"{key} written twice"
            found[key] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def sleepy_infer(stack: Stack) -> float:
    """One request to sleepy; its latency as the client saw it, in µs."""
    started = time.perf_counter()
    status, doc = stack.post("/v2/models/sleepy/infer",
                             {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [2.0]}]})
    assert status == 200 and doc["outputs"][0]["data"] == [2.0], doc
    return (time.perf_counter() - started) * 1e6


def test_the_load_duration_is_the_models_load_time_written_once(stack):
    # (the server is ready once sleepy has loaded: its initialize slept LOAD_SLEEP_S)
    for _ in range(4):  # whichever gateway answers
        found = scrape(stack)
        loaded = value(found, "nv_model_load_duration_secs", model="sleepy", version="1")
        assert LOAD_SLEEP_S <= loaded < 2 * LOAD_SLEEP_S  # (the model.py's import and the rest: well under 3 s)
        assert 0 < value(found, "nv_model_load_duration_secs", model="streamer", version="1") < 30


def test_the_summaries_count_every_request_once_with_quantiles_within_the_measured_latencies(stack):
    before = scrape(stack)
    counted = value(before, "nv_inference_request_summary_us_count", model="sleepy", version="1")
    latencies = [sleepy_infer(stack) for _ in range(20)]  # new connections: the kernel deals them to both gateways

    for _ in range(4):  # each answer is whole, whichever gateway gives it
        found = scrape(stack)
        for family in SUMMARIES:
            assert value(found, family + "_count", model="sleepy", version="1") == counted + 20, family
        assert value(found, "nv_inference_request_summary_us_count", model="sleepy", version="1") == \
            value(found, "nv_inference_request_success_total", model="sleepy", version="1")
        for q in QUANTILES:
            infer = value(found, "nv_inference_compute_infer_summary_us", model="sleepy", version="1", quantile=q)
            request = value(found, "nv_inference_request_summary_us", model="sleepy", version="1", quantile=q)
            # The model sleeps EXECUTE_SLEEP_S per request; no request took longer than the client waited.
            assert EXECUTE_SLEEP_S * 1e6 * 0.99 <= infer <= request <= max(latencies), (q, infer, request, latencies)
        added_us = value(found, "nv_inference_request_summary_us_sum", model="sleepy", version="1") - \
            value(before, "nv_inference_request_summary_us_sum", model="sleepy", version="1")
        assert 20 * EXECUTE_SLEEP_S * 1e6 <= added_us <= sum(latencies)
    assert ("nv_inference_request_summary_us", (("model", "sleepy"), ("quantile", "0.95"), ("version", "1"))) \
        not in found  # only the quantiles asked for
    assert not [n for n, _ in found if n.startswith("ringserve_summary_window")]  # (the gateways' sketches: merged)


def stream_requests(stack: Stack, count: int) -> None:
    """`count` requests to the decoupled streamer, one response each, on one gRPC stream."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error))
        for i in range(count):
            tensor = grpcclient.InferInput("N", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], np.int32))
            client.async_stream_infer("streamer", [tensor], request_id=str(i))
        assert [answers.get(timeout=60) for _ in range(count)] == [None] * count
        client.stop_stream()


def test_the_first_response_histogram_counts_each_decoupled_request_once_in_triton_buckets(stack):
    stream_requests(stack, 3)
    stream_requests(stack, 2)  # (another connection: perhaps the other gateway)

    def counted() -> bool:
        return value(scrape(stack), "nv_inference_first_response_histogram_ms_count",
                     model="streamer", version="1") == 5

    poll_for(counted, 10, what="5 first responses")  # (a stream's last answer may come before its RESULT)
    for _ in range(4):
        found = scrape(stack)
        buckets = {dict(ls)["le"]: v for (n, ls), v in found.items()
                   if n == "nv_inference_first_response_histogram_ms_bucket" and dict(ls)["model"] == "streamer"}
        assert sorted(buckets) == sorted(["100", "500", "2000", "5000", "+Inf"])  # Triton's buckets
        assert buckets["+Inf"] == 5
        # The streamer sends its response at once, then sleeps 0.3 s before it takes the next request (one
        # worker, max_batch_size 0): a stream's requests answer first at about 0, 300 and 600 ms after arrival.
        assert buckets["100"] <= 2 and buckets["2000"] == 5
        assert 0.9 * (300 + 600 + 300) <= value(found, "nv_inference_first_response_histogram_ms_sum",
                                                model="streamer", version="1") < 5 * 2000


def test_the_host_gauges_read_as_proc_says_written_once(stack):
    for _ in range(4):
        found = scrape(stack)
        with open("/proc/meminfo") as f:
            meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        utilization = value(found, "nv_cpu_utilization")
        total, used = value(found, "nv_cpu_memory_total_bytes"), value(found, "nv_cpu_memory_used_bytes")
        assert 0.0 <= utilization <= 1.0
        assert total == meminfo["MemTotal"]
        assert 0 < used <= total
        assert used == pytest.approx(meminfo["MemTotal"] - meminfo["MemAvailable"], abs=256 * 2**20)
        time.sleep(0.3)  # (a fresh utilization window next time)


def test_a_busy_host_reads_as_busy(stack):
    burner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    seen = []
    try:
        while burner.poll() is None:  # each gateway's window starts at its previous scrape: soon within the burn
            seen.append(value(scrape(stack), "nv_cpu_utilization"))
            time.sleep(0.3)
    finally:
        burner.kill()
        burner.wait()
    # One of 2 cores busy all along: at least part of it shows (the machine is shared).
    assert max(seen) >= 0.3, seen


def test_a_metrics_config_setting_triton_does_not_have_is_refused_by_name(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "ringserve.cli", "serve", "--model-repository", str(tmp_path),
                           "--metrics-config", "summary_latency=true"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "summary_latency" in done.stderr and "summary_latencies" in done.stderr
