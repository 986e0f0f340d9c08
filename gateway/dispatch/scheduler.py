"""Scheduling: accepted requests into queues, batches to idle workers, replies back to the requests.

Three parts: admission (dispatch/admission.py: is the model available, into its queue, deadlines),
batch forming and sending (here: the pump, the slot, the worker), and replies (dispatch/replies.py:
results, streamed responses and errors back to each request). The Scheduler holds the other two as
objects, each handed the parts it reads, and passes their entry points on as its own. Runs in the
gateway's event loop. Every batch in flight is recorded on the worker that
holds it (MLServer's in-flight map), so when a worker dies its batches are found exactly;
what then happens to them (requeue, bisection, quarantine) is gateway/dispatch/recovery.py's.

Below it: catalog.py (configs and queues), fleet.py (the worker processes and what they
hold), batching/queues.py (a queue's lanes and policy), batching/deadlines.py (the per-queue
deadline timers), batching/slots.py (writing and splitting batches in their slot), answers.py (each
request answered once), and worker_port.py (the sockets as the scheduler sees them: link.py, or a fake).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time

from ringserve.common import tracing
from ringserve.common.exits import REASON_BATCH_TIMEOUT
from ringserve.common.messages import Batch as BatchMessage
from ringserve.common.messages import Load, Unload
from ringserve.common.repository.config import ModelConfig
from ringserve.common.supervisor_messages import KillWorker, Unquarantine, WorkerRetired
from ringserve.gateway.batching.deadlines import DeadlineWatch
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slots import (
    SlotBatch,
    SlotUse,
    request_infos,
    write_batch,
)
from ringserve.gateway.core.errors import (
    BatchWriteFailed,
    ClientDisconnected,
)
from ringserve.gateway.core.regions import RegionReadFailed
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.admission import Admission
from ringserve.gateway.dispatch.answers import Answers
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery
from ringserve.gateway.dispatch.replies import Replies
from ringserve.gateway.dispatch.worker_port import WorkerPort
from ringserve.gateway.observe.metrics import Metrics, model_labels
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment

log = logging.getLogger(__name__)

LOAD_RETRY_S = 0.05  # a worker's loader thread not connected yet: ask again this much later


def _not_admitting(*args: object) -> None:
    raise RuntimeError("a deadline expired before the scheduler made its admission")


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
        self.answers = Answers(metrics)
        self.finish = self.answers.finish
        self.deadlines = DeadlineWatch(_not_admitting)  # (admission's expire, once it is made: below)
        self.batches: dict[int, SlotBatch] = {}
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
        self.admission = Admission(
            settings=settings,
            catalog=catalog,
            fleet=fleet,
            recovery=self.recovery,
            answers=self.answers,
            deadlines=self.deadlines,
            pump_soon=self.pump_soon,
        )
        self.deadlines.expire = self.admission.expire
        self.replies = Replies(
            settings=settings,
            catalog=catalog,
            fleet=fleet,
            segment=segment,
            metrics=metrics,
            statistics=statistics,
            recovery=self.recovery,
            answers=self.answers,
            batches=self.batches,
            pump_soon=self.pump_soon,
            tell_retired=self.tell_retired,
        )
        # Their entry points, as the scheduler's (the dispatcher routes requests and worker messages to them):
        self.submit, self.check_available = self.admission.submit, self.admission.check_available
        self.on_reply, self.on_stream = self.replies.on_reply, self.replies.on_stream
        self.on_executed, self.cancel = self.replies.on_executed, self.replies.cancel
        catalog.stores.finish, catalog.stores.pump_soon = self.finish, self.pump_soon  # sequence models' queues

    @property
    def draining(self) -> bool:
        """The gateway drains: new requests get 503 (admission's), readiness goes false."""
        return self.admission.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.admission.draining = value

    def attach(self, loop: asyncio.AbstractEventLoop, port: WorkerPort) -> None:
        """Start scheduling on `loop`, sending through `port` (gateway/dispatch/link.py, or a test's fake)."""
        self.loop = self.deadlines.loop = loop
        self.port = port
        self.replies.attach(loop, port)
        self.recovery.tell_supervisor = port.tell_supervisor  # poison requests and quarantines, for every gateway

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
            and len(w.in_flight) - w.detached < self.settings.max_inflight_per_worker
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
            # A finished run (or the other half's) left the slot's output generation vouching for this
            # batch: zeroed, it vouches for this run only (Recovery.requeue_all reads it after a death).
            self.segment.set_output_generation(batch.slot.lease.index, 0)
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
                    extra={"request_ids": [r.request_id for r in requests]},
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
            [r.request_id for r in batch.requests],
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
        if batch.model.decoupled:
            self.replies.watch_streams(batch)
        if not self.port.send_batch(worker.index, worker.generation, message):  # its socket is gone
            log.warning(
                "worker %d unreachable; requeueing batch %d", worker.index, batch.batch_id, extra=batch.log_fields()
            )
            worker.state = "dead"
            self.recovery.requeue_all(worker, reason=None)

    def _check_batch_timeout(self, batch: SlotBatch, attempt: int, generation: int) -> None:
        worker = batch.worker
        if worker is None or batch.attempt != attempt or worker.generation != generation or batch.detached:
            return  # answered, or already requeued; or its execute returned (its stream has its deadlines)
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

    def lift_quarantine(self, model: str) -> bool:
        """A repository load lifts the gateway's quarantine, and the supervisor's (crashes while
        loading), which also replaces the workers so that they load the model again."""
        if not self.recovery.lift_quarantine(model):
            return False
        self.port.tell_supervisor(Unquarantine(model))
        return True
