"""Replies: a worker's RESULT, ERROR and streamed responses back to the requests of its batch.

Part of the Scheduler (dispatch/scheduler.py): it matches each reply to the batch in flight on the
generation that holds it (anything else is stale), splits the outputs from the slot, writes those a
client asked into its shared-memory regions, counts Triton's statistics and answers each request once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ringserve.common.messages import Error, Result, StreamResponse
from ringserve.common.vocabulary import ERROR_KINDS_NOT_RUN
from ringserve.common.wire import TensorRef
from ringserve.gateway.batching.deadlines import DeadlineWatch
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.sequences import commit_answer_states, commit_batch_states
from ringserve.gateway.batching.slots import (
    SlotBatch,
    read_answers,
    read_refs,
    split_outputs,
)
from ringserve.gateway.core.errors import (
    GatewayError,
    ModelExecutionFailed,
    ModelFailed,
    Unavailable,
    model_answer_error,
)
from ringserve.gateway.core.regions import write_outputs
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.answers import Answers
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery
from ringserve.gateway.observe.metrics import Metrics, executed_rows
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.segment import Segment

log = logging.getLogger(__name__)


class Replies:
    """The scheduler's way back: on_reply and on_stream."""

    # What it reads of the Scheduler it is part of (dispatch/scheduler.py builds them):
    settings: DispatchSettings
    catalog: Catalog
    fleet: Fleet
    segment: Segment
    metrics: Metrics
    queues: dict[str, ModelQueue]
    workers: dict[int, WorkerHandle]
    batches: dict[int, SlotBatch]
    quarantined: dict[str, str]
    recovery: Recovery
    answers: Answers
    deadlines: DeadlineWatch
    statistics: Statistics | None
    draining: bool
    _pending_swaps: dict
    finish: Callable[..., None]
    end_batch: Callable[[SlotBatch], None]
    pump_soon: Callable[[], None]
    tell_retired: Callable[[int, int], None]

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
            if reply.fused == 1 or reply.execution_rows:  # (a fused execution is reported by one of its batches)
                worker.busy_s += reply.compute_s
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
        answers = result.answers
        if batch.model.sequence_batching is not None:  # each step's next state into its entry, before answers
            queue, index = self.queues[batch.model.key], batch.slot.lease.index
            if answers is None:
                outputs = commit_batch_states(self.segment, index, batch.requests, outputs, queue)
            else:
                answers = commit_answer_states(self.segment, index, batch.requests, answers, queue)
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
            if answers is None
            else read_answers(self.segment, batch, answers)
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
            or not 0 <= response.request_index < len(batch.requests)
        ):
            return
        request = batch.requests[response.request_index]
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
