"""Dispatch: batches to ready workers over ZeroMQ, replies back to the waiting requests.

Runs in the gateway's event loop. Every batch in flight is recorded on the worker that
holds it (MLServer's in-flight map), so when the supervisor reports a death the
dispatcher knows exactly which batches to put back: at the head of their queue,
attempt + 1, same slot. A batch that killed workers `max_attempts` times is split in
halves until the request that kills a worker on its own is found; only it fails.

Zero-downtime replacement: while one generation of a worker index serves, the next one
may be starting (`successors`). On its READY it serves that index and the old one goes
to `retiring`: it gets no new batch, finishes the ones it holds, and then the supervisor
is told WORKER_RETIRED and stops it.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from common import wire
from common.config import ModelConfig, scan_repository
from shm.ring import Ring
from shm.segment import Segment

from .batcher import Batch, ModelQueue, SlotUse, split_outputs, write_batch
from .codec import InferRequest
from .errors import (ClientDisconnected, DeadlineExceeded, GatewayError, ModelExecutionFailed, Unavailable,
                     WorkerCrashed)
from .metrics import Metrics
from .models import ModelStates

log = logging.getLogger(__name__)


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


@dataclass(eq=False)
class WorkerHandle:
    """The gateway's view of one worker slot (index) and its current process generation."""

    index: int
    generation: int = -1
    pid: int | None = None
    state: str = "starting"  # starting | ready | retiring | retired | dead
    models: dict[str, str] = field(default_factory=dict)  # model -> execution provider
    failed_models: dict[str, str] = field(default_factory=dict)
    in_flight: dict[int, Batch] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: dict[str, Any] | None = None
    batches_done: int = 0
    rss_bytes: int = 0  # as the supervisor measured it
    replaces: int | None = None  # a successor: the generation it takes over from
    reason: str | None = None  # a successor: why the old one is replaced (reload, recycled, memory)
    standby: bool = False  # ready with its models loaded, but gets no batch until promoted
    model_states: dict[str, Any] = field(default_factory=dict)  # model key -> VersionOnWorker (gateway/models.py)

    @property
    def identity(self) -> bytes:
        return wire.worker_identity(self.index, self.generation)


