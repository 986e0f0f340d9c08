"""The gateway's view of the worker processes: which generation serves each index, which stand by.

Fed by the workers' READY (over dispatch.sock) and the supervisor's WORKER_STARTED,
WORKER_EXITED and SNAPSHOT (over events.sock). The batches a worker holds live on its
WorkerHandle (`in_flight`), but what happens to them is the Dispatcher's business: the
registry calls back into its Dispatcher to requeue a dead worker's batches and to pump,
and tells the model view (gateway/models.py) what a READY worker serves.

Zero-downtime replacement: while one generation of a worker index serves, the next one
may be starting (`successors`). On its READY it serves that index and the old one goes
to `retiring`: it gets no new batch, finishes the ones it holds, and then the supervisor
is told WORKER_RETIRED and stops it.

Hot standby: with `active_workers` N, N ready workers serve and the other ready ones
stand by with their models loaded, until a serving one dies and one is promoted.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from ringserve.common import wire

from .batcher import Batch

if TYPE_CHECKING:
    from .dispatch import Dispatcher

log = logging.getLogger(__name__)


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


class WorkerRegistry:
    """Every worker generation the gateway knows, by role: serving, successor, retiring."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.workers: dict[int, WorkerHandle] = {}  # index -> the generation that serves it
        self.successors: dict[int, WorkerHandle] = {}  # index -> next generation, starting
        self.retiring: dict[bytes, WorkerHandle] = {}  # identity -> replaced, finishing its batches

    # -- questions --------------------------------------------------------------------
    def ready_workers(self, model: str | None = None) -> list[WorkerHandle]:
        return [w for w in self.workers.values()
                if w.state == "ready" and (model is None or model in w.models)]

    def handle(self, index: int, generation: int) -> WorkerHandle | None:
        """The serving or retiring worker process (index, generation); None for a dead one."""
        worker = self.workers.get(index)
        if worker is not None and worker.generation == generation:
            return worker
        return self.retiring.get(wire.worker_identity(index, generation))

    def summary(self) -> str:
        """What every worker is doing, for a 503's message."""
        if not self.workers:
            return "workers are starting"
        parts = []
        for w in self.workers.values():
            why = f" after {w.last_exit['reason']}" if w.last_exit and w.state != "ready" else ""
            parts.append(f"worker {w.index} is {'restarting' if w.state != 'ready' and w.last_exit else w.state}{why}")
        return ", ".join(parts)

    # -- READY ------------------------------------------------------------------------
    def on_ready(self, index: int, generation: int, body: dict[str, Any]) -> None:
        d = self.dispatcher
        successor = self.successors.get(index)
        if successor is not None and successor.generation == generation:
            del self.successors[index]
            self._promote(successor, body)
            return
        worker = self.workers.setdefault(index, WorkerHandle(index))
        if generation < worker.generation:
            return
        if generation > worker.generation and worker.in_flight:
            d.requeue_all(worker, reason="replaced")
        worker.generation, worker.pid, worker.state = generation, body["pid"], "ready"
        worker.models, worker.failed_models = body["models"], body.get("failed_models", {})
        d.models.on_ready(worker, body)
        worker.standby = self.serving_count(besides=worker) >= d.settings.active_workers > 0
        log.info("worker %d generation %d (pid %d) is ready%s", index, generation, worker.pid,
                 " as a standby" if worker.standby else "")
        d.pump()

    # -- hot standby ---------------------------------------------------------------------
    def serving_count(self, besides: WorkerHandle | None = None) -> int:
        return sum(1 for w in self.workers.values() if w is not besides and w.state == "ready" and not w.standby)

    def fill_active(self) -> bool:
        """Promote ready standbys until `active_workers` serve; True if any was promoted.

        A standby has its models loaded: taking over costs nothing but this flag, where a
        restart costs a process start and a model load.
        """
        promoted = False
        for worker in sorted(self.workers.values(), key=lambda w: w.index):
            if self.serving_count() >= self.dispatcher.settings.active_workers:
                break
            if worker.state == "ready" and worker.standby:
                worker.standby = False
                promoted = True
                log.warning("standby worker %d (pid %s) takes over", worker.index, worker.pid)
        return promoted

    # -- zero-downtime replacement ---------------------------------------------------------
    def _promote(self, successor: WorkerHandle, body: dict[str, Any]) -> None:
        """The successor is ready: from now on it gets the batches; the old one finishes what it holds."""
        d = self.dispatcher
        index = successor.index
        old = self.workers.get(index)
        successor.pid, successor.state = body["pid"], "ready"
        successor.models, successor.failed_models = body["models"], body.get("failed_models", {})
        d.models.on_ready(successor, body)
        if old is not None:
            successor.restarts, successor.last_exit = old.restarts, old.last_exit
            successor.standby = old.standby and old.state == "ready"
        self.workers[index] = successor
        log.info("worker %d generation %d (pid %d) is ready and replaces generation %s (%s)", index,
                 successor.generation, successor.pid, successor.replaces, successor.reason)
        if old is not None and old.generation == successor.replaces and old.state == "ready":
            old.state = "retiring"
            self.retiring[old.identity] = old
            self.retire_if_idle(old)
        else:  # it never became ready, or died meanwhile: it holds nothing
            self._send_retired(index, successor.replaces)
        if successor.reason == "reload":
            d.reload.on_reloaded_worker_serves()
        d.pump()

    def retire_if_idle(self, worker: WorkerHandle) -> None:
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
        self.dispatcher.tell_supervisor("WORKER_RETIRED", {"worker": index, "generation": generation})

    # -- the supervisor's events -------------------------------------------------------------
    def on_process_event(self, kind: str, body: dict[str, Any]) -> None:
        """WORKER_STARTED or WORKER_EXITED from the supervisor."""
        worker = self.apply_info(body)
        if kind == "WORKER_EXITED" and self._replacement_exited(body):
            return
        if kind == "WORKER_EXITED" and body["generation"] >= worker.generation:
            worker.state = "dead"
            worker.last_exit = {"reason": body["reason"], "at": body["at"], "pid": body["pid"],
                                "generation": body["generation"]}
            log.warning("worker %d (pid %s) died: %s", worker.index, body["pid"], body["reason"])
            was_serving = not worker.standby
            worker.standby = False
            if was_serving and self.dispatcher.settings.active_workers:
                self.fill_active()
            self.dispatcher.requeue_all(worker, reason=_blame(body))
            self.dispatcher.pump()
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
        self.dispatcher.requeue_all(retiring, reason=_blame(body))
        self.dispatcher.pump()
        return True

    def apply_info(self, body: dict[str, Any]) -> WorkerHandle:
        """The supervisor's numbers for one worker index (restarts, RSS, its last exit)."""
        worker = self.workers.setdefault(body["worker"], WorkerHandle(body["worker"]))
        worker.restarts = body.get("restarts", worker.restarts)
        worker.rss_bytes = body.get("rss_bytes", worker.rss_bytes)
        if body.get("last_exit") and worker.last_exit is None:
            worker.last_exit = body["last_exit"]
        return worker


def _blame(exited: dict[str, Any]) -> str | None:
    """The reason a worker death counts against the batch it ran; None when it died while loading a
    model: the load is blamed (the supervisor's quarantine counts it) and the batch is retried."""
    return None if exited.get("loading_model") else exited["reason"]
