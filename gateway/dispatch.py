"""Dispatch: batches to ready workers over ZeroMQ, replies back to the waiting requests.

Runs in the gateway's event loop. Every batch in flight is recorded on the worker that
holds it (MLServer's in-flight map), so when the supervisor reports a death the
dispatcher knows exactly which batches to put back: at the head of their queue,
attempt + 1, same slot. A batch that killed workers `max_attempts` times is split in
halves until the request that kills a worker on its own is found; only it fails.

Beside it: gateway/workers.py tracks the worker processes (READY, replacement, standby),
gateway/reload.py applies a reload's configs, gateway/models.py the model versions.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from ringserve.common import wire
from ringserve.common.config import ModelConfig
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment

from .batcher import Batch, ModelQueue, SlotUse, split_outputs, write_batch
from .codec import InferRequest
from .errors import (BatchWriteFailed, ClientDisconnected, DeadlineExceeded, GatewayError, ModelExecutionFailed,
                     Unavailable, WorkerCrashed)
from .metrics import Metrics
from .models import ModelStates
from .reload import RepositoryReload
from .workers import WorkerHandle, WorkerRegistry
from .zmq_reader import ZmqReader

log = logging.getLogger(__name__)

TIMER_SLACK_S = 0.001  # asyncio/uvloop timers have millisecond resolution
DEADLINE_HEAP_SLACK = 1024  # a queue's deadline heap is rebuilt past this size when mostly answered


@dataclass(frozen=True)
class DispatchSettings:
    request_timeout_s: float = 30.0
    max_attempts: int = 2  # a batch that killed this many workers is bisected
    max_inflight_per_worker: int = 2  # pipelining: the next batch is in the slot while one computes
    retry_after_s: int = 1
    batch_timeout_s: float = 0.0  # 0 = off; else a batch running longer gets its worker killed
    hold_when_unavailable_s: float = 0.0  # 0 = 503 at once while no worker is ready
    quarantine_poison_requests: int = 3  # this many requests isolated as poison...
    quarantine_window_s: float = 60.0  # ...within this window quarantine their model
    active_workers: int = 0  # 0: every ready worker serves; N: N serve, the other ready ones stand by


class Dispatcher:
    """Queues accepted requests, sends their batches to idle workers, and answers each request once."""

    def __init__(self, *, segment: Segment, configs: dict[str, ModelConfig], runtime_dir: str,
                 metrics: Metrics, settings: DispatchSettings) -> None:
        self.segment = segment
        self.ring = Ring(segment)
        self.configs = configs
        self.queues = {name: ModelQueue(cfg, segment.data_capacity) for name, cfg in configs.items()}
        self.runtime_dir = runtime_dir
        self.metrics = metrics
        self.settings = settings
        self.registry = WorkerRegistry(self)  # the worker processes: serving, successors, retiring
        self.batches: dict[int, Batch] = {}
        self.draining = False
        self.statistics = None  # gateway.stats.Statistics, set by the HTTP layer that serves it
        self.quarantined: dict[str, str] = {}  # model -> why
        self._ordering: dict[str, deque[InferRequest]] = {}  # preserve_ordering models: arrival order
        self._poison_times: dict[str, list[float]] = {}
        self._batch_ids = itertools.count(1)
        self._pump_scheduled = False
        self._deadline_seq = itertools.count()
        self._context = zmq.Context.instance()
        self._readers: list[ZmqReader] = []
        self.reload = RepositoryReload(self)  # a reload's configs, until they apply
        # Versions, model states per worker, lazy loads. Queues and the other maps are by model
        # key: 'm' for the default version, 'm/2' for version 2 (ModelConfig.key).
        self.models = ModelStates(self)

    # The registry's maps, as routes, metrics, gateway/models.py and the tests read them.
    @property
    def workers(self) -> dict[int, WorkerHandle]:
        return self.registry.workers

    @property
    def successors(self) -> dict[int, WorkerHandle]:
        return self.registry.successors

    @property
    def retiring(self) -> dict[bytes, WorkerHandle]:
        return self.registry.retiring

    @property
    def _reload_configs(self) -> dict[str, ModelConfig] | None:
        return self.reload.configs  # (a test waits on it)

    # -- lifetime -------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.router = self._context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(wire.endpoint(self.runtime_dir, "dispatch"))
        events = self._context.socket(zmq.PULL)
        events.bind(wire.endpoint(self.runtime_dir, "events"))
        self.control = self._context.socket(zmq.PUSH)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.connect(wire.endpoint(self.runtime_dir, "control"))
        self._readers = [ZmqReader(loop, self.router, self.on_worker_message),
                         ZmqReader(loop, events, self.on_supervisor_event)]

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        self.control.close(linger=0)

    # -- requests -------------------------------------------------------------------
    def ready_workers(self, model: str | None = None) -> list[WorkerHandle]:
        return self.registry.ready_workers(model)

    def check_available(self, model: str) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down; send the request to another replica",
                              self.settings.retry_after_s)
        if model in self.quarantined:
            raise Unavailable(f"model {model!r} is quarantined: {self.quarantined[model]}",
                              self.settings.retry_after_s)
        for worker in self.workers.values():
            if worker.state == "ready" and model in worker.models and not worker.standby:
                return
        if self.registry.fill_active():
            return self.check_available(model)
        failed = {w.failed_models[model] for w in self.workers.values() if model in w.failed_models}
        if failed and self.ready_workers():
            raise Unavailable(f"model {model!r} is not available: it failed to load ({'; '.join(sorted(failed))})",
                              self.settings.retry_after_s)
        raise Unavailable(f"no inference worker is ready for model {model!r} ({self.registry.summary()}); "
                          "retry shortly", self.settings.retry_after_s)

    def submit(self, request: InferRequest) -> None:
        """Queue an accepted request; its future gets exactly one result or GatewayError."""
        if request.model.name in self.reload.pending:
            self.reload.swap_if_idle(request.model.name)  # a reload changed this model's config
        now = time.monotonic()
        hard_timeout_s = self.settings.request_timeout_s
        try:
            self.check_available(request.model.key)
        except Unavailable:
            if not self._may_hold(request.model.key):
                raise
            request.held = True  # a worker is restarting: wait for it, up to the hold bound
            hard_timeout_s = min(hard_timeout_s, self.settings.hold_when_unavailable_s)
        queue = self.queues[request.model.key]
        request.enqueued_at = now
        queue.submit(request)  # may refuse: queue full
        request.hard_deadline = now + hard_timeout_s
        request.deadline = min(request.hard_deadline, now + self._policy_timeout_s(queue, request))
        if request.held or request.timeout_us:
            self._watch_deadline(queue, request)  # a deadline earlier than its lane's order: in the heap
        elif queue.deadline_timer is None:
            self._arm_deadline(queue, request.deadline)  # nothing else waits (the timer is armed while any does)
        if queue.batching.preserve_ordering:
            self._ordering.setdefault(request.model.key, deque()).append(request)
        self.pump_soon()

    @staticmethod
    def _policy_timeout_s(queue: ModelQueue, request: InferRequest) -> float:
        """Triton's queue policy: the default timeout, which a request may only lower (if allowed)."""
        policy = queue.policy_of(request)
        timeout_us = policy.default_timeout_us
        if request.timeout_us and policy.allow_timeout_override:
            timeout_us = min(timeout_us, request.timeout_us) if timeout_us else request.timeout_us
        return timeout_us / 1e6 if timeout_us else float("inf")

    def _may_hold(self, model: str) -> bool:
        return (self.settings.hold_when_unavailable_s > 0 and not self.draining
                and model not in self.quarantined and bool(self.workers))

    def _finish(self, request: InferRequest, result: Any = None, error: GatewayError | None = None,
                latency_s: float | None = None) -> None:
        if request.done:
            return
        request.done = True
        if request.enqueued_at:
            if latency_s is None:
                latency_s = time.monotonic() - request.enqueued_at
            self.metrics.request_seconds.observe(request.model.name, latency_s)
        request.outcome = (result, error)
        order = self._ordering.get(request.model.key)
        if order is None:
            self._answer(request)
            return
        # preserve_ordering: answer in arrival order; a finished request waits for those before it.
        while order and order[0].done:
            self._answer(order.popleft())

    @staticmethod
    def _answer(request: InferRequest) -> None:
        result, error = request.outcome
        if not request.future.done():
            if error is not None:
                request.future.set_exception(error)
            else:
                request.future.set_result(result)

    # Deadlines: one loop timer per queue, armed for its earliest waiting deadline, not a timer
    # per request (armed and cancelled, it cost ~3 us of the gateway's ~190 per request: issue
    # 8's profile). Requests with their level's default timeout need no bookkeeping at all: in
    # each FIFO lane their deadlines rise with arrival, so the earliest is a lane's head. Only
    # the exceptions, whose deadline is earlier than their place in the lane says (a lowered
    # per-request timeout, a request held while no worker was ready) or that left the lanes (a
    # DELAYed one, one in a requeued batch), go into a heap; its entries of answered requests
    # are dropped as they come up, or in a rebuild once they outnumber the waiting ones.
    def _watch_deadline(self, queue: ModelQueue, request: InferRequest) -> None:
        heap = queue.deadlines
        heapq.heappush(heap, (request.deadline, next(self._deadline_seq), request))
        if request.deadline < queue.deadline_at:
            self._arm_deadline(queue, request.deadline)
        if len(heap) > DEADLINE_HEAP_SLACK and len(heap) > 4 * (queue.depth + len(queue.requeued)):
            heap[:] = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)

    def _arm_deadline(self, queue: ModelQueue, when: float) -> None:
        if queue.deadline_timer is not None:
            queue.deadline_timer.cancel()
        queue.deadline_at = when
        queue.deadline_timer = self.loop.call_at(when, self._deadlines_due, queue)

    def _deadlines_due(self, queue: ModelQueue) -> None:
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
            self._expire(queue, request)
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        earliest = min((lane[0].deadline for lane in queue.live_lanes() if lane), default=float("inf"))
        if heap:
            earliest = min(earliest, heap[0][0])
        if earliest != float("inf"):
            self._arm_deadline(queue, earliest)

    def _expire(self, queue: ModelQueue, request: InferRequest) -> None:
        """Deadline passed: 504 (REJECT) or to the back of its group (DELAY), unless it is running."""
        if request.done:
            return
        if (time.monotonic() < request.hard_deadline and queue.policy_of(request).timeout_action == "DELAY"
                and queue.delay(request)):
            request.deadline = request.hard_deadline
            self._watch_deadline(queue, request)  # out of the live lane: the heap watches it now
            return
        if queue.discard(request) or any(request in b.requests for b in queue.requeued):
            self._finish(request, error=self._expiry_error(request))
        # else running on a worker: its batch answers it, or its death requeues it (_queue_head)

    def _expiry_error(self, request: InferRequest) -> GatewayError:
        waited_s = time.monotonic() - request.enqueued_at
        if request.held and not self.ready_workers(request.model.key):
            return Unavailable(f"no inference worker became ready within {waited_s:.1f} s "
                               f"({self.registry.summary()}); retry shortly", self.settings.retry_after_s)
        return DeadlineExceeded(waited_s)

    # -- scheduling -----------------------------------------------------------------
    def pump_soon(self) -> None:
        """Pump once at the end of this event-loop step, not at each request or reply.

        Still work-conserving (no timer: the step ends within microseconds), but every
        request parsed in this step joins the same batch. Pumping at each submit sent a
        batch as soon as a worker had room, however small: at 64 clients the mean batch
        was 6.4 rows, and each batch costs the gateway a BATCH/RESULT exchange, a slot
        write and a split. (Issue 8's profile.)
        """
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def pump(self) -> None:
        """Send batches while some ready worker has room and some queue has work."""
        sent = True
        while sent:
            sent = False
            for queue in self.queues.values():
                if not (queue.requeued or queue.depth):
                    continue
                worker = self._idle_worker(queue.config.key)
                if worker is None:
                    continue
                batch = self._next_batch(queue)
                if batch is not None:
                    self._send(worker, batch)
                    sent = True

    def _idle_worker(self, model: str) -> WorkerHandle | None:
        candidates = [w for w in self.workers.values()
                      if w.state == "ready" and not w.standby and model in w.models
                      and len(w.in_flight) < self.settings.max_inflight_per_worker]
        return self.models.pick_worker(model, candidates) if candidates else None

    def _next_batch(self, queue: ModelQueue) -> Batch | None:
        for batch in queue.requeued:
            if not batch.slot.running:
                queue.requeued.remove(batch)
                if all(r.done for r in batch.requests):
                    self._end_batch(batch)
                    return self._next_batch(queue)
                if batch.rewrite:  # a half whose inputs are not a range of the slot's (Batch.split)
                    batch.requests = [r for r in batch.requests if not r.done]
                    written = self._write(batch.slot.lease, batch.requests, queue.config.name)
                    if written is None:
                        self._end_batch(batch)
                        return self._next_batch(queue)
                    batch.inputs, batch.output_offset = written
                return batch
        if not queue.depth:
            return None
        due = queue.flush_due(time.monotonic())
        if due is not None:
            if queue.flush_timer is None:
                queue.flush_timer = self.loop.call_at(due, self._flush_timer_fired, queue)
            return None
        lease = self.ring.acquire()
        if lease is None:
            return None  # every slot is busy; a finishing batch pumps again
        requests = queue.collect_batch(self._prune)
        if not requests:  # every candidate was a ghost
            self.ring.release(lease)
            return None
        written = self._write(lease, requests, queue.config.name)
        if written is None:
            self.ring.release(lease)
            return self._next_batch(queue)
        refs, output_offset = written
        batch = Batch(next(self._batch_ids), queue.config, requests, SlotUse(lease), refs, output_offset)
        self.metrics.observe_batch(queue.config, requests, refs, time.monotonic())
        return batch

    def _write(self, lease, requests: list[InferRequest], model: str) -> tuple[list, int] | None:
        """write_batch; should it ever raise, its requests get a 500 rather than wait forever."""
        try:
            return write_batch(self.segment, lease, requests)
        except Exception as exc:  # noqa: BLE001 - every accepted request gets exactly one answer
            log.exception("model %s: writing a batch of %d request(s) into slot %d failed", model, len(requests),
                          lease.index)
            for request in requests:
                self._finish(request, error=BatchWriteFailed(model, f"{type(exc).__name__}: {exc}"))
            return None

    def _prune(self, request: InferRequest) -> bool:
        """Ghost requests leave before their batch forms: they never cost inference."""
        now = time.monotonic()
        if request.disconnected is not None and request.disconnected():
            reason, error = "disconnected", ClientDisconnected()
        elif now >= request.hard_deadline or (
                now >= request.deadline
                and self.queues[request.model.key].policy_of(request).timeout_action == "REJECT"):
            reason, error = "deadline", self._expiry_error(request)
        else:
            return False  # (a DELAY request past its policy deadline is still served)
        self.metrics.requests_pruned.labels(request.model.name, reason).inc()
        self._finish(request, error=error)
        return True

    def _flush_timer_fired(self, queue: ModelQueue) -> None:
        queue.flush_timer = None
        self.pump()

    def _send(self, worker: WorkerHandle, batch: Batch) -> None:
        body = {
            "batch_id": batch.batch_id, "model": batch.model.name, "version": batch.model.version,
            "attempt": batch.attempt,
            "slot": batch.slot.lease.index, "generation": batch.slot.lease.generation,
            "inputs": [ref.to_wire() for ref in batch.inputs], "output_offset": batch.output_offset,
        }
        faults = [r.fault for r in batch.requests if r.fault and not r.done]
        if faults:
            body["faults"] = faults
        batch.worker = worker
        batch.slot.running = True
        batch.sent_at = time.monotonic()
        worker.in_flight[batch.batch_id] = batch
        self.batches[batch.batch_id] = batch
        if self.settings.batch_timeout_s > 0:
            self.loop.call_at(batch.sent_at + self.settings.batch_timeout_s, self._check_batch_timeout,
                              batch, batch.attempt, worker.generation)
        try:
            self.router.send_multipart([worker.identity, *wire.encode("BATCH", body)])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the worker's socket is gone
            log.warning("worker %d unreachable (%s); requeueing batch %d", worker.index, exc, batch.batch_id)
            worker.state = "dead"
            self.requeue_all(worker, reason=None)
        self.loop.call_soon(self._readers[0].drain)

    def tell_supervisor(self, kind: wire.Kind, body: dict[str, Any]) -> None:
        """A control message (KILL_WORKER, WORKER_RETIRED, UNQUARANTINE); never blocks the loop."""
        try:
            self.control.send_multipart(wire.encode(kind, body), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.error("cannot send %s %s to the supervisor: %s", kind, body, exc)

    def _check_batch_timeout(self, batch: Batch, attempt: int, generation: int) -> None:
        worker = batch.worker
        if worker is None or batch.attempt != attempt or worker.generation != generation:
            return  # answered, or already requeued
        log.error("batch %d of model %s ran over %.1f s on worker %d; asking the supervisor to kill it",
                  batch.batch_id, batch.model.name, self.settings.batch_timeout_s, worker.index)
        self.tell_supervisor("KILL_WORKER", {"worker": worker.index, "generation": generation,
                                             "reason": "batch_timeout"})

    # -- replies --------------------------------------------------------------------
    def on_worker_message(self, frames: list[bytes]) -> None:
        identity, *rest = frames
        kind, body = wire.decode(rest)
        index, generation = wire.parse_worker_identity(identity)
        if kind == "READY":
            self.registry.on_ready(index, generation, body)
            return
        worker = self.registry.handle(index, generation)
        if kind == "MODEL_STATE":
            self.models.on_model_state(worker, body)
            return
        batch = self.batches.get(body.get("batch_id"))
        if (worker is None or worker.generation != generation or batch is None
                or batch.worker is not worker or batch.attempt != body.get("attempt")):
            log.info("ignoring %s from worker %d generation %d (stale)", kind, index, generation)
            return
        self._detach(batch)
        worker.batches_done += 1
        if kind == "RESULT":
            self._on_result(batch, body)
        elif kind == "ERROR":
            self._on_error(batch, body)
        if worker.state == "retiring":
            self.registry.retire_if_idle(worker)
        self.pump_soon()

    def _detach(self, batch: Batch) -> None:
        batch.worker.in_flight.pop(batch.batch_id, None)
        self.batches.pop(batch.batch_id, None)
        batch.worker = None
        batch.slot.running = False

    def _on_result(self, batch: Batch, body: dict[str, Any]) -> None:
        lease = batch.slot.lease
        if self.segment.output_generation(lease.index) != lease.generation:
            log.error("batch %d: slot %d outputs not vouched for; requeueing", batch.batch_id, lease.index)
            self._requeue(batch, reason=None)
            return
        outputs = [wire.TensorRef.from_wire(item) for item in body["outputs"]]
        compute_s = body.get("compute_s", 0.0)
        self.metrics.compute_seconds.labels(batch.model.name).observe(compute_s)
        now = time.monotonic()
        sizer = self.queues[batch.model.key].sizer
        if sizer is not None:
            sizer.observe(now - min(r.enqueued_at for r in batch.requests), batch.rows, body.get("compute_s"))
        answered = answered_rows = 0
        total_latency_s = 0.0
        for request, result in zip(batch.requests, split_outputs(self.segment, batch, outputs)):
            if not request.done:
                latency_s = now - request.enqueued_at
                answered += 1
                answered_rows += request.rows
                total_latency_s += latency_s
                self._finish(request, result=result, latency_s=latency_s)
        if self.statistics is not None:  # Triton's statistics extension: per batch, see gateway/stats.py
            self.statistics.record_batch(batch.model.name, batch.rows, compute_s, answered, answered_rows,
                                         total_latency_s)
        self._end_batch(batch)

    def _on_error(self, batch: Batch, body: dict[str, Any]) -> None:
        if self.models.on_batch_refused(batch, body):
            return  # it never ran: the model could not be loaded
        if len(batch.requests) > 1:
            # One bad request must not fail the others: run the halves apart.
            first, second = batch.split(self._batch_ids)
            self._queue_head(batch.model.key, first, second)
            return
        (request,) = batch.requests
        self._finish(request, error=ModelExecutionFailed(batch.model.name, body.get("error", "unknown error")))
        self._end_batch(batch)

    def _end_batch(self, batch: Batch) -> None:
        batch.slot.open_batches -= 1
        if batch.slot.open_batches == 0:
            self.ring.release(batch.slot.lease)

    # -- supervisor events and worker deaths ------------------------------------------
    def on_supervisor_event(self, frames: list[bytes]) -> None:
        kind, body = wire.decode(frames)
        if kind == "SNAPSHOT":
            for item in body["workers"]:
                self.registry.apply_info(item)
            for model, why in body.get("quarantined", {}).items():
                self.quarantine(model, why)
            return
        if kind == "MODEL_QUARANTINED":
            self.quarantine(body["model"], body["reason"])
            return
        if kind == "MODEL_UNQUARANTINED":  # (after a SNAPSHOT sent before the lift re-applied it)
            self.quarantined.pop(body["model"], None)
            return
        if kind == "RELOAD":
            self.reload.on_reload(body["model_repository"])
            return
        self.registry.on_process_event(kind, body)  # WORKER_STARTED, WORKER_EXITED

    def requeue_all(self, worker: WorkerHandle, reason: str | None) -> None:
        """Put every batch the worker held back in its queue; blame only the one it was running.

        A worker runs batches in the order they were sent, so the oldest unanswered one was
        running; the others (pipelined) were still waiting in its inbox and caused nothing.
        """
        held = list(worker.in_flight.values())
        # Newest first: each goes to the head, so the oldest ends up running first again.
        for position, batch in reversed(list(enumerate(held))):
            self._detach(batch)
            self._requeue(batch, reason if position == 0 else None)

    def _requeue(self, batch: Batch, reason: str | None) -> None:
        """Put a batch back at the head of its queue; `reason` counts as a crash it caused."""
        name = batch.model.key
        self.metrics.batches_requeued.labels(name).inc()
        if reason is not None:
            batch.attempt += 1
            batch.crash_reasons.append(reason)
        if batch.attempt < self.settings.max_attempts:
            self._queue_head(name, batch)
            return
        if all(r.done for r in batch.requests):
            self._end_batch(batch)
            return
        if len(batch.requests) == 1:
            (request,) = batch.requests
            log.error("model %s: request isolated: it crashed the worker alone (%s)", name, reason)
            self.metrics.poison_requests.labels(name).inc()
            self._finish(request, error=WorkerCrashed(reason or "unknown"))
            self._end_batch(batch)
            self._count_poison(name, reason)
            return
        first, second = batch.split(self._batch_ids)
        # The crash already repeated: the halves split again after one more crash.
        first.attempt = second.attempt = self.settings.max_attempts - 1
        self._queue_head(name, first, second)

    def _count_poison(self, model: str, reason: str | None) -> None:
        now = time.monotonic()
        window = self.settings.quarantine_window_s
        times = [t for t in self._poison_times.get(model, []) if now - t < window] + [now]
        self._poison_times[model] = times
        if len(times) >= self.settings.quarantine_poison_requests:
            self.quarantine(model, f"{len(times)} of its requests crashed the worker on their own within "
                                   f"{window:.0f} s (last: {reason}); restart the server to retry it")

    def quarantine(self, model: str, why: str) -> None:
        """Stop serving `model`: everything queued for it gets 503 now, other models go on."""
        if model in self.quarantined or model not in self.queues:
            return
        self.quarantined[model] = why
        log.error("model %s is quarantined: %s", model, why)
        self.fail_queue(model, Unavailable(f"model {model!r} is quarantined: {why}", self.settings.retry_after_s))

    def fail_queue(self, model: str, error: GatewayError) -> None:
        """Answer everything queued for `model` (a model key) with `error`."""
        queue = self.queues[model]
        for request in queue.drain_all():
            self._finish(request, error=error)
        while queue.requeued:
            batch = queue.requeued.popleft()
            for request in batch.requests:
                self._finish(request, error=error)
            self._end_batch(batch)

    def _queue_head(self, model: str, *batches: Batch) -> None:
        queue = self.queues[model]
        for batch in reversed(batches):
            queue.requeued.appendleft(batch)
        now = time.monotonic()
        for batch in batches:
            for request in batch.requests:
                if request.done:
                    continue
                if now >= request.deadline:
                    self._finish(request, error=self._expiry_error(request))
                else:
                    self._watch_deadline(queue, request)

