"""What happens to batches that did not simply succeed: requeued, bisected, failed, quarantined.

When a worker dies, the batches it held go back to the head of their queue, attempt + 1 for
the one it was running, same slot. A batch that killed workers `max_attempts` times (or that
the model refused with an error) is split in halves until the request that fails on its own
is found; only it gets an error. `quarantine_poison_requests` such requests within
`quarantine_window_s` quarantine their model: everything queued for it gets 503, other models
go on. The supervisor is told of each poison request and of the quarantine (QUARANTINE_MODEL):
it counts them from every gateway and quarantines the model in all of them.
The supervisor quarantines a model too (3 worker deaths while loading it).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

from ringserve.common import tracing
from ringserve.common.supervisor_messages import QuarantineModel
from ringserve.gateway.batching.deadlines import DeadlineWatch
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slots import SlotBatch
from ringserve.gateway.core.errors import DeadlineExceeded, GatewayError, StreamBroken, Unavailable, WorkerCrashed
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.observe.metrics import Metrics, model_labels
from ringserve.shm.ring import Ring

log = logging.getLogger(__name__)

POISON_REQUESTS_KEPT = 10  # per model, for /admin/status: the latest requests isolated as poison


class Recovery:
    """Requeues, bisects and fails batches, and quarantines models; the scheduler's other half."""

    def __init__(
        self,
        *,
        queues: dict[str, ModelQueue],
        fleet: Fleet,
        ring: Ring,
        metrics: Metrics,
        settings: DispatchSettings,
        finish: Callable[..., None],
        deadlines: DeadlineWatch,
        batches: dict[int, SlotBatch],
        batch_ids: Iterator[int],
    ) -> None:
        self.queues, self.fleet, self.ring, self.metrics, self.settings = queues, fleet, ring, metrics, settings
        self.finish, self.deadlines = finish, deadlines
        self.batches = batches  # in flight, by id (the scheduler's map)
        self.batch_ids = batch_ids
        self.quarantined: dict[str, str] = {}  # model key -> why
        self._poison_times: dict[str, list[float]] = {}
        # model key -> the latest poison requests: {"request_id", "reason", "time"} (/admin/status)
        self.poison_requests: dict[str, deque[dict]] = {}
        self.tell_supervisor: Callable[[QuarantineModel], None] | None = None  # set by the scheduler
        self.tracing = tracing.active  # None: off

    def bisect(self, batch: SlotBatch) -> None:
        """Run the halves apart, first at the head of the queue: one bad request must not fail the others."""
        first, second = batch.split(self.batch_ids)
        log.info(
            "batch %d of model %s: the model refused it; split into batches %d and %d to find the request it refuses",
            batch.batch_id,
            batch.model.key,
            first.batch_id,
            second.batch_id,
            extra=batch.log_fields(),
        )
        if batch.span is not None:
            self.tracing.batch_split(batch, (first, second))
        self.queue_head(batch.model.key, first, second)

    def expiry_error(self, request: InferRequest) -> GatewayError:
        waited_s = time.monotonic() - request.enqueued_at
        if request.held and not self.fleet.ready_workers(request.model.key):
            return Unavailable(
                f"no inference worker became ready within {waited_s:.1f} s ({self.fleet.summary()}); retry shortly",
                self.settings.retry_after_s,
            )
        return DeadlineExceeded(waited_s)

    def detach(self, batch: SlotBatch) -> None:
        batch.worker.in_flight.pop(batch.batch_id, None)
        if batch.detached:  # (a stream past its execute: it took no turn of the worker's)
            batch.worker.detached -= 1
            batch.detached = False
        self.batches.pop(batch.batch_id, None)
        batch.worker = None
        batch.slot.running = False

    def fail_batch(self, batch: SlotBatch, error: GatewayError) -> None:
        if batch.span is not None:
            self.tracing.batch_failed(batch, error)
        for request in batch.requests:
            self.finish(request, error=error)
        self.end_batch(batch)

    def end_batch(self, batch: SlotBatch) -> None:
        if batch.span is not None:
            self.tracing.batch_ended(batch)
        batch.slot.open_batches -= 1
        if batch.slot.open_batches == 0:
            self.ring.release(batch.slot.lease)

    # -- worker deaths, bisection, quarantine ---------------------------------------------
    def requeue_all(self, worker: WorkerHandle, reason: str | None) -> None:
        """Put every batch the worker held back in its queue; blame only the one it was running.

        A worker runs batches in the order they were sent, so the oldest unanswered one whose
        outputs it had not finished was running; those before it finished (their Result died
        with the worker, or waits unread behind the supervisor's news of the death) and those
        after it waited in its inbox: neither caused anything. When it had finished them all,
        it died after the newest, and that one is blamed.
        """
        held = list(worker.in_flight.values())
        running = next((batch for batch in held if not self._finished(batch)), held[-1] if held else None)
        # Newest first: each goes to the head, so the oldest ends up running first again.
        for batch in reversed(held):
            self.detach(batch)
            self.requeue(batch, reason if batch is running else None)

    def _finished(self, batch: SlotBatch) -> bool:
        """Did the worker write all of the batch's outputs? Its output generation says so (shm/layout.py):
        the scheduler zeroes it before a batch is sent again or a half follows another in the slot. A
        decoupled model's batch vouches for each response, not for its end: it counts as finished once its
        execute returned (EXECUTED), as its stream then runs on the model's threads, not on the batch loop."""
        lease = batch.slot.lease
        if batch.model.decoupled:
            return batch.detached
        return self.ring.segment.output_generation(lease.index) == lease.generation

    def requeue(self, batch: SlotBatch, reason: str | None) -> None:
        """Put a batch back at the head of its queue; `reason` counts as a crash it caused."""
        name = batch.model.key
        self.metrics.batches_requeued.labels(*model_labels(batch.model)).inc()
        if batch.model.decoupled:
            self._end_broken_streams(batch, reason)
        if reason is not None:
            batch.attempt += 1
            batch.crash_reasons.append(reason)
        if batch.span is not None:
            self.tracing.batch_requeued(batch, reason)
        if batch.attempt < self.settings.max_attempts:
            log.info(
                "batch %d of model %s requeued%s (crashes: %d of %d before it is split)",
                batch.batch_id,
                name,
                f" after its worker died ({reason})" if reason else "",
                batch.attempt,
                self.settings.max_attempts,
                extra=batch.log_fields(),
            )
            self.queue_head(name, batch)
        elif all(r.done for r in batch.requests):
            self.end_batch(batch)
        elif len(batch.requests) == 1:
            request_id = batch.requests[0].request_id or None  # ("": a request made in a test, not over HTTP)
            log.error(
                "model %s: request isolated: it crashed the worker alone (%s)",
                name,
                reason,
                extra={**batch.log_fields(), "request_id": request_id},
            )
            self.metrics.poison_requests.labels(*model_labels(batch.model)).inc()
            self.fail_batch(batch, WorkerCrashed(reason or "unknown"))
            self._count_poison(name, reason, request_id)
        else:
            first, second = batch.split(self.batch_ids)
            log.info(
                "batch %d of model %s crashed its worker %d times (last: %s); split into batches %d and %d to "
                "find the request that does",
                batch.batch_id,
                name,
                batch.attempt,
                reason,
                first.batch_id,
                second.batch_id,
                extra=batch.log_fields(),
            )
            if batch.span is not None:
                self.tracing.batch_split(batch, (first, second))
            # The crash already repeated: the halves split again after one more crash.
            first.attempt = second.attempt = self.settings.max_attempts - 1
            self.queue_head(name, first, second)

    def _end_broken_streams(self, batch: SlotBatch, reason: str | None) -> None:
        """A decoupled batch's requests that had responses sent: not run again (the client has them),
        their streams end with the error; the others run again with the batch."""
        for request in batch.requests:
            if request.streamed and not request.done:
                self.finish(request, error=StreamBroken(batch.model.name, request.streamed, reason or "unknown"))

    def quarantine(self, model: str, why: str) -> None:
        """Stop serving `model`: everything queued for it gets 503 now, other models go on."""
        if model in self.quarantined or model not in self.queues:
            return
        self.quarantined[model] = why
        log.error("model %s is quarantined: %s", model, why)
        self.fail_queue(model, Unavailable(f"model {model!r} is quarantined: {why}", self.settings.retry_after_s))

    def lift_quarantine(self, model: str) -> bool:
        """A repository load (here or through another gateway): serve `model` again, and count its poison
        requests from zero, so that the next one is the first of a new count, not one past the bound."""
        self._poison_times.pop(model, None)
        return self.quarantined.pop(model, None) is not None

    def _count_poison(self, model: str, reason: str | None, request_id: str | None = None) -> None:
        now = time.monotonic()
        window = self.settings.quarantine_window_s
        times = [t for t in self._poison_times.get(model, []) if now - t < window] + [now]
        self._poison_times[model] = times
        self.poison_requests.setdefault(model, deque(maxlen=POISON_REQUESTS_KEPT)).append(
            {"request_id": request_id, "reason": reason or "unknown", "time": round(time.time(), 3)}
        )
        tell = self.tell_supervisor
        if tell is not None:  # counted server-wide too: poison requests through every gateway add up
            tell(QuarantineModel(model, reason or "unknown", poison_request=True, request_id=request_id))
        if len(times) >= self.settings.quarantine_poison_requests and model not in self.quarantined:
            why = poison_quarantine_reason(len(times), window, reason, request_id)
            self.quarantine(model, why)  # here at once; the other gateways through the supervisor
            if tell is not None:
                tell(QuarantineModel(model, why))

    def fail_queue(self, model: str, error: GatewayError) -> None:
        """Answer everything queued for `model` (a model key) with `error`."""
        queue = self.queues[model]
        for request in queue.drain_all():
            self.finish(request, error=error)
        while queue.requeued:
            self.fail_batch(queue.requeued.popleft(), error)

    def queue_head(self, model: str, *batches: SlotBatch) -> None:
        queue = self.queues[model]
        for batch in reversed(batches):
            queue.requeued.appendleft(batch)
        now = time.monotonic()
        for batch in batches:
            for request in batch.requests:
                if request.done:
                    continue
                if now >= request.deadline:
                    log.info(
                        "model %s: a request of batch %d expired while the batch waited to run again",
                        model,
                        batch.batch_id,
                        extra={"request_id": request.request_id},
                    )
                    self.finish(request, error=self.expiry_error(request))
                else:
                    self.deadlines.watch(queue, request)


def poison_quarantine_reason(count: int, window_s: float, last: str | None, request_id: str | None = None) -> str:
    """Why a model is quarantined for its poison requests (here, and in the supervisor's count)."""
    which = f", request id {request_id}" if request_id else ""
    return (
        f"{count} of its requests crashed the worker on their own within {window_s:.0f} s (last: {last}{which}); "
        "restart the server or load it again to retry it"
    )
