"""Latency-target batch sizing: AIMD on the batch-size cap, as Clipper does.

With `latency_target_ms`, after each batch the slowest request's time (queue + compute)
is compared with the target. Above it, and with the batch's compute alone taking more than
its share of the target, the cap shrinks by a factor (multiplicative decrease): the batches
themselves are too slow. Otherwise - under the target, or over it only because requests
queued - the cap grows by one row when it was the limit (additive increase): shrinking
batches while requests queue would only drain the queue slower, and collapse to batch 1
under load (measured: bench compute, docs/performance.md).
"""

from __future__ import annotations

DECREASE_FACTOR = 0.75
MIN_CAP = 1
COMPUTE_SHARE = 0.5  # of the target, a batch's execution may take; the rest is for queueing


class LatencyTargetSizer:
    def __init__(self, target_s: float, max_rows: int) -> None:
        self.target_s = target_s
        self.max_rows = max_rows
        self.cap = max_rows

    def observe(self, slowest_latency_s: float, rows: int, compute_s: float | None = None) -> None:
        batches_too_slow = compute_s is None or compute_s > self.target_s * COMPUTE_SHARE
        if slowest_latency_s > self.target_s and batches_too_slow:
            self.cap = max(MIN_CAP, int(min(self.cap, rows) * DECREASE_FACTOR))
        elif rows >= self.cap:
            # Grow only when the cap was the limit: an idle queue says nothing about bigger batches.
            self.cap = min(self.max_rows, self.cap + 1)
