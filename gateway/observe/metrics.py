"""Prometheus metrics of the gateway (prometheus-client, one registry per app).

Worker counters are collected from the gateway's view of the supervisor's numbers at
scrape time, so they stay exact even when the gateway itself was restarted. The collector
reads a GatewaySnapshot, taken when /metrics is scraped (gateway/dispatch/dispatcher.py builds it).
Build info, every process's numbers and the GPUs' come from gateway/observe/process_metrics.py.

Families about one model's traffic carry `model` (its name) and `version`: with several versions
served (`/v2/models/m/versions/2/infer`), each is told apart. Both come from the served configs
(an unknown model or version counts as `_unknown`), so the label sets stay as few as the versions
the repository serves.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from ringserve.common.messages import ModelState, Result
from ringserve.common.supervisor_messages import SpareInfo
from ringserve.gateway.batching.padding import real_and_padded_elements
from ringserve.gateway.observe.process_metrics import BuildInfoCollector, GpuCollector, ProcessesCollector, ProcessId

# The *_created series double the scrape size and no dashboard here reads them.
disable_created_metrics()

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
MODEL_LABELS = ["model", "version"]
LANE_LABELS = ["model", "worker", "pid"]  # model: its key ('m', or 'm/2' for a version not the default)
LOAD_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class QueueSample:
    model: str  # model name
    version: int
    depth: int  # requests waiting, requeued batches' included
    quarantined: bool
    # A sequence model's (gateway/batching/sequences.py: SequenceQueue.status); None for another model.
    sequences: dict[str, int] | None = None


@dataclass(frozen=True)
class WorkerSample:
    index: int
    up: bool
    rss_bytes: int
    restarts: dict[str, int]  # exit reason -> count
    model_memory: list[tuple[str, int, int]]  # (model, version, bytes) of each loaded version
    busy_s: float = 0.0  # its executions' seconds through this gateway
    uss_bytes: int = 0
    pid: int | None = None
    models: tuple[str, ...] = ()  # the model keys it holds: its lane


@dataclass(frozen=True)
class GatewaySnapshot:
    """The gauges of one scrape: queues, workers, their model memory and budgets."""

    queues: list[QueueSample]
    workers: list[WorkerSample]
    budget_bytes: dict[int, int]  # worker index -> its model memory budget
    gateway_restarts: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # (gateway, reason -> count)
    spares: list[SpareInfo] = field(default_factory=list)  # the warm spare of each worker device


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = RequestCounter(r)
        # One answered infer request (gateway/kserve/dataplane.py's finish): the counter's own method, no call between.
        self.count_request = self.requests.count
        self.grpc_stream_in_flight = Gauge(
            "ringserve_grpc_stream_requests_in_flight",
            "Requests read from gRPC ModelStreamInfer streams and not yet answered "
            "back (each stream holds at most --grpc-stream-max-in-flight)",
            registry=r,
        )
        # Per execution, as the worker ran it: batches of several gateways fused into one execution
        # count once, with all their rows (observe_execution).
        self.batch_size = Histogram(
            "ringserve_batch_size",
            "Rows per model execution in a worker",
            MODEL_LABELS,
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.fused_executions = Counter(
            "ringserve_fused_executions",
            "Model executions that ran batches of several gateways (or several of one) together",
            MODEL_LABELS,
            registry=r,
        )
        self.queue_seconds = LatencyHistogram(
            "ringserve_queue_seconds", "Time from accept to batch dispatch", SECONDS_BUCKETS, registry=r
        )
        self.compute_seconds = Histogram(
            "ringserve_compute_seconds",
            "Model execution time per execution",
            MODEL_LABELS,
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.request_seconds = LatencyHistogram(
            "ringserve_request_seconds",
            "Time from accept to answer of an inference request (queue + compute)",
            SECONDS_BUCKETS,
            registry=r,
        )
        self.batches_requeued = Counter(
            "ringserve_batches_requeued",
            "Batches put back in their queue after their worker died",
            MODEL_LABELS,
            registry=r,
        )
        self.poison_requests = Counter(
            "ringserve_poison_requests",
            "Requests isolated as crashing the worker on their own",
            MODEL_LABELS,
            registry=r,
        )
        self.requests_pruned = Counter(
            "ringserve_requests_pruned",
            "Requests dropped before their batch formed (client gone, deadline passed)",
            [*MODEL_LABELS, "reason"],
            registry=r,
        )
        self.real_elements = Counter(
            "ringserve_real_elements", "Input elements requests brought into batches", MODEL_LABELS, registry=r
        )
        self.padded_elements = Counter(
            "ringserve_padded_elements",
            "Input elements added by padding (waste = padded / real)",
            MODEL_LABELS,
            registry=r,
        )
        # Model lifecycle, from the workers' reports (gateway/dispatch/model_states.py).
        self.model_loads = Counter(
            "ringserve_model_loads",
            "Model version loads in the workers, by load policy",
            ["model", "version", "policy"],
            registry=r,
        )
        self.model_unloads = Counter(
            "ringserve_model_unloads",
            "Model version unloads in the workers, by reason (ttl, lru, api)",
            ["model", "version", "reason"],
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "ringserve_model_load_seconds",
            "Time a worker took to load (and warm up) a model version",
            MODEL_LABELS,
            buckets=LOAD_SECONDS_BUCKETS,
            registry=r,
        )
        # A replacement generation (reload, recycling) that failed a model the old one serves is
        # stopped, and the old generation serves on (gateway/dispatch/fleet.py): counted per model key.
        self.reload_failures = Counter(
            "ringserve_reload_failures",
            "Replacement worker generations refused because they failed a model the "
            "serving generation serves (it serves on)",
            ["model"],
            registry=r,
        )
        self._add_budget_metrics()
        r.register(BuildInfoCollector())
        r.register(GpuCollector())

    # -- the model memory budget, from the workers' ModelState reports -------------------------------
    def _add_budget_metrics(self) -> None:
        self.budget_exhausted = Counter(
            "ringserve_model_budget_exhausted",
            "Loads a worker refused: the memory budget was full of models in use",
            ["model", "version"],
            registry=self.registry,
        )
        self.peak_references = Gauge(
            "ringserve_model_peak_references",
            "The most batches that held one model version at once in one worker",
            ["model", "version"],
            registry=self.registry,
        )
        self._peak_references: dict[tuple[str, int], int] = {}

    def observe_model_state(self, change: ModelState) -> None:
        """Count a budget refusal; raise the peak-references gauge to the worker's new peak."""
        report = change.report
        if change.cause == "budget" and report.reason:  # a refusal (the version's own state is unchanged)
            self.budget_exhausted.labels(report.model, str(report.version)).inc()
        key = (report.model, report.version)
        if report.peak_refs > self._peak_references.get(key, 0):
            self._peak_references[key] = report.peak_refs
            self.peak_references.labels(report.model, str(report.version)).set(report.peak_refs)

    def observe_batch(self, config, requests: list, refs: list, now: float) -> None:
        """Per formed batch: each request's queue time, and padding waste when padded."""
        name, version = config.name, config.version
        observe = self.queue_seconds.observe
        for request in requests:
            observe(name, version, now - request.enqueued_at)
        if config.dynamic_batching is not None and config.dynamic_batching.padding is not None:
            real, padded = real_and_padded_elements(requests, [ref.shape for ref in refs])
            labels = model_labels(config)
            self.real_elements.labels(*labels).inc(real)
            self.padded_elements.labels(*labels).inc(padded)

    def observe_execution(self, config, batch, result: Result) -> None:
        """Per model execution, at the RESULT that reports it: its rows, its compute time, and whether
        it was fused. A fused execution is reported by its first batch's RESULT (`execution_rows`);
        the others' say 0 and count nothing here. A RESULT that runs alone and does not say
        (`fused` 1, `execution_rows` 0) counts its own batch's rows (gateway/batching/slots.py's SlotBatch: summed
        over its requests only then)."""
        rows = executed_rows(result, batch)
        if not rows:
            return
        labels = model_labels(config)
        self.batch_size.labels(*labels).observe(rows)
        self.compute_seconds.labels(*labels).observe(result.compute_s)
        if result.fused > 1:
            self.fused_executions.labels(*labels).inc()

    def attach(
        self, snapshot: Callable[[], GatewaySnapshot], processes: Callable[[], list[ProcessId]] | None = None
    ) -> None:
        """Collect the gauges from `snapshot()`, and the numbers of the `processes()`, at each scrape."""
        self.registry.register(_SnapshotCollector(snapshot))
        if processes is not None:
            self.registry.register(ProcessesCollector(processes))


