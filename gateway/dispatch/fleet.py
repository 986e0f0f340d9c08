"""The gateway's view of the worker processes: which generation serves each index, which stand by,
which model versions each one holds, and which worker gets the next batch of a model.

Fed by the workers' READY and MODEL_STATE (over dispatch.sock) and the supervisor's
WORKER_STARTED, WORKER_EXITED and SNAPSHOT (over events.sock), all decoded by gateway/dispatch/link.py.
The batches a worker holds live on its WorkerHandle (`in_flight`), but what happens to them
is the scheduler's business: the handlers here return the handle whose batches go back to
their queues, and which generations the supervisor may stop, and the dispatcher acts on that.

Zero-downtime replacement: while one generation of a worker index serves, the next one
may be starting (`successors`). On its READY it serves that index and the old one goes
to `retiring`: it gets no new batch, finishes the ones it holds, and then the supervisor
is told WORKER_RETIRED and stops it. A successor that failed a model the old one serves is
refused instead: the old one serves on, and the successor is the one retired (`kept_models`).

Several gateways: every worker serves each of them and sends each its READY, again whenever
it reconnects (a restarted gateway learns the workers from their READYs, and may hear one
from a generation the supervisor is retiring: `outdated` tells it not to use that one).

Hot standby: with `active_workers` N, N ready workers serve and the other ready ones
stand by with their models loaded, until a serving one dies and one is promoted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringserve.common import wire
from ringserve.common.exits import REASON_RELOAD
from ringserve.common.messages import ModelStateReport, Ready
from ringserve.common.repository.config import ModelConfig
from ringserve.common.supervisor_messages import ExitInfo, WorkerExited, WorkerSilent, WorkerStarted
from ringserve.common.vocabulary import LoadPolicy, ModelVersionState, ReplaceReason, WorkerState
from ringserve.gateway.dispatch.catalog import Catalog

if TYPE_CHECKING:
    from ringserve.gateway.batching.slots import SlotBatch

log = logging.getLogger(__name__)


@dataclass
class VersionOnWorker:
    """One model version in one worker, as the worker last reported it."""

    model: str
    version: int
    state: ModelVersionState
    reason: str = ""
    memory_bytes: int = 0
    policy: LoadPolicy = "eager"
    seq: int = 0  # the worker's change counter for this version
    load_s: float = 0.0  # its last load's time, warm-up included (nv_model_load_duration_secs)


@dataclass(eq=False)
class WorkerHandle:
    """The gateway's view of one worker slot (index) and its current process generation."""

    index: int
    generation: int = -1
    pid: int | None = None
    state: WorkerState = "starting"
    models: dict[str, str | None] = field(default_factory=dict)  # model key -> execution provider
    failed_models: dict[str, str] = field(default_factory=dict)
    in_flight: dict[int, SlotBatch] = field(default_factory=dict)
    detached: int = 0  # of in_flight: decoupled batches past their execute, streaming (they take no turn)
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: ExitInfo | None = None
    batches_done: int = 0
    rss_bytes: int = 0  # as the supervisor measured it
    uss_bytes: int = 0  # (the same): its own pages, what its lane costs
    busy_s: float = 0.0  # seconds its executions took, as their Results to this gateway say (its lane's busy time)
    replaces: int | None = None  # a successor: the generation it takes over from
    reason: ReplaceReason | None = None  # a successor: why the old one is replaced
    standby: bool = False  # ready with its models loaded, but gets no batch until promoted
    model_states: dict[str, VersionOnWorker] = field(default_factory=dict)  # model key -> its state here
    # Its last death while loading a model: (generation, the model's key, the reason), for a repository load's answer.
    died_loading: tuple[int, str, str] | None = None
    silent_generation: int | None = None  # its heartbeats stopped (WorkerSilent): wedged, not ready

    @property
    def wedged(self) -> bool:
        return self.silent_generation == self.generation

    @property
    def identity(self) -> bytes:
        return wire.worker_identity(self.index, self.generation)


@dataclass
class Readiness:
    """What a READY changed: the worker now ready, and what the dispatcher must do about it."""

    worker: WorkerHandle
    retired: list[tuple[int, int]] = field(default_factory=list)  # (index, generation) to stop
    reloaded: bool = False  # a worker of a reloaded generation serves
    kept: dict[str, str] = field(default_factory=dict)  # a refused successor: model key -> why it failed


