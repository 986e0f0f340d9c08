"""Triton's per-model metrics (`nv_inference_*`), beside ringserve's own in /metrics.

Triton users' dashboards and alerts read these names (Triton server's docs/user_guide/metrics.md,
its core's src/metric_model_reporter.cc). They are the statistics extension's numbers
(gateway/observe/stats.py) read at scrape time, labelled `model` and `version`, one series per served
model version from its first scrape on, zeros included (Triton makes them when it loads a model):

    nv_inference_request_success         successful requests            = success.count
    nv_inference_request_failure{reason} failed requests, by reason     (REJECTED: timed out in the
                                                                        queue, CANCELED: client gone,
                                                                        BACKEND: the model or the worker
                                                                        failed, OTHER: the rest)
    nv_inference_count                   inferences (rows) = inference_count
    nv_inference_exec_count              executions      = execution_count
    nv_inference_request_duration_us     success.ns / 1000 (failures not included, as Triton's)
    nv_inference_queue_duration_us       queue.ns / 1000
    nv_inference_compute_{input,infer,output}_duration_us   compute_*.ns / 1000
    nv_inference_pending_request_count   requests waiting for an execution now (the queue, requeued
                                         batches included): a gauge

Each gateway counts its own share, and /metrics adds the gateways' up as it does ringserve's
counters (gateway/cluster/merge.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ringserve.gateway.cache.metrics import CACHE_FAMILIES
from ringserve.gateway.cluster.merge import Families
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.observe.latencies import LATENCY_FAMILIES
from ringserve.gateway.observe.model_metrics import escape_help, escape_label, prometheus_value
from ringserve.gateway.observe.process_metrics import GPU_FAMILIES
from ringserve.gateway.observe.stats import FAILURE_REASONS, ModelStatistics, Statistics
from ringserve.gateway.observe.triton_gauges import SERVER_GAUGES

LABELS = ["model", "version"]
# name -> (help, what it reads from a model version's statistics)
COUNTERS = {
    "nv_inference_request_success": (
        "Number of successful inference requests, all batch sizes",
        lambda s: s.success_count,
    ),
    "nv_inference_count": (
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    "nv_inference_exec_count": (
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s.success_ns // 1000,
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue_ns // 1000,
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input_ns // 1000,
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer_ns // 1000,
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.compute_output_ns // 1000,
    ),
}
UNTIMED = {
    name: COUNTERS[name] for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")
}
FAILURE = "nv_inference_request_failure"
PENDING = "nv_inference_pending_request_count"
TRITON_COUNTERS = frozenset({*COUNTERS, FAILURE})
# written as Triton writes them (exposition)
TRITON_FAMILIES = TRITON_COUNTERS | {PENDING} | GPU_FAMILIES | SERVER_GAUGES | LATENCY_FAMILIES | CACHE_FAMILIES


class TritonMetrics:
    """A collector of the `nv_inference_*` families for every model version the catalog serves."""

    def __init__(self, statistics: Statistics, catalog: Catalog) -> None:
        self.statistics = statistics
        self.catalog = catalog

    def collect(self) -> Iterable[Metric]:
        wanted = COUNTERS if self.statistics.metrics_config.counter_latencies else UNTIMED  # counter_latencies=false
        counters = {name: CounterMetricFamily(name, doc, labels=LABELS) for name, (doc, _) in wanted.items()}
        failure = CounterMetricFamily(
            FAILURE, "Number of failed inference requests, all batch sizes", labels=[*LABELS, "reason"]
        )
        pending = GaugeMetricFamily(
            PENDING, "Instantaneous number of pending requests awaiting execution per-model.", labels=LABELS
        )
        catalog, empty = self.catalog, ModelStatistics()
        for name in sorted(catalog.configs):
            for config in catalog.served_versions(name):
                stats = self.statistics.models.get((config.name, config.version), empty)
                labels = [config.name, str(config.version)]
                for family, (_, read) in zip(counters.values(), wanted.values()):
                    family.add_metric(labels, read(stats))
                for reason in FAILURE_REASONS:
                    failure.add_metric([*labels, reason], stats.failures.get(reason, 0))
                queue = catalog.queues.get(config.key)
                pending.add_metric(labels, 0 if queue is None else queue.depth)
        return [*counters.values(), failure, pending]


def exposition(families: Iterable[Metric]) -> bytes:
    """The text of /metrics: prometheus_client's, but Triton's families as Triton writes them.

    Written here by hand, in the same text format (labels sorted and escaped as prometheus_client
    does), because prometheus_client's writer differs from Triton's (prometheus-cpp) in two ways that
    Triton's clients notice: it names a counter's series `<name>_total` where Triton's have no suffix
    (`nv_inference_count{...}`: the name dashboards query), and it writes 2147483648 as
    2.147483648e+09, which perf_analyzer's `--collect-metrics` reads as 2 (its regex takes digits and
    one dot). Counters' samples stay `<name>_total` inside, as prometheus_client's parser reads a
    peer's text back (gateway/cluster/merge.py adds the gateways' samples up by name)."""
    families = list(families)
    text = [generate_latest(Families(f for f in families if f.name not in TRITON_FAMILIES))]
    for family in families:
        if family.name in TRITON_FAMILIES:
            text.append(_triton_text(family).encode())
    return b"".join(text)


def _triton_text(family: Metric) -> str:
    name = family.name
    lines = [f"# HELP {name} {escape_help(family.documentation)}\n", f"# TYPE {name} {family.type}\n"]
    whole = family.type in ("histogram", "summary")  # (their samples' own names: _bucket, _count, _sum)
    for sample in family.samples:
        labels = ",".join(f'{key}="{escape_label(value)}"' for key, value in sorted(sample.labels.items()))
        written = sample.name if whole else name
        lines.append(
            f"{written}{{{labels}}} {prometheus_value(sample.value)}\n"
            if labels
            else f"{written} {prometheus_value(sample.value)}\n"
        )
    return "".join(lines)
