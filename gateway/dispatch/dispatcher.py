"""Dispatch: the gateway's side of the workers, put together, and the messages routed to each part.

    Dispatcher ── catalog    configs, versions, queues by model key, a reload's swaps
               ├─ fleet      worker processes: generations, successors, standbys, what each holds
               ├─ scheduler  submit, pump, replies (and its recovery: requeue, bisection, quarantine)
               ├─ models     model version states: lifecycle reports in, answers out
               └─ link       the ZeroMQ sockets (started with the event loop)

One Dispatcher per gateway process (index `settings.gateway`). Every worker serves every gateway:
each of its READYs here is answered with ATTACH naming this gateway's ring, before any BATCH.

The link decodes each message into its dataclass (common/messages.py) and hands it here;
the handlers below ask the part that owns the state what changed, and tell the others.
Unit tests skip the link: `attach(loop, port)` with a fake WorkerPort (gateway/dispatch/worker_port.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ringserve.common import runtime_settings
from ringserve.common.messages import Attach, Error, Executed, Message, ModelState, Ready, Result, StreamResponse
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import scan_repository
from ringserve.common.runtime_settings import ChangeRuntimeSettings, RuntimeSettings
from ringserve.common.supervisor_messages import (
    GatewayInfo,
    ModelQuarantined,
    ModelUnquarantined,
    Reload,
    RepositoryChanged,
    Snapshot,
    SpareInfo,
    WorkerExited,
    WorkerSilent,
    WorkerStarted,
)
from ringserve.gateway.batching.sequences import SequenceQueue
from ringserve.gateway.batching.state_stores import StateStores
from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, Readiness
from ringserve.gateway.dispatch.link import Link
from ringserve.gateway.dispatch.model_states import ModelStates
from ringserve.gateway.dispatch.scheduler import Scheduler
from ringserve.gateway.dispatch.worker_port import WorkerPort
from ringserve.gateway.observe.metrics import GatewaySnapshot, Metrics, QueueSample, WorkerSample
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.segment import Segment

__all__ = ["DispatchSettings", "Dispatcher"]  # DispatchSettings lives in gateway/core/settings.py

log = logging.getLogger(__name__)


class Dispatcher:
    """Queues accepted requests, sends their batches to idle workers, and answers each request once."""

    def __init__(
        self,
        *,
        segment: Segment,
        configs: dict[str, ModelConfig],
        runtime_dir: str,
        metrics: Metrics,
        settings: DispatchSettings,
        regions: RegionRegistry | None = None,
        statistics: Statistics | None = None,
    ) -> None:
        self.segment = segment
        self.settings = settings
        self.runtime_dir = runtime_dir
        self.metrics = metrics
        self.catalog = Catalog(configs, segment.data_capacity, StateStores(settings.state_store_prefix))
        self.fleet = Fleet(self.catalog, settings.active_workers)
        self.scheduler = Scheduler(
            catalog=self.catalog,
            fleet=self.fleet,
            segment=segment,
            metrics=metrics,
            settings=settings,
            statistics=statistics,
        )
        self.recovery = self.scheduler.recovery
        self.models = ModelStates(self.catalog, self.fleet, self.scheduler, self.recovery, metrics)
        self.link: Link | None = None
        # System shared memory: HTTP and gRPC requests name the same regions (None: off, as by default).
        self.regions = regions if regions is not None else RegionRegistry()
        self.gateways: tuple[GatewayInfo, ...] = ()  # the supervisor's numbers (restarts outlive a gateway)
        self.spares: tuple[SpareInfo, ...] = ()  # the supervisor's warm spares, one per worker device
        # Set by the repository API above (gateway/kserve/repository.py): another gateway's load or unload.
        self.on_repository_changed: Callable[[RepositoryChanged], None] | None = None
        # The settings desks of HTTP and gRPC (gateway/cluster/runtime_settings.py): hear the supervisor answer.
        self.on_runtime_settings: list[Callable[[RuntimeSettings], None]] = []
        # A worker's request to a model it does not hold (gateway/calls/front.py; set by gateway/http/app.py)
        self.on_call: Callable[[bytes, Message, bytes], None] | None = None
        # A worker exited (index, generation): its BLS stream calls are cancelled (gateway/calls/stream.py)
        self.on_worker_exited: Callable[[int, int], None] | None = None
        # What the routes call per request, bound once: no lookups through the parts on the hot path.
        self.submit = self.scheduler.submit
        self.check_available = self.scheduler.check_available
        self.ready_workers = self.fleet.ready_workers
        self.ring = self.scheduler.ring
        self.queues = self.catalog.queues
        self.quarantined = self.scheduler.quarantined
        self.workers = self.fleet.workers

    @property
    def draining(self) -> bool:
        return self.scheduler.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.scheduler.draining = value  # ready goes false and new requests get 503

    # -- lifetime ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.link = Link(
            self.runtime_dir,
            self.on_worker_message,
            self.on_supervisor_event,
            self.settings.gateway,
            on_call=self._on_call,
        )
        self.link.start(loop)
        self.attach(loop, self.link)

    def attach(self, loop: asyncio.AbstractEventLoop, port: WorkerPort) -> None:
        self.loop = loop
        self.scheduler.attach(loop, port)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    def ready_to_serve(self) -> bool:
        """This gateway's side of readiness: not draining, a worker ready and not wedged, every model it serves
        announced by a worker (each model's lanes start apart: supervision/lanes.py) and, with
        --strict-readiness, every model servable."""
        return not (
            self.draining
            or all(w.wedged for w in self.ready_workers())  # (none ready, or every one wedged: its heartbeat stopped)
            or self._unannounced()
            or (self.settings.strict_readiness and self.models.unservable())
        )

    def _unannounced(self) -> bool:
        """Whether a model the gateway serves has not been announced by any worker yet (its lane starts)."""
        announced, failed, quarantined = self.fleet.announced, self.catalog.failed_configs, self.quarantined
        return any(
            key not in announced and key not in failed and key not in quarantined
            for key in (*self.queues, *self.catalog.awaiting)
        )

    async def wait_for_a_worker(self, timeout_s: float) -> bool:
        """Until a worker serves this gateway and every model it serves has been announced to it (with lanes
        each model's lane announces apart: accepting after the first one, a gateway answered 503 for a model
        whose lane had not reached it yet); False after `timeout_s`, or once it drains."""
        deadline = self.loop.time() + timeout_s
        while not self.fleet.serving() or self._unannounced():
            if self.loop.time() >= deadline or self.draining:
                return False
            await asyncio.sleep(0.01)
        return True

    def lift_quarantine(self, model: str) -> bool:
        return self.scheduler.lift_quarantine(model)

    def cancel(self, request: InferRequest, error: GatewayError) -> None:
        """Its client went away (HTTP disconnect, gRPC cancel, its stream closed): see Scheduler.cancel."""
        self.scheduler.cancel(request, error)

    def snapshot(self) -> GatewaySnapshot:
        """What /metrics reports, read at scrape time."""
        queues = [
            QueueSample(
                q.config.name,
                q.config.version,
                q.depth + sum(len(b.requests) for b in q.requeued),
                key in self.quarantined,
                q.status() if isinstance(q, SequenceQueue) else None,
            )
            for key, q in self.queues.items()
        ]
        workers = [
            WorkerSample(
                w.index,
                w.state == "ready",
                w.rss_bytes,
                dict(w.restarts),
                [(s.model, s.version, s.memory_bytes) for s in w.model_states.values() if s.state == "ready"]
                if w.state == "ready"
                else [],
                busy_s=w.busy_s,
                uss_bytes=w.uss_bytes,
                pid=w.pid if w.state != "dead" else None,
                models=tuple(sorted(w.models)),
            )
            for w in self.workers.values()
        ]
        gateways = [(str(g.gateway_index), dict(g.restarts)) for g in self.gateways]
        return GatewaySnapshot(queues, workers, dict(self.fleet.budget_bytes), gateways, list(self.spares))

    def worker_pids(self) -> dict[int, int]:
        """Worker index -> the pid of the generation that serves it (for the process metrics)."""
        return {w.index: w.pid for w in self.workers.values() if w.pid and w.state != "dead"}

    def reload_status(self) -> dict:
        """/admin/status's `reload`: worker indexes whose replacement is starting, and the models an
        older generation serves on because the replacement failed them (STATUS= shows those)."""
        return {"replacing": sorted(self.fleet.successors), "kept_models": dict(self.fleet.kept_models)}

    # -- messages from the workers ----------------------------------------------------------
    def on_worker_message(self, index: int, generation: int, message: Message) -> None:
        match message:
            case Result() | Error():
                self.scheduler.on_reply(index, generation, message)
            case StreamResponse():
                self.scheduler.on_stream(index, generation, message)
            case Executed():
                self.scheduler.on_executed(index, generation, message)
            case Ready():
                self._on_ready(index, generation, message)
            case ModelState():
                self.models.on_model_state(self.fleet.handle(index, generation), message)
            case _:
                log.warning("ignoring %s from worker %d generation %d", message.KIND, index, generation)

    def _on_ready(self, index: int, generation: int, ready: Ready) -> None:
        if self.fleet.outdated(index, generation):
            log.info(
                "worker %d generation %d announced itself, but a newer generation serves that index: not using it",
                index,
                generation,
            )
            self.scheduler.tell_retired(index, generation)
            return
        # First, before anything can send it a BATCH: the ring this gateway's batches lie in. One ROUTER
        # pipe per worker keeps the order, so the worker has attached it when the first BATCH comes.
        if not self.scheduler.port.send_to_worker(
            index, generation, Attach(gateway_index=self.settings.gateway, segment=self.segment.name)
        ):
            log.warning(
                "cannot send ATTACH to worker %d generation %d; it gets no batch until it is ready again",
                index,
                generation,
            )
            return
        if runtime_settings.current.revision:  # a client changed them since the worker's start (it may have read them)
            self.scheduler.port.send_to_loader(index, generation, runtime_settings.current.message())
        change: Readiness | None = self.fleet.on_ready(index, generation, ready)
        if change is None:
            return
        for retired_index, retired_generation in change.retired:
            self.scheduler.tell_retired(retired_index, retired_generation)
        if change.kept:  # a replacement that failed a model the old generation serves: refused
            for key in change.kept:
                self.metrics.reload_failures.labels(key).inc()
            return
        if ready.configs:  # Python models: the configs the worker read (its model.py may complete them)
            self.catalog.adopt(ready.configs)
        self.models.on_ready(change.worker, ready)
        if change.reloaded:
            self.catalog.reloaded_worker_serves()
        self.scheduler.pump()

    def _on_call(self, identity: bytes, call: Message, body: bytes) -> None:
        if self.on_call is not None:
            self.on_call(identity, call, body)

    # -- messages from the supervisor -------------------------------------------------------
    def on_supervisor_event(self, message: Message) -> None:
        match message:
            case Snapshot():
                self.gateways, self.spares = message.gateways, message.spares
                for info in message.workers:
                    worker = self.fleet.apply_info(info.worker_index, info.restarts, info.rss_bytes, info.last_exit)
                    worker.uss_bytes = info.uss_bytes
                for model, why in message.quarantined.items():
                    self.recovery.quarantine(model, why)
            case ModelQuarantined():
                self.recovery.quarantine(message.model, message.reason)
            case ModelUnquarantined():  # (after a SNAPSHOT sent before the lift re-applied it)
                self.recovery.lift_quarantine(message.model)
            case Reload():
                self._read_repository(message.model_repository)
            case RepositoryChanged():
                if self.on_repository_changed is not None:
                    self.on_repository_changed(message)
            case WorkerStarted():
                if (retired := self.fleet.on_started(message)) is not None:
                    self.scheduler.tell_retired(*retired)
            case RuntimeSettings():
                self._runtime_settings(message)
            case WorkerSilent():
                self.fleet.on_silent(message)
            case WorkerExited():
                dead = self.fleet.on_exited(message)
                if dead is not None:
                    self.recovery.requeue_all(dead, reason=_blame(message))
                    self.scheduler.pump()
                if self.on_worker_exited is not None:
                    self.on_worker_exited(message.worker_index, message.generation)
            case _:
                log.warning("ignoring %s from the supervisor", message.KIND)

    def tell_supervisor(self, message: ChangeRuntimeSettings) -> bool:
        """A client's change of the runtime settings (gateway/cluster/runtime_settings.py); False before start."""
        if self.scheduler.port is None:
            return False
        self.scheduler.port.tell_supervisor(message)
        return True

    def _runtime_settings(self, message: RuntimeSettings) -> None:
        """A client's change of the log or trace settings (this gateway's or another's): here, then in every
        worker this gateway knows (each hears it from every gateway; the revision makes that harmless)."""
        runtime_settings.adopt(message)
        for worker in self.workers.values():
            if worker.state != "dead" and worker.generation >= 0:
                self.scheduler.port.send_to_loader(worker.index, worker.generation, message)
        for heard in self.on_runtime_settings:
            heard(message)

    def _read_repository(self, repository: str) -> None:
        """A reload: read the repository off the event loop; it applies once a reloaded worker serves."""

        def read(future: asyncio.Future) -> None:
            try:
                scan = future.result()
            except Exception as exc:  # noqa: BLE001 - an unreadable repository keeps the configs in force
                log.error(
                    "reload: cannot read the model repository %s (%s); keeping the model configs", repository, exc
                )
                return
            self.catalog.stage(scan)

        self.catalog.expect_reloaded_worker()
        self.loop.run_in_executor(None, scan_repository, Path(repository)).add_done_callback(read)


def _blame(exited: WorkerExited) -> str | None:
    """The reason a worker death counts against the batch it ran; None when it died while loading a
    model: the load is blamed (the supervisor's quarantine counts it) and the batch is retried."""
    return None if exited.loading_model else exited.reason
