"""Answering accepted requests: each future gets exactly one result or error, in order when asked.

With `preserve_ordering` (Triton's dynamic_batching option) a model answers its requests in
arrival order: a request that finished waits for those that came before it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.observe.metrics import Metrics


class Answers:
    """Finishes requests: latency metric, outcome, and the answer (now, or after earlier ones)."""

    def __init__(self, metrics: Metrics) -> None:
        self.observe_latency = metrics.request_seconds.observe
        self._ordering: dict[str, deque[InferRequest]] = {}  # preserve_ordering models: arrival order

    def keep_order(self, request: InferRequest) -> None:
        """Answer `request` only after every earlier request of its model kept in order."""
        self._ordering.setdefault(request.model.key, deque()).append(request)

    def finish(
        self,
        request: InferRequest,
        result: Any = None,
        error: GatewayError | None = None,
        latency_s: float | None = None,
    ) -> None:
        if request.done:
            return
        request.done = True
        # What ties it to its client's connection goes now: a finished request may stay referenced a while (a
        # deadline heap drops answered entries lazily, up to batching/deadlines.py's slack), and grpcio counts a
        # call whose objects are alive against the connection's streams: 256 answered sequence steps held that
        # way and the next call on the connection was refused (RST_STREAM, REFUSED_STREAM; perf_analyzer's
        # sequence mode).
        request.disconnected = request.stream = None
        if request.sequence is not None and request.sequence.release is not None:
            request.sequence.release(request)  # its sequence's next step may go (gateway/batching/sequences.py)
        if request.enqueued_at:
            if latency_s is None:
                latency_s = time.monotonic() - request.enqueued_at
            self.observe_latency(request.model.name, request.model.version, latency_s)
        request.outcome = (result, error)
        order = self._ordering.get(request.model.key)
        if order is None:
            _answer(request)
            return
        # preserve_ordering: answer in arrival order; a finished request waits for those before it.
        while order and order[0].done:
            _answer(order.popleft())


def _answer(request: InferRequest) -> None:
    result, error = request.outcome
    if not request.future.done():
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)
