"""Triton's metric families beside the statistics' own: --metrics-config as tritonserver takes it, the
summaries' sketches and their merge across gateways, the host gauges' reading of /proc."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ringserve import tritonserver
from ringserve.common.errors import ConfigError, SettingError
from ringserve.common.metrics_config import (DEFAULT_QUANTILES, MetricsConfig, first_response_buckets,
                                             parse_metrics_config)
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.pbtxt import read_pbtxt
from ringserve.gateway.cluster.merge import gateway_scope, merge_metrics, parse_metrics
from ringserve.gateway.cluster.triton_metrics import TritonMetrics, exposition
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.observe import latencies
from ringserve.gateway.observe.latencies import LatencyMetrics, Sketch
from ringserve.gateway.observe.stats import Statistics
from ringserve.gateway.observe.triton_gauges import HostCollector

MLP = ModelConfig(name="mlp", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (4,)),),
                  outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=1,
                  model_path="/m/mlp/1/model.onnx")
SUMMARIES_ON = MetricsConfig(summary_latencies=True, histogram_latencies=True,
                             summary_quantiles=((0.1, 0.0), (0.5, 0.05), (0.99, 0.001)))


def test_metrics_config_reads_tritons_settings_and_its_qa_quantiles_as_std_stod_does():
    config = parse_metrics_config(["summary_latencies=true", "histogram_latencies=true", "counter_latencies=false",
                                   "summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01"])  # (L0_metrics/test.sh's)

    assert (config.summary_latencies, config.histogram_latencies, config.counter_latencies) == (True, True, False)
    assert config.summary_quantiles == ((0.1, 0.0), (0.7, 0.01), (0.75, 0.01))
    assert parse_metrics_config([]) == MetricsConfig() and MetricsConfig().summary_quantiles == DEFAULT_QUANTILES
    assert parse_metrics_config(["summary_quantiles=nonsense"]).summary_quantiles == DEFAULT_QUANTILES


@pytest.mark.parametrize(("arg", "words"), [
    ("summary_latencies", "--metrics-config option format is <setting>=<value>. Got summary_latencies"),
    ("global,summary_latencies=true", "format is <setting>=<value>"),
    ("summary_latencies=", "format is <setting>=<value>"),
    ("summary_latency=true", "unknown setting 'summary_latency': one of counter_latencies"),
    ("summary_latencies=yes", "summary_latencies: true or false"),
    ("summary_age_buckets=0", "summary_age_buckets: must be > 0"),
])
def test_a_metrics_config_that_cannot_work_is_refused_saying_why(arg, words):
    with pytest.raises(SettingError, match=words.replace(".", r"\.")):
        parse_metrics_config([arg])


def test_ringserve_tritonserver_passes_metrics_config_through(tmp_path: Path):
    args = tritonserver.build_parser().parse_args([f"--model-repository={tmp_path}",
                                                   "--metrics-config", "summary_latencies=true",
                                                   "--metrics-config=summary_quantiles=0.5:0.05"])
    settings = tritonserver.settings_from_triton_args(args)

    assert settings.metrics_config == ("summary_latencies=true", "summary_quantiles=0.5:0.05")
    assert tritonserver.unserved_flags(["--metrics-config=summary_latencies=true"]) == []


def test_a_sketchs_quantiles_are_within_one_percent_of_the_exact_ones_and_merge_as_one():
    rng = random.Random(7)
    values = [int(rng.lognormvariate(8, 1.5)) for _ in range(5000)]
    halves = Sketch(), Sketch()
    whole = Sketch()
    for i, v in enumerate(values):
        halves[i % 2].add(v)
        whole.add(v)
    halves[0].merge(halves[1])
    ordered = sorted(values)
    for q in (0.1, 0.5, 0.9, 0.99, 0.999):
        exact = ordered[max(1, math.ceil(q * len(values))) - 1]
        assert halves[0].quantile(q) == whole.quantile(q)
        assert whole.quantile(q) == pytest.approx(exact, rel=0.011, abs=1)
    assert whole.quantile(0.0) >= min(values) and whole.quantile(1.0) <= max(values)
    assert math.isnan(Sketch().quantile(0.5))


def gateway_registry(config: MetricsConfig, microseconds: list[int]) -> tuple[CollectorRegistry, Statistics]:
    """A gateway's registry with its statistics' families, after a success of each duration."""
    statistics = Statistics(config)
    registry = CollectorRegistry()
    registry.register(TritonMetrics(statistics, Catalog({"mlp": MLP}, 1 << 20)))
    if statistics.latency is not None:
        statistics.latency.served = lambda: [("mlp", 1)]
        registry.register(statistics.latency)
    series = statistics.of("mlp", 1).latency
    for us in microseconds:
        series.observe_success((us * 1000, 1000, 2000, us * 500, 3000))
        series.observe_first_response(us * 1000)
    return registry, statistics


def test_two_gateways_summaries_merge_into_the_quantiles_of_every_request_once():
    own, statistics = gateway_registry(SUMMARIES_ON, list(range(1000, 2000)))
    peer, _ = gateway_registry(SUMMARIES_ON, list(range(2000, 3000)))
    peer_text = exposition(gateway_scope(peer.collect())).decode()  # what a peer answers to ?scope=gateway

    merged = latencies.finish(merge_metrics(own.collect(), [parse_metrics(peer_text)], {0: True, 1: True}),
                              statistics.latency)
    text = exposition(merged).decode()

    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}
    labels = (("model", "mlp"), ("version", "1"))
    assert found[("nv_inference_request_summary_us_count", labels)] == 2000
    assert found[("nv_inference_request_summary_us_sum", labels)] == sum(range(1000, 3000))
    for q, exact in (("0.1", 1199), ("0.5", 1999), ("0.99", 2979)):
        assert found[("nv_inference_request_summary_us", (*labels[:1], ("quantile", q), labels[1]))] == \
            pytest.approx(exact, rel=0.011)
    assert 'nv_inference_queue_summary_us{model="mlp",quantile="0.1",version="1"} 1\n' in text
    assert found[("nv_inference_first_response_histogram_ms_count", labels)] == 2000
    assert found[("nv_inference_first_response_histogram_ms_bucket", (("le", "5000"), *labels))] == 2000
    assert "ringserve_summary_window" not in text  # (the sketches are consumed by the merge)


def test_without_metrics_config_no_summary_or_histogram_is_made_and_counter_latencies_false_drops_the_counters():
    default, statistics = gateway_registry(MetricsConfig(), [])
    names = {f.name for f in default.collect()}
    assert statistics.latency is None and statistics.of("mlp", 1).latency is None
    assert "nv_inference_queue_duration_us" in names
    assert not names & latencies.LATENCY_FAMILIES

    no_counters, _ = gateway_registry(MetricsConfig(counter_latencies=False), [])
    names = {f.name for f in no_counters.collect()}
    assert "nv_inference_request_success" in names and "nv_inference_count" in names
    assert not [n for n in names if n.endswith("_duration_us")]


def test_the_summaries_window_forgets_what_is_older_than_max_age(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(latencies.time, "time", lambda: now[0])
    metrics = LatencyMetrics(MetricsConfig(summary_latencies=True, summary_max_age_s=10, summary_age_buckets=5))
    series = metrics.of("mlp", 1)
    series.observe_success((5_000_000, 0, 0, 0, 0))
    now[0] += 5
    series.observe_success((1_000_000, 0, 0, 0, 0))
    assert series.window("request").quantile(1.0) == 5000
    now[0] += 6  # the first is 11 s old, the second 6
    assert series.window("request").quantile(1.0) == 1000 and series.counts["request"] == 2


def test_the_host_gauges_read_proc_as_triton_does(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    (tmp_path / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:  100 kB\nMemAvailable:    250 kB\n")
    host = HostCollector(proc=str(tmp_path))

    def read() -> dict[str, float]:
        return {f.name: f.samples[0].value for f in host.collect()}

    first = read()
    assert first == {"nv_cpu_utilization": 0.2, "nv_cpu_memory_total_bytes": 1024000.0,
                     "nv_cpu_memory_used_bytes": 768000.0}  # (busy 200 of 1000 ticks since boot)
    (tmp_path / "stat").write_text("cpu  190 0 100 710 100 0 0 0 0 0\n")
    host.last = (host.last[0] - 1, *host.last[1:])  # (a window past MIN_WINDOW_S)
    assert read()["nv_cpu_utilization"] == 0.9  # 90 busy of 100 since the last scrape
    (tmp_path / "stat").write_text("garbage\n")
    host.last = (host.last[0] - 1, *host.last[1:])
    assert read()["nv_cpu_utilization"] == 0.0  # (as Triton's poll: a failed read writes 0)


QA_MODEL_METRICS = """
model_metrics {
  metric_control: [
    {
      metric_identifier: { %s }
      %s
    }
  ]
}
"""
FAMILY = 'family: "nv_inference_first_response_histogram_ms"'


@pytest.mark.parametrize(("identifier", "options", "expected"), [
    # Triton's qa/L0_model_config/model_metrics/invalid_config/*: partial.pbtxt's model_metrics, and `expected`
    (FAMILY, "histogram_options: { buckets: [] }", "histogram options must specify non-empty 'buckets'"),
    ('family: ""', "histogram_options: { buckets: [ 1, 2, 4, 8 ] }", "metric identifier must specify non-empty 'family'"),
    (FAMILY, "histogram_options: {}", "histogram options must specify non-empty 'buckets'"),
    (FAMILY, "", "metric control must specify 'histogram_options'"),
    ("", "histogram_options: { buckets: [ 1, 2, 4, 8 ] }", "metric identifier must specify non-empty 'family'"),
    (FAMILY, "histogram_options: { buckets: [ 1, 2, 4, 8 ] }", None),  # valid_config/valid_model_metrics
])
def test_model_metrics_bucket_overrides_are_read_and_refused_in_tritons_words(tmp_path, identifier, options, expected):
    (tmp_path / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n' + QA_MODEL_METRICS % (identifier, options))
    doc = read_pbtxt(tmp_path / "config.pbtxt", "m")

    if expected is None:
        assert first_response_buckets(doc["model_metrics"]) == (1.0, 2.0, 4.0, 8.0)
    else:
        with pytest.raises(ConfigError, match=expected):
            first_response_buckets(doc["model_metrics"])


def test_a_models_first_response_buckets_replace_tritons():
    metrics = LatencyMetrics(MetricsConfig(histogram_latencies=True))
    metrics.buckets_of = lambda name, version: (1.0, 2.0) if name == "custom" else None
    metrics.of("custom", 1).observe_first_response(2_500_000)  # (2 ms: whole ms, as Triton)
    metrics.of("mlp", 1).observe_first_response(2_500_000)  # (2 ms: whole ms, as Triton)
    metrics.served = lambda: [("custom", 1), ("mlp", 1)]

    buckets = {(s.labels["model"], s.labels["le"]): s.value for f in metrics.collect() for s in f.samples
               if s.name.endswith("_bucket")}
    assert buckets == {("custom", "1"): 0, ("custom", "2"): 1, ("custom", "+Inf"): 1,
                       ("mlp", "100"): 1, ("mlp", "500"): 1, ("mlp", "2000"): 1, ("mlp", "5000"): 1, ("mlp", "+Inf"): 1}
