"""gateway/stats.py: Triton's statistics from request records, batch records and the metrics histograms."""
from __future__ import annotations

from ringserve.common.model_config import ModelConfig, TensorConfig
from ringserve.gateway.metrics import Metrics
from ringserve.gateway.stats import Statistics

MLP = ModelConfig(name="mlp", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (4,)),),
                  outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=2,
                  model_path="/m/mlp/2/model.onnx")


def test_requests_count_as_success_or_fail_with_their_durations():
    metrics = Metrics()
    stats = Statistics(metrics.registry)
    stats.record_batch("mlp", 4, 0.0001, answered=2, answered_rows=4, latency_s=1.5e-6)
    stats.record_failure("mlp", duration_ns=70)

    doc = stats.model_stats(MLP)

    assert doc["name"] == "mlp" and doc["version"] == "2"
    assert doc["inference_stats"]["success"] == {"count": 2, "ns": 1500}
    assert doc["inference_stats"]["fail"] == {"count": 1, "ns": 70}
    assert doc["inference_count"] == 4 and doc["last_inference"] > 0


def test_queue_and_compute_come_from_the_histograms_exactly():
    metrics = Metrics()
    stats = Statistics(metrics.registry)
    metrics.queue_seconds.observe("mlp", 2, 0.25)
    metrics.queue_seconds.observe("mlp", 2, 0.5)
    metrics.compute_seconds.labels("mlp", "2").observe(0.125)
    metrics.batch_size.labels("mlp", "2").observe(2)

    doc = stats.model_stats(MLP)

    assert doc["inference_stats"]["queue"] == {"count": 2, "ns": 750_000_000}
    assert doc["inference_stats"]["compute_infer"] == {"count": 1, "ns": 125_000_000}
    assert doc["execution_count"] == 1 and doc["batch_stats"] == []


def test_recorded_batches_give_per_batch_size_stats():
    stats = Statistics(Metrics().registry)
    stats.record_batch("mlp", 4, 0.002)
    stats.record_batch("mlp", 1, 0.001)
    stats.record_batch("mlp", 4, 0.004)

    doc = stats.model_stats(MLP)

    assert doc["execution_count"] == 3
    assert doc["inference_stats"]["success"] == {"count": 0, "ns": 0}  # no request was answered by them
    assert [(b["batch_size"], b["compute_infer"]) for b in doc["batch_stats"]] == [
        (1, {"count": 1, "ns": 1_000_000}), (4, {"count": 2, "ns": 6_000_000})]


def test_a_model_without_traffic_reports_zeros():
    doc = Statistics(Metrics().registry).model_stats(MLP)
    assert doc["inference_count"] == doc["execution_count"] == doc["last_inference"] == 0
    assert all(d == {"count": 0, "ns": 0} for d in doc["inference_stats"].values())


def test_latency_histogram_exposes_what_prometheus_clients_histogram_would():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from ringserve.gateway.metrics import SECONDS_BUCKETS, LatencyHistogram

    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    ours = LatencyHistogram("t_seconds", "doc", SECONDS_BUCKETS, registry=ours_registry)
    reference = Histogram("t_seconds", "doc", ["model", "version"], buckets=SECONDS_BUCKETS, registry=reference_registry)
    values = [0.0, 0.0005, 0.0007, 0.001, 0.003, 0.25, 9.99, 10.0, 11.0, 1e6]  # on, between and past the bounds
    for model, value in [(m, v) for v in values for m in ("mlp", "encoder")][:-1]:
        ours.observe(model, 1, value)
        reference.labels(model, "1").observe(value)
    assert generate_latest(ours_registry) == generate_latest(reference_registry)
