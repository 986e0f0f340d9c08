"""Request deadlines: one loop timer per queue, armed for its earliest waiting deadline.

Not a timer per request: armed and cancelled, it cost ~3 us of the gateway's ~190 per
request (issue 8's profile). Requests with their level's default timeout need no bookkeeping
at all: in each FIFO lane their deadlines rise with arrival, so the earliest is a lane's head.
Only the exceptions, whose deadline is earlier than their place in the lane says (a lowered
per-request timeout, a request held while no worker was ready) or that left the lanes (a
DELAYed one, one in a requeued batch), go into a heap; its entries of answered requests are
dropped as they come up, or in a rebuild once they outnumber the waiting ones.

What happens to an expired request (504, or DELAY to the back of its group) is the
scheduler's `expire`, which this watch calls when the deadline comes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable

from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.core.request import InferRequest

TIMER_SLACK_S = 0.001  # asyncio/uvloop timers have millisecond resolution
DEADLINE_HEAP_SLACK = 1024  # a queue's deadline heap is rebuilt past this size when mostly answered


def policy_timeout_s(queue: ModelQueue, request: InferRequest) -> float:
    """Triton's queue policy: the default timeout, which a request may only lower (if allowed)."""
    policy = queue.policy_of(request)
    timeout_us = policy.default_timeout_us
    if request.timeout_us and policy.allow_timeout_override:
        timeout_us = min(timeout_us, request.timeout_us) if timeout_us else request.timeout_us
    return timeout_us / 1e6 if timeout_us else float("inf")


class DeadlineWatch:
    """The per-queue deadline timers of one event loop."""

    def __init__(self, expire: Callable[[ModelQueue, InferRequest], None]) -> None:
        self.expire = expire
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the gateway starts
        self._seq = itertools.count()

    def watch(self, queue: ModelQueue, request: InferRequest) -> None:
        """Watch a deadline earlier than its lane's order says (or of a request out of the lanes)."""
        heap = queue.deadlines
        heapq.heappush(heap, (request.deadline, next(self._seq), request))
        if request.deadline < queue.deadline_at:
            self.arm(queue, request.deadline)
        if len(heap) > DEADLINE_HEAP_SLACK and len(heap) > 4 * (queue.depth + len(queue.requeued)):
            heap[:] = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)

    def arm(self, queue: ModelQueue, when: float) -> None:
        if queue.deadline_timer is not None:
            queue.deadline_timer.cancel()
        queue.deadline_at = when
        queue.deadline_timer = self.loop.call_at(when, self._due, queue)

    def _due(self, queue: ModelQueue) -> None:
        queue.deadline_timer = None
        queue.deadline_at = float("inf")
        heap = queue.deadlines
        now = time.monotonic() + TIMER_SLACK_S  # a loop timer may fire up to its resolution early
        due = []
        while heap and heap[0][0] <= now:
            _, _, request = heapq.heappop(heap)
            if not request.done and request.deadline <= now:  # (a DELAYed one was pushed again, later)
                due.append(request)
        for lane in queue.live_lanes():
            for request in lane:  # FIFO: stop at the first head not due (exceptions are in the heap)
                if request.deadline > now:
                    break
                due.append(request)
        for request in due:
            self.expire(queue, request)
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        earliest = min((lane[0].deadline for lane in queue.live_lanes() if lane), default=float("inf"))
        if heap:
            earliest = min(earliest, heap[0][0])
        if earliest != float("inf"):
            self.arm(queue, earliest)
