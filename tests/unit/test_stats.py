"""gateway/observe/stats.py: Triton's statistics with Triton's meanings, from the scheduler's stamps."""
from __future__ import annotations

import time
import types

import pytest

from ringserve.common.messages import Result
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.dispatch import admission, replies, scheduler
from ringserve.gateway.core.errors import (BadRequest, ClientDisconnected, DeadlineExceeded, ModelExecutionFailed,
                                      Unavailable, WorkerCrashed)
from ringserve.gateway.observe.stats import Statistics, failure_reason, record_success

from tests.support.gateway_fakes import count_success, dispatch_settings
from .test_dispatch import Harness, rows

MLP = ModelConfig(name="mlp", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (4,)),),
                  outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=2,
                  model_path="/m/mlp/2/model.onnx")
PER_REQUEST = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def test_each_answered_request_counts_once_in_every_stage_with_the_whole_batchs_compute_times():
    stats = Statistics()
    mlp = stats.of("mlp", 2)
    Statistics.record_execution(mlp, 4, input_ns=100, infer_ns=2000, output_ns=50)
    count_success(mlp, rows=1, latency_ns=4000, queue_ns=400, input_ns=100, infer_ns=2000)
    count_success(mlp, rows=3, latency_ns=5000, queue_ns=600, input_ns=100, infer_ns=2000)

    doc = stats.model_stats(MLP)

    inference = doc["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 9000}
    assert inference["queue"] == {"count": 2, "ns": 1000}
    # Triton adds a batch's compute times to each of its requests (infer_stats.cc UpdateSuccess).
    assert inference["compute_input"] == {"count": 2, "ns": 200}
    assert inference["compute_infer"] == {"count": 2, "ns": 4000}
    # (the rest of each request's time after the worker's answer: 4000 - 400 - 100 - 2000, and 5000 - 2700)
    assert inference["compute_output"] == {"count": 2, "ns": 1500 + 2300}
    assert doc["inference_count"] == 4 and doc["execution_count"] == 1
    assert doc["batch_stats"] == [{"batch_size": 4, "compute_input": {"count": 1, "ns": 100},
                                   "compute_infer": {"count": 1, "ns": 2000},
                                   "compute_output": {"count": 1, "ns": 50}}]
    assert doc["last_inference"] == pytest.approx(time.time() * 1000, abs=5000)


def test_executions_are_counted_apart_from_requests():
    stats = Statistics()
    mlp = stats.of("mlp", 2)
    for rows, infer_ns in ((8, 10), (1, 20), (1, 30)):
        Statistics.record_execution(mlp, rows, input_ns=0, infer_ns=infer_ns, output_ns=0)
    for rows in (3, 2, 3, 1):
        count_success(mlp, rows=rows, latency_ns=100)

    doc = stats.model_stats(MLP)

    assert doc["execution_count"] == 3 and doc["inference_count"] == 9
    assert [(b["batch_size"], b["compute_infer"]) for b in doc["batch_stats"]] == [
        (1, {"count": 2, "ns": 50}), (8, {"count": 1, "ns": 10})]
    counts = {name: doc["inference_stats"][name]["count"] for name in PER_REQUEST}
    assert counts == dict.fromkeys(PER_REQUEST, 4)  # perf_analyzer refuses compute counts that differ


def test_failures_count_with_their_durations_and_triton_reasons():
    stats = Statistics()
    stats.record_failure("mlp", 2, 70, BadRequest("no"))
    stats.record_failure("mlp", 2, 30, DeadlineExceeded(1.0))
    stats.record_failure("mlp", 1, 5, ClientDisconnected())  # another version

    assert stats.model_stats(MLP)["inference_stats"]["fail"] == {"count": 2, "ns": 100}
    assert stats.of("mlp", 2).failures == {"OTHER": 1, "REJECTED": 1}
    assert stats.of("mlp", 1).failures == {"CANCELED": 1}


@pytest.mark.parametrize("error, reason", [
    (DeadlineExceeded(0.5), "REJECTED"), (ClientDisconnected(), "CANCELED"),
    (ModelExecutionFailed("m", "boom"), "BACKEND"), (WorkerCrashed("SIGSEGV"), "BACKEND"),
    (Unavailable("queue full"), "OTHER"), (BadRequest("bad"), "OTHER")])
def test_failure_reasons_are_tritons(error, reason):
    assert failure_reason(error) == reason


def test_a_model_without_traffic_reports_zeros():
    doc = Statistics().model_stats(MLP)
    assert doc["inference_count"] == doc["execution_count"] == doc["last_inference"] == 0
    assert all(d == {"count": 0, "ns": 0} for d in doc["inference_stats"].values())
    assert doc["batch_stats"] == [] and (doc["name"], doc["version"]) == ("mlp", "2")


# -- from the scheduler's stamps -------------------------------------------------------------------
class Clock:
    """time.perf_counter_ns for the scheduler: the next of `stamps` at each call."""

    def __init__(self, *stamps: int) -> None:
        self.stamps = list(stamps)

    def perf_counter_ns(self) -> int:
        return self.stamps.pop(0)


@pytest.fixture
def staged(segment, loop, monkeypatch):
    harness = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1), statistics=Statistics())
    clock = Clock()
    fake_time = types.SimpleNamespace(monotonic=time.monotonic, perf_counter_ns=clock.perf_counter_ns)
    for module in (admission, scheduler, replies):  # the scheduler's three parts stamp the stages
        monkeypatch.setattr(module, "time", fake_time)
    harness.clock = clock
    return harness


