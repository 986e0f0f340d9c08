"""Scheduling: accepted requests into queues, batches to idle workers, replies back to the requests.

Runs in the gateway's event loop. Every batch in flight is recorded on the worker that
holds it (MLServer's in-flight map), so when a worker dies its batches are found exactly;
what then happens to them (requeue, bisection, quarantine) is gateway/dispatch/recovery.py's.

Below it: catalog.py (configs and queues), fleet.py (the worker processes and what they
hold), lanes.py (a queue's lanes and policy), deadlines.py (the per-queue deadline timers),
slots.py (writing and splitting batches in their slot), answers.py (each request answered
once), and port.py (the sockets as the scheduler sees them: gateway/dispatch/link.py, or a fake).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time

from ringserve.common import tracing
from ringserve.common.exits import REASON_BATCH_TIMEOUT
from ringserve.common.messages import (
    ERROR_KINDS_NOT_RUN,
    Error,
    KillWorker,
    Load,
    Result,
    StreamResponse,
    Unload,
    Unquarantine,
    WorkerRetired,
)
from ringserve.common.messages import Batch as BatchMessage
from ringserve.common.repository.config import ModelConfig
from ringserve.common.wire import TensorRef
from ringserve.gateway.batching.deadlines import DeadlineWatch, policy_timeout_s
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slots import (
    SlotBatch,
    SlotUse,
    read_answers,
    read_refs,
    request_infos,
    split_outputs,
    write_batch,
)
from ringserve.gateway.core.errors import (
    BatchWriteFailed,
    ClientDisconnected,
    GatewayError,
    ModelExecutionFailed,
    ModelFailed,
    Unavailable,
    model_answer_error,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.regions import RegionReadFailed, write_outputs
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.answers import Answers
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery
from ringserve.gateway.dispatch.worker_port import WorkerPort
from ringserve.gateway.observe.metrics import Metrics, executed_rows, model_labels
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment

log = logging.getLogger(__name__)

LOAD_RETRY_S = 0.05  # a worker's loader thread not connected yet: ask again this much later


class Scheduler:
    """Queues accepted requests, sends their batches to idle workers, and answers each request once."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        fleet: Fleet,
        segment: Segment,
        metrics: Metrics,
        settings: DispatchSettings,
        statistics: Statistics | None = None,
    ) -> None:
        self.catalog, self.fleet, self.segment, self.metrics, self.settings = catalog, fleet, segment, metrics, settings
        self.ring = Ring(segment)
        self.queues = catalog.queues  # the scheduler holds the maps it reads per request, not their owners
        self.workers = fleet.workers
        self._pending_swaps = catalog.pending
        self.answers = Answers(metrics)
        self.finish = self.answers.finish
        self.deadlines = DeadlineWatch(self.expire)
        self.batches: dict[int, SlotBatch] = {}
        self.draining = False
        self.statistics = statistics  # Triton's statistics, stamped per batch (None: not kept)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port: WorkerPort | None = None
        # From a random 62-bit base: a RESULT of a batch a dead predecessor of this gateway sent can
        # reach this one (the worker ran it on the old ring), and must never match a batch of ours.
        self._batch_ids = itertools.count(secrets.randbits(62))
        self._pump_scheduled = False
        self.tracing = tracing.active  # None: off (the process sets it up before building its parts)
        self.recovery = Recovery(
            queues=self.queues,
            fleet=fleet,
            ring=self.ring,
            metrics=metrics,
            settings=settings,
            finish=self.finish,
            deadlines=self.deadlines,
            batches=self.batches,
            batch_ids=self._batch_ids,
        )
        self.quarantined = self.recovery.quarantined  # model key -> why
        self.end_batch = self.recovery.end_batch

    def attach(self, loop: asyncio.AbstractEventLoop, port: WorkerPort) -> None:
        """Start scheduling on `loop`, sending through `port` (gateway/dispatch/link.py, or a test's fake)."""
        self.loop = self.deadlines.loop = loop
        self.port = port
        self.recovery.tell_supervisor = port.tell_supervisor  # poison requests and quarantines, for every gateway

    # -- requests ---------------------------------------------------------------------------
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
            if not self._may_hold(request.model.key):
                raise
            request.held = True  # a worker is restarting: wait for it, up to the hold bound
            hard_timeout_s = min(hard_timeout_s, self.settings.hold_when_unavailable_s)
        queue = self.queues[request.model.key]
        request.enqueued_at = now
        request.queued_ns = time.perf_counter_ns()  # (Triton's statistics: gateway/observe/stats.py)
        queue.submit(request)  # may refuse: queue full
        request.hard_deadline = now + hard_timeout_s
        request.deadline = min(request.hard_deadline, now + policy_timeout_s(queue, request))
        if request.held or request.timeout_us:
            self.deadlines.watch(queue, request)  # a deadline earlier than its lane's order: in the heap
        elif queue.deadline_timer is None:
            self.deadlines.arm(queue, request.deadline)  # nothing else waits (the timer is armed while any does)
        if queue.batching.preserve_ordering:
            self.answers.keep_order(request)
        self.pump_soon()

    def _may_hold(self, model: str) -> bool:
        return (
            self.settings.hold_when_unavailable_s > 0
            and not self.draining
            and model not in self.quarantined
            and bool(self.workers)
        )

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
                "model %s: a request expired in the queue", queue.config.key, extra={"request_id": request.x_request_id}
            )
            self.finish(request, error=self.recovery.expiry_error(request))
        # else running on a worker: its batch answers it, or its death requeues it (_queue_head)

    # -- sending batches --------------------------------------------------------------------
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
        candidates = [
            w
            for w in self.workers.values()
            if w.state == "ready"
            and not w.standby
            and model in w.models
            and len(w.in_flight) < self.settings.max_inflight_per_worker
        ]
        if not candidates:
            return None
        worker, to_load = self.fleet.pick_worker(model, candidates)
        if to_load is not None:
            self.request_load(to_load, self.catalog.config_of(model), "lazy")
        return worker

    def _next_batch(self, queue: ModelQueue) -> SlotBatch | None:
        if queue.requeued:
            batch = self._next_requeued(queue)
            if batch is not None:
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
        formed_ns = time.perf_counter_ns()
        written = self._write(lease, requests, queue.config.name)
        if written is None:
            self.ring.release(lease)
            return self._next_batch(queue)
        refs, output_offset = written
        batch = SlotBatch(
            next(self._batch_ids),
            queue.config,
            requests,
            SlotUse(lease),
            refs,
            output_offset,
            formed_ns=formed_ns,
            written_ns=time.perf_counter_ns(),
        )
        self.metrics.observe_batch(queue.config, requests, refs, time.monotonic())
        if self.tracing is not None:
            self.tracing.batch_formed(batch)
        return batch

    def _next_requeued(self, queue: ModelQueue) -> SlotBatch | None:
        """A batch put back (a dead worker's, a half), unless its slot runs another half now."""
        for batch in queue.requeued:
            if batch.slot.running:
                continue
            queue.requeued.remove(batch)
            if all(r.done for r in batch.requests):
                self.end_batch(batch)
                return self._next_requeued(queue)
            if batch.rewrite:  # a half whose inputs are not a range of the slot's (SlotBatch.split)
                batch.requests = [r for r in batch.requests if not r.done]
                batch.formed_ns = time.perf_counter_ns()
                written = self._write(batch.slot.lease, batch.requests, queue.config.name)
                if written is None:
                    self.end_batch(batch)
                    return self._next_requeued(queue)
                batch.inputs, batch.output_offset = written
                batch.written_ns = time.perf_counter_ns()
            return batch
        return None

    def _write(self, lease, requests: list[InferRequest], model: str) -> tuple[list, int] | None:
        """write_batch; should it ever raise, its requests get a 500 rather than wait forever.

        A request whose input could not be read from its client's shared-memory region (truncated
        since it was accepted) gets its 400 and leaves `requests`; the others are written again."""
        while requests:
            try:
                return write_batch(self.segment, lease, requests)
            except RegionReadFailed as exc:
                failed = next(r for r in requests if any(a is exc.source for a in r.inputs.values()))
                requests.remove(failed)
                self.finish(failed, error=exc)
            except Exception as exc:  # noqa: BLE001 - every accepted request gets exactly one answer
                log.exception(
                    "model %s: writing a batch of %d request(s) into slot %d failed",
                    model,
                    len(requests),
                    lease.index,
                    extra={"request_ids": [r.x_request_id for r in requests]},
                )
                for request in requests:
                    self.finish(request, error=BatchWriteFailed(model, f"{type(exc).__name__}: {exc}"))
                return None
        return None

    def _prune(self, request: InferRequest) -> bool:
        """Ghost requests leave before their batch forms: they never cost inference."""
        now = time.monotonic()
        if request.disconnected is not None and request.disconnected():
            reason, error = "disconnected", ClientDisconnected()
        elif now >= request.hard_deadline or (
            now >= request.deadline and self.queues[request.model.key].policy_of(request).timeout_action == "REJECT"
        ):
            reason, error = "deadline", self.recovery.expiry_error(request)
        else:
            return False  # (a DELAY request past its policy deadline is still served)
        self.metrics.requests_pruned.labels(*model_labels(request.model), reason).inc()
        self.finish(request, error=error)
        return True

    def _flush_timer_fired(self, queue: ModelQueue) -> None:
        queue.flush_timer = None
        self.pump()

    def _send(self, worker: WorkerHandle, batch: SlotBatch) -> None:
        faults = [r.fault for r in batch.requests if r.fault and not r.done]
        lease = batch.slot.lease
        trace = None if batch.span is None else self.tracing.batch_sent(batch, worker.index, worker.generation)
        message = BatchMessage(
            batch.batch_id,
            batch.model.name,
            batch.model.version,
            batch.attempt,
            lease.index,
            lease.generation,
            [ref.to_wire() for ref in batch.inputs],
            batch.output_offset,
            faults,  # ([] rather than None: the worker iterates it either way)
            [r.x_request_id for r in batch.requests],
            trace,  # ids: for the worker's log lines
            request_infos(batch),
        )  # None for an ONNX model
        batch.worker = worker
        batch.slot.running = True
        batch.sent_at = time.monotonic()
        worker.in_flight[batch.batch_id] = batch
        self.batches[batch.batch_id] = batch
        if self.settings.batch_timeout_s > 0:
            self.loop.call_at(
                batch.sent_at + self.settings.batch_timeout_s,
                self._check_batch_timeout,
                batch,
                batch.attempt,
                worker.generation,
            )
        if not self.port.send_batch(worker.index, worker.generation, message):  # its socket is gone
            log.warning(
                "worker %d unreachable; requeueing batch %d", worker.index, batch.batch_id, extra=batch.log_fields()
            )
            worker.state = "dead"
            self.recovery.requeue_all(worker, reason=None)

    def _check_batch_timeout(self, batch: SlotBatch, attempt: int, generation: int) -> None:
        worker = batch.worker
        if worker is None or batch.attempt != attempt or worker.generation != generation:
            return  # answered, or already requeued
        log.error(
            "batch %d of model %s ran over %.1f s on worker %d; asking the supervisor to kill it",
            batch.batch_id,
            batch.model.name,
            self.settings.batch_timeout_s,
            worker.index,
            extra=batch.log_fields(),
        )
        self.port.tell_supervisor(KillWorker(worker.index, generation, REASON_BATCH_TIMEOUT))

    def request_load(self, worker: WorkerHandle, config: ModelConfig, cause: str) -> None:
        if not self.port.send_to_loader(worker.index, worker.generation, Load(config.name, config.version, cause)):
            log.info("cannot ask worker %d to load %s yet; retrying", worker.index, config.key)
            self.loop.call_later(LOAD_RETRY_S, self.pump)
            return
        log.info("asking worker %d to load model %s version %d (%s)", worker.index, config.name, config.version, cause)
        self.fleet.mark_loading(worker, config)

    def request_unload(self, worker: WorkerHandle, config: ModelConfig) -> None:
        if not self.port.send_to_loader(worker.index, worker.generation, Unload(config.name, config.version)):
            log.warning("cannot send UNLOAD of %s to worker %d", config.key, worker.index)

    def tell_retired(self, index: int, generation: int) -> None:
        log.info(
            "worker %d generation %d holds no batch and gets none from here: telling the supervisor", index, generation
        )
        self.port.tell_supervisor(WorkerRetired(index, generation, self.settings.gateway))

    # -- replies ----------------------------------------------------------------------------
    def on_reply(self, index: int, generation: int, reply: Result | Error) -> None:
        """RESULT or ERROR from the generation that holds the batch; anything else is stale."""
        worker = self.fleet.handle(index, generation)
        batch = self.batches.get(reply.batch_id)
        if batch is None:  # not ours: a predecessor's, or already answered (a dead worker's, requeued)
            log.debug(
                "ignoring %s of unknown batch %d from worker %d generation %d",
                reply.KIND,
                reply.batch_id,
                index,
                generation,
            )
            return
        if worker is None or batch.worker is not worker or batch.attempt != reply.attempt:
            log.info("ignoring %s from worker %d generation %d (stale)", reply.KIND, index, generation)
            return
        self.recovery.detach(batch)
        worker.batches_done += 1
        if type(reply) is Result:
            self._on_result(batch, reply)
        else:
            self._on_error(batch, reply)
        if worker.state == "retiring" and self.fleet.retire_if_idle(worker):
            self.tell_retired(worker.index, worker.generation)
        self.pump_soon()

    def _on_result(self, batch: SlotBatch, result: Result) -> None:
        received_ns = time.perf_counter_ns()
        lease = batch.slot.lease
        if self.segment.output_generation(lease.index) != lease.generation:
            log.error(
                "batch %d: slot %d outputs not vouched for; requeueing",
                batch.batch_id,
                lease.index,
                extra=batch.log_fields(),
            )
            self.recovery.requeue(batch, reason=None)
            return
        outputs = [TensorRef.from_wire(item) for item in result.outputs]
        compute_s = result.compute_s
        self.metrics.observe_execution(batch.model, batch, result)
        now = time.monotonic()
        rows = batch.rows
        sizer = self.queues[batch.model.key].sizer
        if sizer is not None:
            sizer.observe(now - min(r.enqueued_at for r in batch.requests), rows, compute_s)
        stats = stages = None
        if self.statistics is not None:  # Triton's statistics: what each stamp is, gateway/observe/stats.py
            stats = self.statistics.of(batch.model.name, batch.model.version)
            compute_ns = round(compute_s * 1e9)  # (the worker's clock: its session.run)
            stages = (stats, batch.formed_ns, batch.written_ns, compute_ns, received_ns)  # (one per batch)
        finish = self.finish
        outcomes = (
            split_outputs(self.segment, batch, outputs)
            if result.answers is None
            else read_answers(self.segment, batch, result.answers)
        )  # a Python model's, an ensemble's
        decoupled = batch.model.decoupled
        for request, outcome in zip(batch.requests, outcomes):
            if type(outcome) is tuple:  # (message, status): the model answered this request with an error
                finish(request, error=model_answer_error(batch.model.name, *outcome))
                continue
            if decoupled:  # its responses went out as they came (on_stream); this ends any still open
                finish(request, result=None)
                continue
            if request.output_regions is not None and not request.done:
                try:  # (from the slot, before end_batch frees it: the one copy of these outputs)
                    write_outputs(outcome, request.output_regions, batch.model)
                except GatewayError as exc:
                    finish(request, error=exc)
            if not request.done:
                request.batch_size = rows  # (the access log's)
                request.stages = stages  # (its front end counts its success once it has answered)
                finish(request, result=outcome, latency_s=now - request.enqueued_at)
        if stats is not None:
            executed = executed_rows(result, batch)
            if executed:
                Statistics.record_execution(
                    stats,
                    executed,
                    batch.written_ns - batch.formed_ns,
                    compute_ns,
                    time.perf_counter_ns() - received_ns,
                )
        self.end_batch(batch)

    def on_stream(self, index: int, generation: int, response: StreamResponse) -> None:
        """One response of a decoupled model's request (worker/decoupled.py), passed on as it comes;
        from any generation but the one that holds the batch, ignored."""
        batch = self.batches.get(response.batch_id)
        worker = self.fleet.handle(index, generation)
        if (
            batch is None
            or worker is None
            or batch.worker is not worker
            or batch.attempt != response.attempt
            or not 0 <= response.request < len(batch.requests)
        ):
            return
        request = batch.requests[response.request]
        if request.done or request.stream is None:
            return
        lease = batch.slot.lease
        if response.error is not None:
            request.streamed += 1
            request.stream(None, model_answer_error(batch.model.name, response.error, response.status))
        elif response.outputs and self.segment.output_generation(lease.index) == lease.generation:
            request.streamed += 1
            request.stream(read_refs(self.segment, lease.index, response.outputs), None)
        if response.final:
            self.finish(request, result=None)

    def _on_error(self, batch: SlotBatch, error: Error) -> None:
        if error.kind in ERROR_KINDS_NOT_RUN:  # never ran (budget, failed load, version not served): no bisection
            refusal = (
                ModelFailed(error.error)
                if error.kind == "load_failed"
                else Unavailable(error.error, self.settings.retry_after_s)
            )
            self.recovery.fail_batch(batch, refusal)
            return
        if len(batch.requests) > 1:
            self.recovery.bisect(batch)
            return
        self.recovery.fail_batch(batch, ModelExecutionFailed(batch.model.name, error.error))

    def lift_quarantine(self, model: str) -> bool:
        """A repository load lifts the gateway's quarantine, and the supervisor's (crashes while
        loading), which also replaces the workers so that they load the model again."""
        if self.recovery.quarantined.pop(model, None) is None:
            return False
        self.port.tell_supervisor(Unquarantine(model))
        return True