def executed_rows(result: Result, batch) -> int:
    """The rows of the execution a RESULT reports; 0 when another batch's RESULT reports it (fused)."""
    if result.execution_rows > 0:
        return result.execution_rows
    return 0 if result.fused > 1 else max(batch.rows, 1)  # (an execution of zero-sized tensors still ran)


def model_labels(config) -> tuple[str, str]:
    """The `model` and `version` label values of a served model version (a ModelConfig)."""
    return config.name, str(config.version)


class RequestCounter:
    """`ringserve_requests_total` by model, version and HTTP code, written by hand for LatencyHistogram's
    reason: prometheus_client's child.inc() is three Python calls and a lock on every request (~1 µs);
    here it is one addition (`count`, on the loop), and the family is made at scrape time (also on the
    loop). Version 0 (no such model or version) has an empty label."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: dict[tuple[str, int, int], int] = {}  # (model, version, code) -> requests
        registry.register(self)

    def count(self, model: str, version: int, code: int) -> None:
        """One answered infer request of `model` `version` (0: no such model or version) with status `code`."""
        key = (model, version, code)
        self.counts[key] = self.counts.get(key, 0) + 1

    def collect(self):
        family = CounterMetricFamily(
            "ringserve_requests", "Inference requests answered, by HTTP code", labels=["model", "version", "code"]
        )
        for (model, version, code), count in self.counts.items():
            family.add_metric([model, str(version) if version else "", str(code)], count)
        yield family


class LatencyHistogram:
    """A histogram by model for what the infer path observes per request, in Prometheus's format.

    Written by hand: prometheus_client's Histogram takes two locks and walks its buckets in
    Python on every observe (~2 us, and `labels()` on top); the infer path observes twice per
    request, always from the event loop's thread. Here an observation is a bisect and two
    additions (~0.3 us); a collector turns the counts into the usual `_bucket`/`_count`/`_sum`
    series at scrape time (also from the loop: /metrics is an async route).
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        # (model, version) -> [count per bucket..., count over the last, sum]
        self.series: dict[tuple[str, int], list[float]] = {}
        registry.register(self)

    def observe(self, model: str, version: int, value: float) -> None:
        key = (model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [0] * (len(self.bounds) + 1) + [0.0]
        series[bisect_left(self.bounds, value)] += 1  # le: the first bound >= value
        series[-1] += value

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=MODEL_LABELS)
        for (model, version), series in self.series.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), series):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([model, str(version)], buckets, series[-1])
        yield family


