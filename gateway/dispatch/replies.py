"""Replies: a worker's RESULT, ERROR and streamed responses back to the requests of its batch.

Held by the Scheduler (dispatch/scheduler.py): it matches each reply to the batch in flight on the
generation that holds it (anything else is stale), splits the outputs from the slot, writes those a
client asked into its shared-memory regions, counts Triton's statistics and answers each request once.

Cancellation goes the other way (`cancel`): a request whose client went away is answered at once, and
a Python model running it is told (CANCEL to the worker's courier: its is_cancelled() turns true, and
a decoupled stream stops holding the slot for it). A decoupled request's stream is bounded by the
request's deadline the same way (`watch_streams`). The slot is freed by the batch's RESULT, as always:
only the worker knows when nothing more will be written into it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from ringserve.common.messages import Cancel, Error, Executed, Result, StreamResponse
from ringserve.common.vocabulary import ERROR_KINDS_NOT_RUN
from ringserve.common.wire import BytesTensorRef, TensorRef
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.sequences import commit_answer_states, commit_batch_states
from ringserve.gateway.batching.slot_outputs import read_answers, read_refs, split_outputs
from ringserve.gateway.batching.slots import SlotBatch
from ringserve.gateway.core.errors import (
    ClientDisconnected,
    GatewayError,
    ModelExecutionFailed,
    ModelFailed,
    StreamTimedOut,
    Unavailable,
    model_answer_error,
)
from ringserve.gateway.core.regions import write_outputs
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.answers import Answers
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery
from ringserve.gateway.dispatch.worker_port import WorkerPort
from ringserve.gateway.observe.metrics import Metrics, executed_rows
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.segment import Segment

log = logging.getLogger(__name__)

CANCELLATIONS = (ClientDisconnected, StreamTimedOut)  # what `cancel` answers a request with

# A batch's BYTES outputs are read out of the slot element by element, a Python step each (2 M elements held
# the loop 2 s): past this many bytes of them the read runs in a thread of its own, and the loop answers
# health probes and other requests meanwhile (the interpreter's switch interval is 1 ms in the gateway).
READ_ASIDE_MIN_BYTES = 1 << 20
_READER: list[ThreadPoolExecutor] = []  # (made at its first use)


def _reader() -> ThreadPoolExecutor:
    if not _READER:
        _READER.append(ThreadPoolExecutor(1, thread_name_prefix="ringserve-read"))
    return _READER[0]


def _bytes_output_bytes(outputs: list[TensorRef], answers: list | None) -> int:
    """The bytes of a batch's BYTES outputs (RESULT's outputs, or each request's answer)."""
    refs = outputs if answers is None else [TensorRef.from_wire(item) for answer in answers for item in answer[0]]
    return sum(ref.nbytes for ref in refs if isinstance(ref, BytesTensorRef))


def _read_outcomes(segment: Segment, batch: SlotBatch, outputs: list[TensorRef], answers: list | None) -> list:
    if answers is None:
        return split_outputs(segment, batch, outputs)
    return read_answers(segment, batch, answers)  # a Python model's, an ensemble's