class Fleet:
    """Every worker generation the gateway knows, by role: serving, successor, retiring."""

    def __init__(self, catalog: Catalog, active_workers: int) -> None:
        self.catalog = catalog
        self.active_workers = active_workers
        self.workers: dict[int, WorkerHandle] = {}  # index -> the generation that serves it
        self.successors: dict[int, WorkerHandle] = {}  # index -> next generation, starting
        # (monotonic time, model key, reason, index) of the latest deaths while loading, successors' too
        self.load_deaths: deque[tuple[float, str, str, int]] = deque(maxlen=64)
        self.retiring: dict[bytes, WorkerHandle] = {}  # identity -> replaced, finishing its batches
        self.budget_bytes: dict[int, int] = {}  # worker index -> its --model-memory-budget
        self.kept_models: dict[str, str] = {}  # model key -> why a reload's generation failed it (the old serves)
        self.newest: dict[int, int] = {}  # worker index -> the newest generation heard of (WORKER_STARTED, READY)
        # Model keys some worker has announced (to serve, or failed to load): with lanes (supervision/lanes.py)
        # each model comes up in its own processes, and the server is ready once every one has (server_ready).
        self.announced: set[str] = set()
        catalog.on_keys_changed = self.refile

    # -- questions --------------------------------------------------------------------------
    def ready_workers(self, model: str | None = None) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state == "ready" and (model is None or model in w.models)]

    def announce(self, ready: Ready) -> None:
        self.announced.update(ready.models, ready.failed_models, (c.key for c in ready.configs))

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
            restarting = w.state != "ready" and w.last_exit is not None
            why = f" after {w.last_exit.reason}" if restarting else ""
            parts.append(f"worker {w.index} is {'restarting' if restarting else w.state}{why}")
        return ", ".join(parts)

    def serving(self) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state == "ready" and not w.standby]

    # -- READY ------------------------------------------------------------------------------
    def outdated(self, index: int, generation: int) -> bool:
        """A READY from a generation older than one already heard of for its index, and not one still
        finishing its batches here: it never gets a batch, and is retired at once. (A restarted
        gateway hears the READY of a generation being replaced, after its successor's.)"""
        return generation < self.newest.get(index, -1) and wire.worker_identity(index, generation) not in self.retiring

    def on_ready(self, index: int, generation: int, ready: Ready) -> Readiness | None:
        """A worker process is ready; None for a READY older than the generation we know."""
        if generation > self.newest.get(index, -1):
            self.newest[index] = generation
        successor = self.successors.get(index)
        if successor is not None and successor.generation == generation:
            del self.successors[index]
            return self._promote(successor, ready)
        worker = self.workers.setdefault(index, WorkerHandle(index))
        if generation < worker.generation:
            return None
        if generation > worker.generation and worker.in_flight:
            # A newer generation while the older one holds batches: that one may still run (this gateway
            # restarted and never heard WORKER_STARTED), so its slots stay its own until its RESULTs, or
            # its WORKER_EXITED requeues them. It gets nothing more, and is retired when idle.
            worker.state = "retiring"
            self.retiring[worker.identity] = worker
            worker = self.workers[index] = WorkerHandle(
                index, restarts=worker.restarts, last_exit=worker.last_exit, rss_bytes=worker.rss_bytes
            )
        change = Readiness(worker)
        self.announce(ready)
        worker.generation, worker.pid, worker.state = generation, ready.pid, "ready"
        worker.models, worker.failed_models = dict(ready.models), dict(ready.failed_models)
        worker.standby = self.serving_count(besides=worker) >= self.active_workers > 0
        log.info(
            "worker %d generation %d (pid %d) is ready%s",
            index,
            generation,
            worker.pid,
            " as a standby" if worker.standby else "",
        )
        return change

    def _promote(self, successor: WorkerHandle, ready: Ready) -> Readiness:
        """The successor is ready: from now on it gets the batches; the old one finishes what it holds.

        Unless it failed a model the old one serves (a reload that read a broken file): then the
        old one serves on, everything it served, and the successor is stopped (`kept`).
        """
        index = successor.index
        self.announce(ready)
        old = self.workers.get(index)
        serving = old is not None and old.generation == successor.replaces and old.state == "ready"
        lost = {key: why for key, why in ready.failed_models.items() if serving and key in old.models}
        if lost:
            log.error(
                "worker %d: the replacement generation %d failed model(s) that generation %d serves; "
                "generation %d serves on and the replacement is stopped (%s): %s",
                index,
                successor.generation,
                old.generation,
                old.generation,
                successor.reason,
                "; ".join(f"{key}: {why}" for key, why in sorted(lost.items())),
            )
            self.kept_models.update(lost)
            return Readiness(old, retired=[(index, successor.generation)], kept=lost)
        successor.pid, successor.state = ready.pid, "ready"
        successor.models, successor.failed_models = dict(ready.models), dict(ready.failed_models)
        for key in successor.models.keys() & self.kept_models.keys():
            del self.kept_models[key]  # a later generation serves it again
        if old is not None:
            successor.restarts, successor.last_exit = old.restarts, old.last_exit
            successor.standby = old.standby and old.state == "ready"
        self.workers[index] = successor
        log.info(
            "worker %d generation %d (pid %d) is ready and replaces generation %s (%s)",
            index,
            successor.generation,
            successor.pid,
            successor.replaces,
            successor.reason,
        )
        change = Readiness(successor, reloaded=successor.reason == REASON_RELOAD)
        if old is not None and old.generation == successor.replaces and old.state == "ready":
            old.state = "retiring"
            self.retiring[old.identity] = old
            if self.retire_if_idle(old):
                change.retired.append((index, old.generation))
        elif successor.replaces is not None:  # it never became ready, or died meanwhile: it holds nothing
            change.retired.append((index, successor.replaces))
        return change

    def retire_if_idle(self, worker: WorkerHandle) -> bool:
        """True when the retiring worker holds no batch any more: the supervisor may stop it now."""
        if worker.in_flight:
            return False  # its last RESULT (or its death) brings us back
        self.retiring.pop(worker.identity, None)
        worker.state = "retired"
        return True

    # -- hot standby ------------------------------------------------------------------------
    def serving_count(self, besides: WorkerHandle | None = None) -> int:
        return sum(1 for w in self.workers.values() if w is not besides and w.state == "ready" and not w.standby)

    def fill_active(self) -> bool:
        """Promote ready standbys until `active_workers` serve; True if any was promoted.

        A standby has its models loaded: taking over costs nothing but this flag, where a
        restart costs a process start and a model load.
        """
        promoted = False
        for worker in sorted(self.workers.values(), key=lambda w: w.index):
            if self.serving_count() >= self.active_workers:
                break
            if worker.state == "ready" and worker.standby:
                worker.standby = False
                promoted = True
                log.warning("standby worker %d (pid %s) takes over", worker.index, worker.pid)
        return promoted

    # -- the supervisor's events ------------------------------------------------------------
    def on_started(self, started: WorkerStarted) -> tuple[int, int] | None:
        """A new worker process; returns (index, generation) of one to retire now, else None.

        A successor's READY may come first (a warm spare is ready in milliseconds): then it serves
        already, and the generation it replaces, which holds nothing here, is retired at once.
        """
        if started.generation > self.newest.get(started.worker_index, -1):
            self.newest[started.worker_index] = started.generation
        worker = self.apply_info(started.worker_index, started.restarts)
        if started.replaces is not None:
            if worker.generation >= started.generation:
                replaced = wire.worker_identity(worker.index, started.replaces)
                return None if replaced in self.retiring else (worker.index, started.replaces)
            self.successors[worker.index] = WorkerHandle(
                worker.index, started.generation, started.pid, replaces=started.replaces, reason=started.reason
            )
        elif started.generation > worker.generation:
            worker.state, worker.pid = "starting", started.pid
        return None

    def on_silent(self, silent: WorkerSilent) -> None:
        """Its heartbeats stopped (or came back): readiness leaves it out while they are stopped."""
        worker = self.handle(silent.worker_index, silent.generation)
        if worker is not None:
            worker.silent_generation = silent.generation if silent.silent else None

    def on_exited(self, exited: WorkerExited) -> WorkerHandle | None:
        """A worker process ended; returns the handle whose batches go back to their queues."""
        if exited.loading_model:
            self.load_deaths.append((time.monotonic(), exited.loading_model, exited.reason, exited.worker_index))
        worker = self.apply_info(exited.worker_index, exited.restarts)
        successor = self.successors.get(exited.worker_index)
        if successor is not None and successor.generation == exited.generation:
            del self.successors[exited.worker_index]
            log.error(
                "the replacement of worker %d (pid %s) died before it was ready: %s; the old one serves on",
                exited.worker_index,
                exited.pid,
                exited.reason,
            )
            return None
        retiring = self.retiring.pop(wire.worker_identity(exited.worker_index, exited.generation), None)
        if retiring is not None:
            retiring.state = "dead"
            log.warning("retiring worker %d (pid %s) died: %s", exited.worker_index, exited.pid, exited.reason)
            return retiring
        if exited.generation < worker.generation:
            return None
        worker.state, worker.last_exit = "dead", exited.last_exit
        if exited.loading_model:
            worker.died_loading = (exited.generation, exited.loading_model, exited.reason)
        log.warning("worker %d (pid %s) died: %s", worker.index, exited.pid, exited.reason)
        was_serving = not worker.standby
        worker.standby = False
        if was_serving and self.active_workers:
            self.fill_active()
        return worker

    def apply_info(
        self,
        index: int,
        restarts: dict[str, int] | None = None,
        rss_bytes: int | None = None,
        last_exit: ExitInfo | None = None,
    ) -> WorkerHandle:
        """The supervisor's numbers for one worker index (restarts, RSS, its last exit)."""
        worker = self.workers.setdefault(index, WorkerHandle(index))
        if restarts is not None:
            worker.restarts = restarts
        if rss_bytes is not None:
            worker.rss_bytes = rss_bytes
        if last_exit is not None and worker.last_exit is None:
            worker.last_exit = last_exit
        return worker

    # -- model versions on the workers ------------------------------------------------------
    def record(self, worker: WorkerHandle, key: str, report: ModelStateReport) -> bool:
        """Keep the worker's report; False for one older than what we have (it came the other way)."""
        known = worker.model_states.get(key)
        if known is not None and report.seq < known.seq:
            return False
        failed = report.state == "failed"
        worker.model_states[key] = VersionOnWorker(
            report.model,
            report.version,
            report.state,
            report.reason if failed else "",
            report.memory_bytes,
            report.policy,
            report.seq,
            report.load_s,
        )
        if failed:
            worker.models.pop(key, None)
            worker.failed_models[key] = report.reason
        else:
            worker.models[key] = report.provider
            worker.failed_models.pop(key, None)
        return True

    def refile(self) -> None:
        """The catalog gave versions new keys (a reload made version 1 the default: 'm/1' is 'm' now): each
        worker's reports move to the keys the routes and the queues use from now on."""
        for worker in (*self.workers.values(), *self.successors.values(), *self.retiring.values()):
            moves = {
                key: self.catalog.key_for(found.model, found.version) for key, found in worker.model_states.items()
            }
            if all(key == new for key, new in moves.items()):
                continue
            worker.model_states = {moves[key]: found for key, found in worker.model_states.items()}
            worker.models = {moves.get(key, key): provider for key, provider in worker.models.items()}
            worker.failed_models = {moves.get(key, key): why for key, why in worker.failed_models.items()}

    def mark_loading(self, worker: WorkerHandle, config: ModelConfig) -> None:
        """A LOAD went out: the version counts as loading there until the worker says otherwise."""
        current = worker.model_states.get(config.key)
        worker.model_states[config.key] = VersionOnWorker(
            config.name,
            config.version,
            "loading",
            policy=config.lifecycle.load_policy,
            memory_bytes=current.memory_bytes if current else 0,
            seq=current.seq if current else 0,
        )

    @staticmethod
    def state_on(worker: WorkerHandle, key: str) -> str:
        found = worker.model_states.get(key)
        return "ready" if found is None else found.state  # no report: a worker that loads everything

    def holders(self, key: str) -> list[WorkerHandle]:
        return [w for w in self.serving() if key in w.models and self.state_on(w, key) in ("ready", "loading")]

    def pick_worker(self, key: str, candidates: list[WorkerHandle]) -> tuple[WorkerHandle | None, WorkerHandle | None]:
        """(the worker for the next batch of `key`, None) when one has it ready; else (None, the
        worker to ask for a load, or None to wait): concurrent first requests cause one load, and
        a busy holder spills to one more worker, up to instance_group's count."""
        ready = [w for w in candidates if self.state_on(w, key) == "ready"]
        if ready:
            return min(ready, key=lambda w: len(w.in_flight)), None
        holders = self.holders(key)
        if any(self.state_on(w, key) == "loading" for w in holders):
            return None, None  # one load at a time; the requests wait for it in the queue
        config = self.catalog.config_of(key)
        count = config.lifecycle.instance_count if config is not None else 0
        if config is None or (count and len(holders) >= count):
            return None, None  # as many workers as instance_group allows hold it: wait for one of them
        loadable = [w for w in candidates if self.state_on(w, key) == "unloaded"]
        return None, (min(loadable, key=lambda w: len(w.in_flight)) if loadable else None)