def answered(request, at_ns: int) -> None:
    """The front end's part, once it has sent the answer (routes.Endpoints.infer)."""
    assert request.future.done() and request.stages is not None
    record_success(request, at_ns)


def test_each_stage_of_a_batch_is_the_statistic_triton_names_it(staged):
    h = staged
    h.ready(0, 1)
    #                queued a, queued b, formed, written, RESULT, split (batch_stats' output)
    h.clock.stamps = [100, 200, 1000, 1300, 5400, 5600]
    a, b = h.request(rows(2, 0.0)), h.request(rows(2, 10.0))
    a.arrived_ns, b.arrived_ns = 10, 150  # (the front ends' stamp, before reading the body)
    for request in (a, b):
        h.dispatcher.submit(request)
        h.settle()
    (sent,) = h.sent  # 4 rows: full, sent at once

    h.answer(sent)  # (the worker's session.run took 1 ms: Result.compute_s)
    answered(a, 6000)
    answered(b, 6100)

    doc = h.statistics.model_stats(h.dispatcher.catalog.configs["mlp"])
    inference = doc["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": (6000 - 10) + (6100 - 150)}  # arrival to answer sent
    assert inference["queue"] == {"count": 2, "ns": (1000 - 100) + (1000 - 200)}  # queued to formed
    assert inference["compute_input"] == {"count": 2, "ns": 2 * 300}  # formed to written into the slot
    assert inference["compute_infer"] == {"count": 2, "ns": 2 * 1_000_000}  # the worker's execution
    assert inference["compute_output"] == {"count": 2, "ns": (6000 - 5400) + (6100 - 5400)}  # RESULT to answer
    assert doc["execution_count"] == 1 and doc["inference_count"] == 4
    assert doc["batch_stats"] == [{"batch_size": 4, "compute_input": {"count": 1, "ns": 300},
                                   "compute_infer": {"count": 1, "ns": 1_000_000},
                                   "compute_output": {"count": 1, "ns": 200}}]
    assert h.clock.stamps == []


def test_a_fused_execution_is_counted_by_the_result_that_reports_it(staged):
    h = staged
    h.ready(0, 1)
    h.clock.stamps = list(range(0, 100_000, 10))
    for reported_rows in (0, 9):  # another batch's RESULT reports the execution; then this one's
        request = h.submit(rows(4, 0.0))
        sent = h.sent[-1]
        outputs = [["y", "FP32", [4, 4], sent.batch.output_offset]]
        h.segment.set_output_generation(sent.batch.slot_index, sent.batch.generation)
        h.reply(sent, Result(sent.batch.batch_id, 0, outputs, compute_s=0.001, fused=2,
                             execution_rows=reported_rows))
        answered(request, 200_000)

    doc = h.statistics.model_stats(h.dispatcher.catalog.configs["mlp"])
    assert doc["execution_count"] == 1 and [b["batch_size"] for b in doc["batch_stats"]] == [9]
    assert doc["inference_stats"]["success"]["count"] == 2 and doc["inference_count"] == 8


def test_latency_histogram_exposes_what_prometheus_clients_histogram_would():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from ringserve.gateway.observe.metrics import SECONDS_BUCKETS, LatencyHistogram

    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    ours = LatencyHistogram("t_seconds", "doc", SECONDS_BUCKETS, registry=ours_registry)
    reference = Histogram("t_seconds", "doc", ["model", "version"], buckets=SECONDS_BUCKETS, registry=reference_registry)
    values = [0.0, 0.0005, 0.0007, 0.001, 0.003, 0.25, 9.99, 10.0, 11.0, 1e6]  # on, between and past the bounds
    for model, value in [(m, v) for v in values for m in ("mlp", "encoder")][:-1]:
        ours.observe(model, 1, value)
        reference.labels(model, "1").observe(value)
    assert generate_latest(ours_registry) == generate_latest(reference_registry)
