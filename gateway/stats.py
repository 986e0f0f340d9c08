"""Triton's statistics extension: `GET /v2/models[/{m}[/versions/{v}]]/stats`.

Where each number comes from (gateway process):
- success (count, ns), inference_count (rows), last_inference: per answered batch, from
  the scheduler (`record_batch`), each request measured from its acceptance (queued) to
  its answer, as `ringserve_request_seconds` measures it. Per batch rather than per request:
  a per-request update cost ~1.5 us of the gateway's ~190 (issue 8's profile).
- fail (count, ns): every failed infer request for a known model, per request, measured
  by the infer path from the moment it starts reading the body to the error response.
- queue (per request) and compute_infer (per batch): the exact sums and counts of the
  `ringserve_queue_seconds` and `ringserve_compute_seconds` histograms (their series of that
  model and version).
- execution_count and batch_stats: batches the scheduler reports through
  `record_batch`; until it does, execution_count falls back to the batch histogram's
  count and batch_stats stays empty.
compute_input and compute_output are inside compute_infer here (the worker times one
session.run over slot views), so they report zeros.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from ringserve.common.model_config import ModelConfig


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    inference_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, Duration] = field(default_factory=dict)  # batch size -> compute_infer


class Statistics:
    """Per-model counters, fed by the infer path (requests) and the scheduler (batches)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.models: dict[str, ModelStatistics] = {}  # by model key: "m" (default version), "m/2"

    def _model(self, name: str) -> ModelStatistics:
        stats = self.models.get(name)
        if stats is None:
            stats = self.models[name] = ModelStatistics()
        return stats

    def record_failure(self, model: str, duration_ns: int) -> None:
        self._model(model).fail.add(duration_ns)

    def record_batch(self, model: str, batch_size: int, compute_s: float,
                     answered: int = 0, answered_rows: int = 0, latency_s: float = 0.0) -> None:
        """One batch that ran to a RESULT: called by the scheduler (see the module doc).

        `answered` requests of it (`answered_rows` rows) got their result now, after
        `latency_s` seconds between them since each was accepted.
        """
        stats = self._model(model)
        stats.batches.setdefault(batch_size, Duration()).add(int(compute_s * 1e9))
        if answered:
            stats.success.add(int(latency_s * 1e9), answered)
            stats.inference_count += answered_rows
            stats.last_inference_ms = time.time_ns() // 1_000_000

    def model_stats(self, config: ModelConfig) -> dict[str, Any]:
        stats = self.models.get(config.key) or ModelStatistics()
        queue = self._histogram("ringserve_queue_seconds", config)
        compute = self._histogram("ringserve_compute_seconds", config)
        executions = sum(d.count for d in stats.batches.values())
        if not stats.batches:
            executions = self._histogram("ringserve_batch_size", config, scale=1).count
        zero = Duration().to_json()
        return {
            "name": config.name, "version": str(config.version),
            "last_inference": stats.last_inference_ms, "inference_count": stats.inference_count,
            "execution_count": executions,
            "inference_stats": {"success": stats.success.to_json(), "fail": stats.fail.to_json(),
                                "queue": queue.to_json(), "compute_input": zero,
                                "compute_infer": compute.to_json(), "compute_output": zero,
                                "cache_hit": zero, "cache_miss": zero},
            "batch_stats": [{"batch_size": size, "compute_input": zero, "compute_infer": d.to_json(),
                             "compute_output": zero} for size, d in sorted(stats.batches.items())],
            "memory_usage": [],
        }

    def _histogram(self, name: str, config: ModelConfig, scale: float = 1e9) -> Duration:
        labels = {"model": config.name, "version": str(config.version)}
        count = self.registry.get_sample_value(name + "_count", labels) or 0
        total = self.registry.get_sample_value(name + "_sum", labels) or 0.0
        return Duration(int(count), int(round(total * scale)))
