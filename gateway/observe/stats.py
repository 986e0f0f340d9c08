"""Triton's statistics extension (`GET /v2/models[/{m}[/versions/{v}]]/stats`), with Triton's meanings.

Triton's core (src/infer_stats.cc) counts per request: `success`, `queue`, `compute_input`,
`compute_infer` and `compute_output` all carry the one count of successful requests, and their
`ns` sum each request's own time; a request of a batch adds the whole batch's compute times.
Per execution: `execution_count`, and `batch_stats` (per batch size: its executions, and their
compute times once each). `inference_count` adds each successful request's rows; `last_inference`
is the latest execution's wall clock, in ms. `fail` counts failed requests, arrival to error.

ringserve's stages give them, from time.perf_counter_ns() stamps taken once per stage (per request
at arrival and when queued, per batch when formed, written and answered by the worker) and the
worker's own time of the execution (RESULT's compute_s):

    arrival ─parse─ queued ─queue─ formed ─write─ written ─BATCH─ [session.run] ─RESULT─ received ─split, encode─ answered
    (front end)     (submit)       (batch taken)  (slot)           (the worker)           (gateway)              (written)
- success.ns: arrival (the front end's first look at the request, before its body is read and
  parsed) to answered (its answer encoded and handed to the connection; gRPC: the response built).
- queue: queued to formed (waiting in the batcher: max_queue_delay, a busy worker or ring).
- compute_input: formed to written: the batch's tensors written into its slot.
- compute_infer: the execution, as the worker timed its session.run (as Triton's is the backend's
  model run; for a fused execution, the whole of it). The BATCH and RESULT messages and the worker
  reading the slot and writing its outputs are in none of the parts: perf_analyzer shows them in
  its "overhead" (success less the parts), with the parse.
- compute_output: RESULT received to answered: the outputs split from the slot (and written into
  shared-memory regions), the answer encoded and sent.
A request's five are added together, in the one call that counts its success (`record_success`,
by the front end once it has answered), so their counts are always equal: perf_analyzer refuses
statistics whose compute counts differ. A batch's execution is counted when its RESULT arrives
(`record_execution`); batch_stats' compute_output is its split there.

A fused execution (worker/fusion.py: batches of several gateways in one session.run) is one
execution, counted by the gateway whose batch's RESULT reports it (`execution_rows`), with the
execution's rows as its batch size; the other batches' RESULTs count their requests only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ringserve.common.metrics_config import MetricsConfig
from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import (
    BatchWriteFailed,
    ClientDisconnected,
    DeadlineExceeded,
    GatewayError,
    ModelExecutionFailed,
    WorkerCrashed,
)
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.observe.latencies import LatencyMetrics, Series

# Triton's failure reasons (`nv_inference_request_failure{reason}`), and which errors are which.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_FAILURE_REASON: dict[type[GatewayError], str] = {
    DeadlineExceeded: "REJECTED",  # Triton: "Request timeout expired" in the scheduler
    ClientDisconnected: "CANCELED",
    ModelExecutionFailed: "BACKEND",
    WorkerCrashed: "BACKEND",
    BatchWriteFailed: "BACKEND",
}


def failure_reason(error: GatewayError) -> str:
    for cls in type(error).__mro__:
        reason = _FAILURE_REASON.get(cls)
        if reason is not None:
            return reason
    return "OTHER"


@dataclass(slots=True)
class BatchSizeStatistics:
    """The executions of one batch size, and their compute times (once per execution)."""

    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def to_json(self, batch_size: int) -> dict[str, Any]:
        return {
            "batch_size": batch_size,
            "compute_input": _duration(self.count, self.input_ns),
            "compute_infer": _duration(self.count, self.infer_ns),
            "compute_output": _duration(self.count, self.output_ns),
        }


@dataclass(slots=True)
class ModelStatistics:
    """One model version's counters. Plain fields: a success adds to six of them per request."""

    success_count: int = 0  # (the count of success, queue and compute_*, as Triton's one success_count_)
    success_ns: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchSizeStatistics] = field(default_factory=dict)  # by batch size (rows executed)
    failures: dict[str, int] = field(default_factory=dict)  # by Triton's failure reason
    latency: Any = None  # its latencies.Series when --metrics-config asks for summaries or the histogram
    # The response cache's (gateway/cache/responses.py): a hit is also a success, with no compute.
    cache_hit_count: int = 0
    cache_hit_ns: int = 0
    cache_miss_count: int = 0
    cache_miss_ns: int = 0