class Replies:
    """The scheduler's way back: on_reply, on_stream, on_executed and cancel. The Scheduler holds it and hands
    it the parts it reads; `pump_soon` and `tell_retired` are the scheduler's, the loop and the worker port
    come with attach()."""

    def __init__(
        self,
        *,
        settings: DispatchSettings,
        catalog: Catalog,
        fleet: Fleet,
        segment: Segment,
        metrics: Metrics,
        statistics: Statistics | None,
        recovery: Recovery,
        answers: Answers,
        batches: dict[int, SlotBatch],
        pump_soon: Callable[[], None],
        tell_retired: Callable[[int, int], None],
    ) -> None:
        self.settings, self.fleet, self.segment, self.metrics = settings, fleet, segment, metrics
        self.statistics = statistics  # Triton's statistics, stamped per batch (None: not kept)
        self.recovery, self.finish, self.end_batch = recovery, answers.finish, recovery.end_batch
        self.queues: dict[str, ModelQueue] = catalog.queues
        self.batches = batches  # in flight, by id (the scheduler's map)
        self.pump_soon, self.tell_retired = pump_soon, tell_retired
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port: WorkerPort | None = None

    def attach(self, loop: asyncio.AbstractEventLoop, port: WorkerPort) -> None:
        self.loop, self.port = loop, port

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
        compute_ns = round(compute_s * 1e9)  # (the worker's clock: its session.run)
        if self.statistics is not None:  # Triton's statistics: what each stamp is, gateway/observe/stats.py
            stats = self.statistics.of(batch.model.name, batch.model.version)
            stages = (stats, batch.formed_ns, batch.written_ns, compute_ns, received_ns)  # (one per batch)
        read = functools.partial(_read_outcomes, self.segment, batch, outputs, answers)
        answer = functools.partial(self._answer, batch, result, now, stats, stages, compute_ns, received_ns)
        if _bytes_output_bytes(outputs, answers) < READ_ASIDE_MIN_BYTES:
            answer(read())
            return
        # (the slot stays the batch's until the read is done and answered: end_batch frees it then)
        asyncio.get_running_loop().run_in_executor(_reader(), read).add_done_callback(
            functools.partial(self._answer_read, read, answer)
        )

    def _answer_read(self, read: Callable[[], list], answer: Callable[[list], None], done: asyncio.Future) -> None:
        try:
            outcomes = done.result()
        except Exception:  # noqa: BLE001 - read again here, where its failure is handled as any reply's
            outcomes = read()
        answer(outcomes)
        self.pump_soon()

    def _answer(
        self,
        batch: SlotBatch,
        result: Result,
        now: float,
        stats: Any,
        stages: Any,
        compute_ns: int,
        received_ns: int,
        outcomes: list,
    ) -> None:
        """Each request of a batch that ran gets its outcome; the slot is freed."""
        finish, rows = self.finish, batch.rows
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
        """One response of a decoupled model's request (worker/python/decoupled.py), passed on as it comes;
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
        lease, streamed = batch.slot.lease, request.streamed
        request.response_parameters, request.response_final = response.parameters, response.final
        if response.error is not None:
            request.streamed += 1
            request.stream(None, model_answer_error(batch.model.name, response.error, response.status))
        elif response.outputs and self.segment.output_generation(lease.index) == lease.generation:
            request.streamed += 1
            request.stream(read_refs(self.segment, lease.index, response.outputs), None)
        if not streamed and request.streamed and self.statistics is not None:
            self.statistics.first_response(request)  # (Triton's time to first response)
        if response.final:
            self.finish(request, result=None)

    def on_executed(self, index: int, generation: int, executed: Executed) -> None:
        """A decoupled batch's execute returned: its stream goes on from the model's threads, and the
        worker may take another batch meanwhile (the stream keeps its slot until its RESULT)."""
        batch = self.batches.get(executed.batch_id)
        worker = self.fleet.handle(index, generation)
        if batch is None or worker is None or batch.worker is not worker or batch.attempt != executed.attempt:
            return  # over already (its RESULT came first: another socket), or stale
        if not batch.detached:
            batch.detached = True
            worker.detached += 1
            self.pump_soon()
        # A CANCEL sent before it ran found no stream in the worker (it keeps a few for later): again, now there is one.
        cancelled = [k for k, r in enumerate(batch.requests) if isinstance(r.outcome[1], CANCELLATIONS)]
        if cancelled and self.port is not None:
            self.port.send_to_courier(index, generation, Cancel(batch.batch_id, batch.attempt, cancelled))

    def cancel(self, request: InferRequest, error: GatewayError) -> None:
        """Answer `request` with `error` now (its client went away, or its stream's deadline passed). Queued,
        it leaves its queue; running on a Python model, the worker is told (CANCEL), so that the model's
        is_cancelled() turns true and a decoupled stream's slot is freed without its final response. Running
        on an ONNX model or an ensemble, it is left to finish: its answer is near, and goes unread."""
        if request.done:
            return
        queue = self.queues.get(request.model.key)
        if queue is not None and queue.discard(request):
            self.finish(request, error=error)
            return
        batch = next((b for b in self.batches.values() if request in b.requests), None)
        if batch is None or batch.worker is None or batch.model.kind != "python":
            if batch is None:  # (waiting in a requeued batch: not run again for it)
                self.finish(request, error=error)
            return
        self.finish(request, error=error)
        worker = cast(WorkerHandle, batch.worker)
        cancel = Cancel(batch.batch_id, batch.attempt, [batch.requests.index(request)])
        if self.port is None or not self.port.send_to_courier(worker.index, worker.generation, cancel):
            log.warning(
                "cannot tell worker %d that a request of batch %d is cancelled",
                worker.index,
                batch.batch_id,
                extra={"request_id": request.request_id},
            )

    def watch_streams(self, batch: SlotBatch) -> None:
        """As a decoupled batch is sent: each request's stream ends at the request's deadline (Triton's
        `timeout` parameter or the model's default_timeout_microseconds from its arrival, at most
        --request-timeout-s), with StreamTimedOut, and its model is told it is cancelled."""
        loop = cast(asyncio.AbstractEventLoop, self.loop)  # (attached before any request)
        for request in batch.requests:
            if not request.done and math.isfinite(request.deadline):
                loop.call_at(request.deadline, self._stream_due, batch, request, batch.attempt)

    def _stream_due(self, batch: SlotBatch, request: InferRequest, attempt: int) -> None:
        if request.done or batch.worker is None or batch.attempt != attempt:
            return  # over, or requeued (sent again, it is watched again)
        timeout_s = request.deadline - request.enqueued_at
        log.info(
            "model %s: a request's stream was still open at its deadline (%.3f s); ending it",
            batch.model.name,
            timeout_s,
            extra={"request_id": request.request_id},
        )
        self.cancel(request, StreamTimedOut(batch.model.name, timeout_s, request.streamed))

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
