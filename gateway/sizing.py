"""Latency-target batch sizing: AIMD on the batch-size cap, as Clipper does.

With `latency_target_ms`, after each batch the slowest request's time (queue + compute)
is compared with the target: above it, the cap shrinks by a factor (multiplicative
decrease); below it, the cap grows by one row (additive increase). Over time the cap
settles at the largest batch that keeps latency under the target at the current load.
"""
from __future__ import annotations

DECREASE_FACTOR = 0.75
MIN_CAP = 1


class LatencyTargetSizer:
    def __init__(self, target_s: float, max_rows: int) -> None:
        self.target_s = target_s
        self.max_rows = max_rows
        self.cap = max_rows

    def observe(self, slowest_latency_s: float, rows: int) -> None:
        if slowest_latency_s > self.target_s:
            self.cap = max(MIN_CAP, int(min(self.cap, rows) * DECREASE_FACTOR))
        elif rows >= self.cap:
            # Grow only when the cap was the limit: an idle queue says nothing about bigger batches.
            self.cap = min(self.max_rows, self.cap + 1)
