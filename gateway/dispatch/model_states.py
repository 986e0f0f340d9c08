"""The gateway's view of the model lifecycle: which version is loaded where, in which state, why.

Workers list every (model, version) they may serve in READY (`model_states`) and report each
change as MODEL_STATE (worker/models.py). From those reports the gateway
- schedules (gateway/dispatch/fleet.py's `pick_worker`): a batch goes to a worker where its version is
  ready. When no worker has it, one worker gets a LOAD and the requests wait in their queue
  until it is ready, so concurrent first requests cause one load and the wait counts as queue
  time. When every worker holding it is busy, one more worker loads it (up to
  instance_group's count);
- answers (`state_of`, `index_entries`): per version one of unavailable | unloaded | loading |
  ready | unloading | failed | quarantined, with the reason, for the ready endpoints, the 503s
  and /v2/repository/index. `unloaded` means servable: lazy, or evicted; it loads on its
  next request. A version that failed to load fails its queued requests with the load error;
  a load refused by the memory budget fails the requests waiting for it with the numbers;
- counts loads, unloads and load times, and keeps each worker's memory budget for /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringserve.common.messages import ModelState, ModelStateReport, Ready
from ringserve.common.repository.config import ModelConfig
from ringserve.common.supervisor_messages import ReloadWorkers
from ringserve.common.vocabulary import UNLOAD_CAUSES
from ringserve.gateway.core.errors import ModelFailed, Unavailable
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet, WorkerHandle
from ringserve.gateway.dispatch.recovery import Recovery
from ringserve.gateway.dispatch.scheduler import Scheduler
from ringserve.gateway.observe.metrics import Metrics

log = logging.getLogger(__name__)

FIXED_POLL_S = 0.05  # serve_fixed (and load_outcome) look this often whether a worker serves the model


@dataclass(frozen=True)
class AskedLoad:
    """A repository load asked of one worker: the version's report sequence number when it was asked."""

    worker: WorkerHandle
    key: str
    seq: int
    generation: int = -1  # the worker's when asked


# The repository index speaks Triton's states; `model_state` in each entry has ours.
TRITON_STATE = {
    "ready": "READY",
    "unloaded": "READY",
    "loading": "LOADING",
    "unloading": "UNLOADING",
    "failed": "UNAVAILABLE",
    "quarantined": "UNAVAILABLE",
    "unavailable": "UNAVAILABLE",
}
STATE_REASON = {
    "ready": "",
    "unloaded": "not in memory: it loads on its next request",
    "loading": "a worker is loading it",
    "unloading": "a worker is unloading it",
}


