"""Admission: whether a request's model can take it now, and into its queue with its deadlines.

Held by the Scheduler (dispatch/scheduler.py), which forms and sends the batches of what is admitted
here; the replies are dispatch/replies.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ringserve.gateway.batching.deadlines import DeadlineWatch, policy_timeout_s
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.core.errors import (
    ModelFailed,
    Unavailable,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.answers import Answers
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery

log = logging.getLogger(__name__)


class Admission:
    """The scheduler's front door: check_available, submit, and what a passed deadline does. The Scheduler
    holds it and hands it the parts it reads; `pump_soon` is the scheduler's, called once a request is in."""

    def __init__(
        self,
        *,
        settings: DispatchSettings,
        catalog: Catalog,
        fleet: Fleet,
        recovery: Recovery,
        answers: Answers,
        deadlines: DeadlineWatch,
        pump_soon: Callable[[], None],
    ) -> None:
        self.settings, self.catalog, self.fleet, self.recovery = settings, catalog, fleet, recovery
        self.answers, self.finish, self.deadlines, self.pump_soon = answers, answers.finish, deadlines, pump_soon
        # (the maps it reads per request, not their owners)
        self.queues: dict[str, ModelQueue] = catalog.queues
        self.workers: dict[int, WorkerHandle] = fleet.workers
        self.quarantined: dict[str, str] = recovery.quarantined
        self._pending_swaps = catalog.pending
        self.draining = False  # set as the gateway drains: new requests get 503, readiness goes false

    def check_available(self, model: str) -> None:
        if self.draining:
            raise Unavailable(
                say("stopping", "the server is shutting down; send the request to another replica"),
                self.settings.retry_after_s,
            )
        if model in self.quarantined:
            raise Unavailable(f"model {model!r} is quarantined: {self.quarantined[model]}", self.settings.retry_after_s)
        for worker in self.workers.values():
            if worker.state == "ready" and model in worker.models and not worker.standby:
                return
        if self.fleet.fill_active():
            return self.check_available(model)
        failed = {w.failed_models[model] for w in self.workers.values() if model in w.failed_models}
        if failed and self.fleet.ready_workers():
            raise ModelFailed(
                say(
                    "no_available_versions",
                    f"model {model!r} is not available: it failed to load ({'; '.join(sorted(failed))})",
                    model=model,
                )
            )
        raise Unavailable(
            f"no inference worker is ready for model {model!r} ({self.fleet.summary()}); retry shortly",
            self.settings.retry_after_s,
        )

    def submit(self, request: InferRequest) -> None:
        """Queue an accepted request; its future gets exactly one result or GatewayError."""
        if request.model.name in self._pending_swaps:
            self.catalog.swap_if_idle(request.model.name)  # a reload changed this model's config
        now = time.monotonic()
        hard_timeout_s = self.settings.request_timeout_s
        try:
            self.check_available(request.model.key)
        except Unavailable:
            hold_s = max(self.settings.hold_when_unavailable_s, request.hold_s)
            if not self._may_hold(request.model.key, hold_s):
                raise
            request.held = True  # a worker is restarting: wait for it, up to the hold bound
            hard_timeout_s = min(hard_timeout_s, hold_s)
        queue = self.queues[request.model.key]
        request.enqueued_at = now
        request.queued_ns = time.perf_counter_ns()  # (Triton's statistics: gateway/observe/stats.py)
        queue.submit(request)  # may refuse: queue full
        request.hard_deadline = now + hard_timeout_s
        request.deadline = min(request.hard_deadline, now + policy_timeout_s(queue, request))
        if request.held or request.timeout_us or not queue.deadlines_in_lanes:
            self.deadlines.watch(queue, request)  # a deadline earlier than its lane's order: in the heap
        elif queue.deadline_timer is None:
            self.deadlines.arm(queue, request.deadline)  # nothing else waits (the timer is armed while any does)
        if queue.batching.preserve_ordering:
            self.answers.keep_order(request)
        self.pump_soon()

    def _may_hold(self, model: str, hold_s: float) -> bool:
        # (also while no worker has been heard of yet: a gateway can be up before the workers' READY reaches it)
        return hold_s > 0 and not self.draining and model not in self.quarantined

    def expire(self, queue: ModelQueue, request: InferRequest) -> None:
        """Deadline passed: 504 (REJECT) or to the back of its group (DELAY), unless it is running."""
        if request.done:
            return
        if (
            time.monotonic() < request.hard_deadline
            and queue.policy_of(request).timeout_action == "DELAY"
            and queue.delay(request)
        ):
            request.deadline = request.hard_deadline
            self.deadlines.watch(queue, request)  # out of the live lane: the heap watches it now
            return
        if queue.discard(request) or any(request in b.requests for b in queue.requeued):
            log.debug(
                "model %s: a request expired in the queue", queue.config.key, extra={"request_id": request.request_id}
            )
            self.finish(request, error=queue.expiry_error(request) or self.recovery.expiry_error(request))
        # else running on a worker: its batch answers it, or its death requeues it (_queue_head)