def _sequences(snapshot: GatewaySnapshot):
    """Sequence models' gauges: live sequences and their state's memory (the shared store's), and this
    gateway's backlog and idle releases."""
    families = {
        "active_sequences": GaugeMetricFamily(
            "ringserve_sequences_active", "Sequences holding a candidate slot (and state)", labels=MODEL_LABELS
        ),
        "backlog": GaugeMetricFamily(
            "ringserve_sequence_backlog", "Sequences waiting for a candidate slot", labels=MODEL_LABELS
        ),
        "idle_releases": CounterMetricFamily(
            "ringserve_sequence_idle_releases",
            "Sequences released after max_sequence_idle_microseconds without a request",
            labels=MODEL_LABELS,
        ),
        "state_bytes": GaugeMetricFamily(
            "ringserve_sequence_state_bytes", "Shared memory of the model's state store", labels=MODEL_LABELS
        ),
    }
    for queue in snapshot.queues:
        if queue.sequences is not None:
            for key, family in families.items():
                family.add_metric([queue.model, str(queue.version)], queue.sequences[key])
    yield from families.values()  # (without samples where no model has sequences)


class _SnapshotCollector:
    def __init__(self, snapshot: Callable[[], GatewaySnapshot]) -> None:
        self.snapshot = snapshot

    def collect(self):
        snapshot = self.snapshot()
        depth = GaugeMetricFamily("ringserve_queue_depth", "Requests waiting for a batch", labels=MODEL_LABELS)
        quarantined = GaugeMetricFamily(
            "ringserve_model_quarantined",
            "1 when the model is quarantined for crashing the worker",
            labels=MODEL_LABELS,
        )
        for queue in snapshot.queues:
            labels = [queue.model, str(queue.version)]
            depth.add_metric(labels, queue.depth)
            quarantined.add_metric(labels, 1.0 if queue.quarantined else 0.0)
        yield from _sequences(snapshot)
        up = GaugeMetricFamily("ringserve_worker_up", "1 when the worker is ready to serve", labels=["worker"])
        restarts = CounterMetricFamily(
            "ringserve_worker_restarts", "Worker restarts by exit reason", labels=["worker", "reason"]
        )
        memory = GaugeMetricFamily(
            "ringserve_worker_memory_bytes",
            "Resident memory of the serving worker process (its loaded models included)",
            labels=["worker"],
        )
        uss = GaugeMetricFamily(
            "ringserve_worker_unique_memory_bytes",
            "Unique memory (USS) of the serving worker process: what its lane costs on its own",
            labels=["worker"],
        )
        busy = CounterMetricFamily(
            "ringserve_worker_busy_seconds", "Seconds the worker spent executing batches", labels=["worker"]
        )
        lanes = GaugeMetricFamily(
            "ringserve_lane_info", "1 per model a worker process holds (its lane), with its pid", labels=LANE_LABELS
        )
        for worker in snapshot.workers:
            up.add_metric([str(worker.index)], 1.0 if worker.up else 0.0)
            memory.add_metric([str(worker.index)], float(worker.rss_bytes))
            uss.add_metric([str(worker.index)], float(worker.uss_bytes))
            busy.add_metric([str(worker.index)], worker.busy_s)
            for model in worker.models if worker.pid else ():
                lanes.add_metric([model, str(worker.index), str(worker.pid)], 1.0)
            for reason, count in worker.restarts.items():
                restarts.add_metric([str(worker.index), reason], count)
        gateway_restarts = CounterMetricFamily(
            "ringserve_gateway_restarts", "Gateway restarts by exit reason", labels=["gateway", "reason"]
        )
        for gateway, by_reason in snapshot.gateway_restarts:
            for reason, count in by_reason.items():
                gateway_restarts.add_metric([gateway, reason], count)
        yield from (
            depth,
            up,
            restarts,
            gateway_restarts,
            memory,
            uss,
            busy,
            lanes,
            quarantined,
            *_model_memory(snapshot),
            *_spares(snapshot),
        )