class ZmqReader:
    """Drains a ZeroMQ socket from the event loop without a future per message.

    The ZMQ fd is edge-triggered and also fires on send, so after each wake-up (and
    after each send) we read until EAGAIN.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, socket: zmq.Socket, handle) -> None:
        self.loop, self.socket, self.handle = loop, socket, handle
        loop.add_reader(socket.getsockopt(zmq.FD), self.drain)

    def drain(self) -> None:
        while self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.handle(frames)
            except Exception:
                log.exception("failed to handle a control message")

    def close(self) -> None:
        self.loop.remove_reader(self.socket.getsockopt(zmq.FD))
        self.socket.close(linger=0)


class Dispatcher:
    def __init__(self, *, segment: Segment, configs: dict[str, ModelConfig], runtime_dir: str,
                 metrics: Metrics, settings: DispatchSettings) -> None:
        self.segment = segment
        self.ring = Ring(segment)
        self.configs = configs
        self.queues = {name: ModelQueue(cfg, segment.data_capacity) for name, cfg in configs.items()}
        self.runtime_dir = runtime_dir
        self.metrics = metrics
        self.settings = settings
        self.workers: dict[int, WorkerHandle] = {}  # index -> the generation that serves it
        self.successors: dict[int, WorkerHandle] = {}  # index -> next generation, starting
        self.retiring: dict[bytes, WorkerHandle] = {}  # identity -> replaced, finishing its batches
        self.batches: dict[int, Batch] = {}
        self.draining = False
        self.statistics = None  # gateway.stats.Statistics, set by the HTTP layer that serves it
        self.quarantined: dict[str, str] = {}  # model -> why
        self._ordering: dict[str, deque[InferRequest]] = {}  # preserve_ordering models: arrival order
        self._poison_times: dict[str, list[float]] = {}
        self._batch_ids = itertools.count(1)
        self._context = zmq.Context.instance()
        self._readers: list[ZmqReader] = []
        self._pump_scheduled = False
        self._reload_configs: dict[str, ModelConfig] | None = None  # re-read on RELOAD, not yet applied
        self._reload_promoted = False  # a worker of the reloaded generation serves
        self._pending_configs: dict[str, ModelConfig | None] = {}  # applied when the model's queue is idle
        # Versions, model states per worker, lazy loads. Queues and the other maps are by model
        # key: 'm' for the default version, 'm/2' for version 2 (ModelConfig.key).
        self.models = ModelStates(self)

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
        return [w for w in self.workers.values()
                if w.state == "ready" and (model is None or model in w.models)]

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
        if self._fill_active():
            return self.check_available(model)
        failed = {w.failed_models[model] for w in self.workers.values() if model in w.failed_models}
        if failed and self.ready_workers():
            raise Unavailable(f"model {model!r} is not available: it failed to load ({'; '.join(sorted(failed))})",
                              self.settings.retry_after_s)
        raise Unavailable(f"no inference worker is ready for model {model!r} ({self._workers_summary()}); "
                          "retry shortly", self.settings.retry_after_s)

    def _workers_summary(self) -> str:
        if not self.workers:
            return "workers are starting"
        parts = []
        for w in self.workers.values():
            why = f" after {w.last_exit['reason']}" if w.last_exit and w.state != "ready" else ""
            parts.append(f"worker {w.index} is {'restarting' if w.state != 'ready' and w.last_exit else w.state}{why}")
        return ", ".join(parts)

    def submit(self, request: InferRequest) -> None:
        """Queue an accepted request; its future gets exactly one result or GatewayError."""
        if request.model.name in self._pending_configs:
            self._swap_config_if_idle(request.model.name)  # a reload changed this model's config
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
        request.timer = self.loop.call_at(request.deadline, self._expire, request)
        if queue.batching.preserve_ordering:
            self._ordering.setdefault(request.model.key, deque()).append(request)
        self.pump()

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

    def _finish(self, request: InferRequest, result: Any = None, error: GatewayError | None = None) -> None:
        if request.done:
            return
        request.done = True
        if request.timer is not None:
            request.timer.cancel()
        if request.enqueued_at:
            self.metrics.request_seconds.labels(request.model.name).observe(time.monotonic() - request.enqueued_at)
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

    def _expire(self, request: InferRequest) -> None:
        """Deadline passed: 504 (REJECT) or to the back of its group (DELAY), unless it is running."""
        request.timer = None
        if request.done:
            return
        queue = self.queues[request.model.key]
        now = time.monotonic()
        if (now < request.hard_deadline and queue.policy_of(request).timeout_action == "DELAY"
                and queue.delay(request)):
            request.deadline = request.hard_deadline
            request.timer = self.loop.call_at(request.deadline, self._expire, request)
            return
        in_requeued = any(request in b.requests for b in queue.requeued)
        if queue.discard(request) or in_requeued:
            self._finish(request, error=self._expiry_error(request))
            return
        # Running on a worker now: its batch answers it, or its death requeues it and we expire then.
        request.timer = self.loop.call_later(0.05, self._expire, request)

    def _expiry_error(self, request: InferRequest) -> GatewayError:
        waited_s = time.monotonic() - request.enqueued_at
        if request.held and not self.ready_workers(request.model.key):
            return Unavailable(f"no inference worker became ready within {waited_s:.1f} s "
                               f"({self._workers_summary()}); retry shortly", self.settings.retry_after_s)
        return DeadlineExceeded(waited_s)

    # -- scheduling -----------------------------------------------------------------
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
        refs, output_offset = write_batch(self.segment, lease, requests)
        batch = Batch(next(self._batch_ids), queue.config, requests, SlotUse(lease), refs, output_offset)
        self.metrics.observe_batch(queue.config, requests, refs, time.monotonic())
        return batch

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
            self._requeue_all(worker, reason=None)
        self.loop.call_soon(self._readers[0].drain)

    def _check_batch_timeout(self, batch: Batch, attempt: int, generation: int) -> None:
        worker = batch.worker
        if worker is None or batch.attempt != attempt or worker.generation != generation:
            return  # answered, or already requeued
        log.error("batch %d of model %s ran over %.1f s on worker %d; asking the supervisor to kill it",
                  batch.batch_id, batch.model.name, self.settings.batch_timeout_s, worker.index)
        self.control.send_multipart(wire.encode("KILL_WORKER", {
            "worker": worker.index, "generation": generation, "reason": "batch_timeout"}), zmq.NOBLOCK)

    # -- replies --------------------------------------------------------------------
    def on_worker_message(self, frames: list[bytes]) -> None:
        identity, *rest = frames
        kind, body = wire.decode(rest)
        index, generation = wire.parse_worker_identity(identity)
        if kind == "READY":
            self._on_ready(index, generation, body)
            return
        worker = self._handle(index, generation)
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
            self._retire_if_idle(worker)
        self.pump()

    def _handle(self, index: int, generation: int) -> WorkerHandle | None:
        """The serving or retiring worker process (index, generation); None for a dead one."""
        worker = self.workers.get(index)
        if worker is not None and worker.generation == generation:
            return worker
        return self.retiring.get(wire.worker_identity(index, generation))

    def _on_ready(self, index: int, generation: int, body: dict[str, Any]) -> None:
        successor = self.successors.get(index)
        if successor is not None and successor.generation == generation:
            del self.successors[index]
            self._promote(successor, body)
            return
        worker = self.workers.setdefault(index, WorkerHandle(index))
        if generation < worker.generation:
            return
        if generation > worker.generation and worker.in_flight:
            self._requeue_all(worker, reason="replaced")
        worker.generation, worker.pid, worker.state = generation, body["pid"], "ready"
        worker.models, worker.failed_models = body["models"], body.get("failed_models", {})
        self.models.on_ready(worker, body)
        worker.standby = self._serving_count(besides=worker) >= self.settings.active_workers > 0
        log.info("worker %d generation %d (pid %d) is ready%s", index, generation, worker.pid,
                 " as a standby" if worker.standby else "")
        self.pump()

    # -- hot standby ---------------------------------------------------------------------
    def _serving_count(self, besides: WorkerHandle | None = None) -> int:
        return sum(1 for w in self.workers.values() if w is not besides and w.state == "ready" and not w.standby)

    def _fill_active(self) -> bool:
        """Promote ready standbys until `active_workers` serve; True if any was promoted.

        A standby has its models loaded: taking over costs nothing but this flag, where a
        restart costs a process start and a model load.
        """
        promoted = False
        for worker in sorted(self.workers.values(), key=lambda w: w.index):
            if self._serving_count() >= self.settings.active_workers:
                break
            if worker.state == "ready" and worker.standby:
                worker.standby = False
                promoted = True
                log.warning("standby worker %d (pid %s) takes over", worker.index, worker.pid)
        return promoted

    # -- zero-downtime replacement ---------------------------------------------------------
    def _promote(self, successor: WorkerHandle, body: dict[str, Any]) -> None:
        """The successor is ready: from now on it gets the batches; the old one finishes what it holds."""
        index = successor.index
        old = self.workers.get(index)
        successor.pid, successor.state = body["pid"], "ready"
        successor.models, successor.failed_models = body["models"], body.get("failed_models", {})
        self.models.on_ready(successor, body)
        if old is not None:
            successor.restarts, successor.last_exit = old.restarts, old.last_exit
            successor.standby = old.standby and old.state == "ready"
        self.workers[index] = successor
        log.info("worker %d generation %d (pid %d) is ready and replaces generation %s (%s)", index,
                 successor.generation, successor.pid, successor.replaces, successor.reason)
        if old is not None and old.generation == successor.replaces and old.state == "ready":
            old.state = "retiring"
            self.retiring[old.identity] = old
            self._retire_if_idle(old)
        else:  # it never became ready, or died meanwhile: it holds nothing
            self._send_retired(index, successor.replaces)
        if successor.reason == "reload":
            self._reload_promoted = True
            self._apply_reload()
        self.pump()

    def _retire_if_idle(self, worker: WorkerHandle) -> None:
        if worker.in_flight:
            return  # its last RESULT (or its death) brings us back
        self.retiring.pop(worker.identity, None)
        worker.state = "retired"
        self._send_retired(worker.index, worker.generation)

    def _send_retired(self, index: int, generation: int | None) -> None:
        if generation is None:
            return
        log.info("worker %d generation %d holds no batch and gets none: asking the supervisor to stop it",
                 index, generation)
        try:
            self.control.send_multipart(wire.encode("WORKER_RETIRED", {"worker": index, "generation": generation}),
                                        zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.error("cannot tell the supervisor that worker %d generation %d retired: %s", index, generation, exc)

    # -- reload: the model repository, read again -------------------------------------------
    def _on_reload(self, repository: str) -> None:
        """Read the repository off the event loop; it applies once a reloaded worker serves."""
        def loaded(future: asyncio.Future) -> None:
            try:
                self._reload_configs = self.models.on_repository_read(future.result())
            except Exception as exc:
                log.error("reload: cannot read the model repository %s (%s); keeping the model configs",
                          repository, exc)
                return
            self._apply_reload()

        self._reload_promoted = False
        self.loop.run_in_executor(None, scan_repository, Path(repository)).add_done_callback(loaded)

    def _apply_reload(self) -> None:
        if self._reload_configs is None or not self._reload_promoted:
            return
        configs, self._reload_configs = self._reload_configs, None
        self.models.apply_pending()
        for name in sorted(self.configs.keys() | configs.keys()):
            if configs.get(name) != self.configs.get(name):
                self._pending_configs[name] = configs.get(name)
                self._swap_config_if_idle(name)

    def _swap_config_if_idle(self, name: str) -> None:
        """A model's new config takes over between batches, so one batch never mixes two configs."""
        queue = self.queues.get(name)
        if queue is not None and (queue.depth or queue.requeued):
            return
        config = self._pending_configs.pop(name)
        if config is None:
            log.info("reload: model %s left the repository", name)
            del self.configs[name]  # its queue stays: requests running now still find it
            return
        log.info("reload: model %s %s", name, "changed" if name in self.configs else "added")
        self.configs[name] = config
        self.queues[name] = ModelQueue(config, self.segment.data_capacity)

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
        self.metrics.compute_seconds.labels(batch.model.name).observe(body.get("compute_s", 0.0))
        if self.statistics is not None:  # Triton's statistics extension: per-batch-size entries
            self.statistics.record_batch(batch.model.name, batch.rows, body.get("compute_s", 0.0))
        sizer = self.queues[batch.model.key].sizer
        if sizer is not None:
            sizer.observe(time.monotonic() - min(r.enqueued_at for r in batch.requests), batch.rows)
        for request, result in zip(batch.requests, split_outputs(self.segment, batch, outputs)):
            self._finish(request, result=result)
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

    # -- worker deaths ----------------------------------------------------------------
    def on_supervisor_event(self, frames: list[bytes]) -> None:
        kind, body = wire.decode(frames)
        if kind == "SNAPSHOT":
            for item in body["workers"]:
                self._apply_worker_info(item)
            for model, why in body.get("quarantined", {}).items():
                self.quarantine(model, why)
            return
        if kind == "MODEL_QUARANTINED":
            self.quarantine(body["model"], body["reason"])
            return
        if kind == "RELOAD":
            self._on_reload(body["model_repository"])
            return
        worker = self._apply_worker_info(body)
        if kind == "WORKER_EXITED" and self._replacement_exited(body):
            return
        if kind == "WORKER_EXITED" and body["generation"] >= worker.generation:
            worker.state = "dead"
            worker.last_exit = {"reason": body["reason"], "at": body["at"], "pid": body["pid"],
                                "generation": body["generation"]}
            log.warning("worker %d (pid %s) died: %s", worker.index, body["pid"], body["reason"])
            was_serving = not worker.standby
            worker.standby = False
            if was_serving and self.settings.active_workers:
                self._fill_active()
            self._requeue_all(worker, reason=_blame(body))
            self.pump()
        elif kind == "WORKER_STARTED" and body.get("replaces") is not None:
            self.successors[worker.index] = WorkerHandle(worker.index, body["generation"], body["pid"],
                                                         replaces=body["replaces"], reason=body.get("reason"))
        elif kind == "WORKER_STARTED" and body["generation"] > worker.generation:
            worker.state, worker.pid = "starting", body["pid"]

    def _replacement_exited(self, body: dict[str, Any]) -> bool:
        """A successor that died before it served, or a retiring worker that died: not the serving one."""
        index, generation = body["worker"], body["generation"]
        successor = self.successors.get(index)
        if successor is not None and successor.generation == generation:
            del self.successors[index]
            log.error("the replacement of worker %d (pid %s) died before it was ready: %s; the old one serves on",
                      index, body["pid"], body["reason"])
            return True
        retiring = self.retiring.pop(wire.worker_identity(index, generation), None)
        if retiring is None:
            return False
        retiring.state = "dead"
        log.warning("retiring worker %d (pid %s) died: %s", index, body["pid"], body["reason"])
        self._requeue_all(retiring, reason=_blame(body))
        self.pump()
        return True

    def _apply_worker_info(self, body: dict[str, Any]) -> WorkerHandle:
        worker = self.workers.setdefault(body["worker"], WorkerHandle(body["worker"]))
        worker.restarts = body.get("restarts", worker.restarts)
        worker.rss_bytes = body.get("rss_bytes", worker.rss_bytes)
        if body.get("last_exit") and worker.last_exit is None:
            worker.last_exit = body["last_exit"]
        return worker

    def _requeue_all(self, worker: WorkerHandle, reason: str | None) -> None:
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
                if not request.done and now >= request.deadline:
                    self._finish(request, error=self._expiry_error(request))


def _blame(exited: dict[str, Any]) -> str | None:
    """The reason a worker death counts against the batch it ran; None when it died while loading a
    model: the load is blamed (the supervisor's quarantine counts it) and the batch is retried."""
    return None if exited.get("loading_model") else exited["reason"]