def record_success(request: InferRequest, answered_ns: int) -> None:
    """A request answered (its answer handed to the client at `answered_ns`), counted in every stage.

    Called by the front ends (HTTP and gRPC) per request: the arithmetic is inline, no object made.
    `request.stages` is what the scheduler gave each request it answered from a RESULT, one tuple per
    batch: the model version's statistics, the batch's formed and written stamps, the worker's compute
    time and the RESULT's stamp."""
    stats, formed_ns, written_ns, compute_ns, received_ns = request.stages
    stats.success_count += 1
    stats.success_ns += answered_ns - (request.arrived_ns or request.queued_ns)  # (0: not from a front end)
    stats.queue_ns += formed_ns - request.queued_ns
    stats.compute_input_ns += written_ns - formed_ns
    stats.compute_infer_ns += compute_ns
    stats.compute_output_ns += answered_ns - received_ns
    stats.inference_count += request.rows or 1  # (Triton counts a request of zero rows as one inference)
    if stats.latency is not None:  # --metrics-config's summaries or histogram (gateway/observe/latencies.py)
        observe_latencies(stats.latency, request, answered_ns)


def observe_latencies(series: Series, request: InferRequest, answered_ns: int) -> None:
    """A success's five times into the summaries, and (not decoupled: its answer is its first response) the
    first-response histogram."""
    stats, formed_ns, written_ns, compute_ns, received_ns = request.stages
    success_ns = answered_ns - (request.arrived_ns or request.queued_ns)
    series.observe_success(
        (success_ns, formed_ns - request.queued_ns, written_ns - formed_ns, compute_ns, answered_ns - received_ns)
    )
    if not request.model.decoupled:
        series.observe_first_response(success_ns)


class Statistics:
    """Per model version counters: successes and failures from the front ends, executions from the scheduler."""

    def __init__(self, metrics_config: MetricsConfig | None = None) -> None:
        self.models: dict[tuple[str, int], ModelStatistics] = {}  # by (name, version)
        self.metrics_config = metrics_config or MetricsConfig()
        config = self.metrics_config
        # Triton's latency families that --metrics-config turns on; None: neither, and nothing observed
        self.latency = LatencyMetrics(config) if config.summary_latencies or config.histogram_latencies else None

    def of(self, name: str, version: int) -> ModelStatistics:
        stats = self.models.get((name, version))
        if stats is None:
            stats = self.models[(name, version)] = ModelStatistics()
            if self.latency is not None:
                stats.latency = self.latency.of(name, version)
        return stats

    def first_response(self, request: InferRequest) -> None:
        """A decoupled model's request sent its first response (gateway/dispatch/replies.py)."""
        if self.latency is not None:
            duration_ns = time.perf_counter_ns() - (request.arrived_ns or request.queued_ns)
            self.latency.of(request.model.name, request.model.version).observe_first_response(duration_ns)

    def record_failure(self, name: str, version: int, duration_ns: int, error: GatewayError) -> None:
        """One failed request, from its arrival to its error answer."""
        stats = self.of(name, version)
        stats.fail_count += 1
        stats.fail_ns += duration_ns
        reason = failure_reason(error)
        stats.failures[reason] = stats.failures.get(reason, 0) + 1

    @staticmethod
    def record_execution(stats: ModelStatistics, rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of `rows` rows (the scheduler's, at the RESULT that reports it)."""
        stats.execution_count += 1
        sized = stats.batches.get(rows)
        if sized is None:
            sized = stats.batches[rows] = BatchSizeStatistics()
        sized.count += 1
        sized.input_ns += input_ns
        sized.infer_ns += infer_ns
        sized.output_ns += output_ns
        stats.last_inference_ms = time.time_ns() // 1_000_000

    def model_stats(self, config: ModelConfig) -> dict[str, Any]:
        """Triton's `$model_stat` of one model version."""
        s = self.models.get((config.name, config.version)) or ModelStatistics()
        count, computed = s.success_count, s.success_count - s.cache_hit_count  # (Triton's: hits ran no model)
        return {
            "name": config.name,
            "version": str(config.version),
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": _duration(count, s.success_ns),
                "fail": _duration(s.fail_count, s.fail_ns),
                "queue": _duration(count, s.queue_ns),
                "compute_input": _duration(computed, s.compute_input_ns),
                "compute_infer": _duration(computed, s.compute_infer_ns),
                "compute_output": _duration(computed, s.compute_output_ns),
                "cache_hit": _duration(s.cache_hit_count, s.cache_hit_ns),
                "cache_miss": _duration(s.cache_miss_count, s.cache_miss_ns),
            },
            "response_stats": {},
            "batch_stats": [sized.to_json(size) for size, sized in sorted(s.batches.items())],
            "memory_usage": [],
        }


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}