def _model_memory(snapshot: GatewaySnapshot):
    memory = GaugeMetricFamily(
        "ringserve_model_memory_bytes",
        "Memory a loaded model version takes in a worker (measured around its load)",
        labels=["model", "version", "worker"],
    )
    budget = GaugeMetricFamily(
        "ringserve_model_memory_budget_bytes",
        "The worker's memory budget for loaded models (0 = none)",
        labels=["worker"],
    )
    for worker in snapshot.workers:
        for model, version, memory_bytes in worker.model_memory:
            memory.add_metric([model, str(version), str(worker.index)], float(memory_bytes))
    for index, budget_bytes in sorted(snapshot.budget_bytes.items()):
        budget.add_metric([str(index)], float(budget_bytes))
    return memory, budget


def _spares(snapshot: GatewaySnapshot):
    """The warm spares (supervision/spares.py): per worker device, takeovers and the spare's own deaths."""
    takeovers = CounterMetricFamily(
        "ringserve_spare_takeovers",
        "Worker processes started as a warm spare that took the place (no interpreter start)",
        labels=["device"],
    )
    deaths = CounterMetricFamily(
        "ringserve_spare_deaths",
        "Warm spares that died before taking over, by exit reason (not worker restarts)",
        labels=["device", "reason"],
    )
    memory = GaugeMetricFamily(
        "ringserve_spare_memory_bytes", "Resident memory of the warm spare (0: none now)", labels=["device"]
    )
    for spare in snapshot.spares:
        device = str(spare.device)
        takeovers.add_metric([device], spare.takeovers)
        memory.add_metric([device], float(spare.rss_bytes))
        for reason, count in spare.deaths.items():
            deaths.add_metric([device, reason], count)
    return takeovers, deaths, memory