class ModelStates:
    """Model versions' states across the workers: reports in, answers and repository loads out."""

    def __init__(
        self, catalog: Catalog, fleet: Fleet, scheduler: Scheduler, recovery: Recovery, metrics: Metrics
    ) -> None:
        self.catalog, self.fleet, self.metrics = catalog, fleet, metrics
        self.scheduler, self.recovery = scheduler, recovery

    # -- reports from workers -------------------------------------------------------------------
    def on_ready(self, worker: WorkerHandle, ready: Ready) -> None:
        """READY: what the worker may serve, by the gateway's keys; its boot loads are counted."""
        if ready.model_states is None:
            return  # a worker without lifecycle reports: `models` lists what it loaded
        worker.models, worker.failed_models, worker.model_states = {}, {}, {}
        for report in ready.model_states:
            # A version the gateway does not know yet comes from a reload that applies after this READY.
            self.fleet.record(worker, self.catalog.key_for(report.model, report.version), report)
            if report.state == "ready":
                self._count_load(report)
        for key, why in ready.failed_models.items():  # ...and the versions whose config it could not build
            if key not in worker.model_states:  # (a model.py's auto_complete_config failed): no report of theirs
                worker.failed_models[key] = why
        self.fleet.budget_bytes[worker.index] = ready.memory_budget_bytes

    def on_model_state(self, worker: WorkerHandle | None, change: ModelState) -> None:
        report = change.report
        key = self.catalog.key_for(report.model, report.version)
        if worker is None or not self.fleet.record(worker, key, report):
            return
        self.metrics.observe_model_state(change)
        if change.loaded:
            self._count_load(report)
        if report.state == "unloaded" and change.cause in UNLOAD_CAUSES:
            self.metrics.model_unloads.labels(report.model, str(report.version), change.cause).inc()
        if change.cause == "budget" and report.reason:
            if not self.fleet.holders(key):  # the budget refused its load and no other worker holds it: 503
                self.recovery.fail_queue(key, Unavailable(report.reason, self.scheduler.settings.retry_after_s))
        elif report.state == "failed":
            self._fail_if_unservable(key)
        self.scheduler.pump()

    def _count_load(self, report: ModelStateReport) -> None:
        self.metrics.model_loads.labels(report.model, str(report.version), report.policy).inc()
        self.metrics.model_load_seconds.labels(report.model, str(report.version)).observe(report.load_s)

    def _fail_if_unservable(self, key: str) -> None:
        """Its load failed: if no worker can serve it now, the requests waiting for it get the error."""
        try:
            self.scheduler.check_available(key)
        except Unavailable as exc:
            self.recovery.fail_queue(key, exc)

    # -- the repository API ---------------------------------------------------------------------
    def unload(self, name: str) -> None:
        """Every worker unloads every version of `name` (once idle); counted as reason api."""
        for worker, config in self._known_versions(name, lambda worker, config: True):
            self.scheduler.request_unload(worker, config)

    def load(self, name: str) -> list[AskedLoad]:
        """Retry failed versions of `name` and load its eager ones again (after an API unload); the
        loads asked, for `load_outcome`."""

        def wanted(worker: WorkerHandle, config: ModelConfig) -> bool:
            state = self.fleet.state_on(worker, config.key)
            return state == "failed" or (state == "unloaded" and config.lifecycle.eager_on(worker.index))

        asked = []
        for worker, config in self._known_versions(name, wanted):
            found = worker.model_states.get(config.key)
            asked.append(AskedLoad(worker, config.key, found.seq if found else 0, worker.generation))
            self.scheduler.request_load(worker, config, "api")
        return asked

    async def load_outcome(self, asked: list[AskedLoad], wait_s: float) -> str | None:
        """Once every worker asked has reported its load's end (a report newer than the one it had when
        asked, in a state other than loading), or has left: why the first failed one failed, or None.
        Unavailable when one still loads after `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            ended = [self._load_ended(load) for load in asked]
            if all(ended):
                return next((why for why in ended if isinstance(why, str)), None)
            if loop.time() > deadline:
                raise Unavailable(
                    f"a worker is still loading it after {wait_s:g} s; its ready endpoint says when it serves",
                    self.scheduler.settings.retry_after_s,
                )
            await asyncio.sleep(FIXED_POLL_S)

    async def lift_outcome(self, config: ModelConfig, since: float, wait_s: float) -> str | None:
        """A repository load lifted the model's quarantine: where the workers skipped it (it crashed or hung
        them while loading), the supervisor replaces them by ones that load it again. None once a ready
        worker holds it; why, once a worker died loading it since `since`; Unavailable after `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            for at, model, reason, index in self.fleet.load_deaths:
                if at >= since and model.split("/")[0] == config.name:
                    return f"worker {index} died while loading it ({reason})"
            if any(config.key in w.models for w in self.fleet.ready_workers()):
                return None
            if loop.time() > deadline:
                raise Unavailable(
                    f"the workers that load it again are still starting after {wait_s:g} s; "
                    "its ready endpoint says when it serves",
                    self.scheduler.settings.retry_after_s,
                )
            await asyncio.sleep(FIXED_POLL_S)

    def _load_ended(self, load: AskedLoad) -> bool | str:
        """False while the worker still loads; True once loaded (or gone); the reason once failed."""
        worker = load.worker
        if worker not in self.fleet.ready_workers() or worker.generation != load.generation:
            died = worker.died_loading  # it died in this very load (a crash, or past its bound): that is the answer
            if died is not None and died[0] >= load.generation and died[1].split("/")[0] == load.key.split("/")[0]:
                return f"worker {worker.index} died while loading it ({died[2]})"
            return True  # its replacement loads what it serves at its start, and says so in its READY
        found = load.worker.model_states.get(load.key)
        if found is None or found.seq <= load.seq or found.state == "loading":
            return False
        return f"worker {load.worker.index}: {found.reason}" if found.state == "failed" else True

    async def serve_fixed(self, config: ModelConfig, wait_s: float) -> None:
        """A model whose config could not be built at start-up reads well now: serve it.

        Workers read the repository only when they start, so each is replaced without downtime
        by one that reads it again (as on SIGHUP). Returns once a worker serves the model;
        ModelFailed when the new workers failed to load it too; Unavailable (transient) when
        they are still starting after `wait_s`.
        """
        self.catalog.add_fixed(config)
        self.scheduler.port.tell_supervisor(ReloadWorkers(config.name))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        replacing = False
        while True:
            replacing = replacing or bool(self.fleet.successors)
            try:
                self.scheduler.check_available(config.key)
                return
            except ModelFailed:
                if replacing and not self.fleet.successors:
                    raise  # every new worker tried, and it failed to load
            except Unavailable:
                pass
            if loop.time() > deadline:
                raise Unavailable(
                    f"model {config.name!r} is loading: the workers that read it are still starting; "
                    "it serves once they are ready",
                    self.scheduler.settings.retry_after_s,
                )
            await asyncio.sleep(FIXED_POLL_S)

    def _known_versions(
        self, name: str, wanted: Callable[[WorkerHandle, ModelConfig], bool]
    ) -> list[tuple[WorkerHandle, ModelConfig]]:
        """(ready worker, version of `name` it reports on) pairs that `wanted` picks."""
        versions = self.catalog.served_versions(name)
        return [
            (worker, config)
            for worker in self.fleet.ready_workers()
            for config in versions
            if config.key in worker.model_states and wanted(worker, config)
        ]

    # -- answers --------------------------------------------------------------------------------
    def state_of(self, key: str) -> tuple[str, str]:
        """(state, reason) of one version across the serving workers."""
        try:
            self.scheduler.check_available(key)
        except Unavailable as exc:
            if key in self.recovery.quarantined:
                return "quarantined", str(exc)
            failed = any(key in w.failed_models for w in self.fleet.serving())
            return ("failed" if failed else "unavailable"), str(exc)
        states = {self.fleet.state_on(w, key) for w in self.fleet.serving() if key in w.models}
        for state in ("ready", "loading", "unloading", "unloaded"):
            if state in states:
                return state, STATE_REASON[state]
        return "unavailable", "no serving worker has it"

    def unservable(self) -> dict[str, str]:
        """Model key -> why, for each version of the repository that cannot serve: its config could not
        be built, or a serving worker failed to load it (--strict-readiness)."""
        failed = dict(self.catalog.failed_configs)
        for worker in self.fleet.serving():
            failed.update(worker.failed_models)
        return failed

    def memory_of(self, key: str) -> int:
        return sum(w.model_states[key].memory_bytes for w in self.fleet.serving() if key in w.model_states)

    def index_entries(self, name: str, unloaded_why: str | None) -> list[dict[str, Any]] | None:
        """Index entries of every version of `name`; None for a model this view does not know."""
        failed = {k: why for k, why in self.catalog.failed_configs.items() if k == name or k.startswith(name + "/")}
        versions = self.catalog.served_versions(name)
        if not versions and not failed:
            return None
        entries = []
        for config in versions:
            state, reason = self.state_of(config.key)
            if unloaded_why is not None:
                state, reason = "unavailable", unloaded_why
            entries.append(
                {
                    "name": name,
                    "version": str(config.version),
                    "state": TRITON_STATE[state],
                    "reason": reason,
                    "model_state": state,
                    "memory_bytes": self.memory_of(config.key),
                    "load_policy": config.lifecycle.load_policy,
                }
            )
        for key, why in failed.items():
            entries.append(
                {
                    "name": name,
                    "version": key.partition("/")[2],
                    "state": "UNAVAILABLE",
                    "reason": f"its config cannot be built: {why}",
                    "model_state": "failed",
                }
            )
        return sorted(entries, key=lambda e: int(e["version"] or 0))
