"""The gateway's view of the model lifecycle: which version is loaded where, in which state, why.

Workers list every (model, version) they may serve in READY ("model_states") and report each
change as MODEL_STATE (worker/models.py). From those reports the gateway
- schedules (`pick_worker`): a batch goes to a worker where its version is ready. When no
  worker has it, one worker gets a LOAD and the requests wait in their queue until it is
  ready, so concurrent first requests cause one load and the wait counts as queue time.
  When every worker holding it is busy, one more worker loads it (up to instance_group's
  count);
- answers (`state_of`, `index_entries`): per version one of unavailable | unloaded | loading |
  ready | unloading | failed | quarantined, with the reason, for the ready endpoints, the 503s
  and /v2/repository/index. `unloaded` means servable: lazy, or evicted; it loads on its
  next request. A version that failed to load fails its queued requests with the load error;
  a load refused by the memory budget fails the requests waiting for it with the numbers;
- counts loads, unloads and load times, and keeps each worker's model memory for /metrics.

Versions: the dispatcher's queues are per model key ('m' for the default version, 'm/2' for
version 2), so `/v2/models/m/versions/2/infer` reaches version 2 and no other.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from ringserve.common import wire
from ringserve.common.config import ModelConfig, RepositoryScan

from .batcher import ModelQueue
from .errors import ModelVersionNotFound, Unavailable

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .workers import WorkerHandle

log = logging.getLogger(__name__)

UNLOAD_REASONS = ("ttl", "lru", "api")  # the causes the unload counter keeps
LOAD_RETRY_S = 0.05
# The repository index speaks Triton's states; `model_state` in each entry has ours.
TRITON_STATE = {"ready": "READY", "unloaded": "READY", "loading": "LOADING", "unloading": "UNLOADING",
                "failed": "UNAVAILABLE", "quarantined": "UNAVAILABLE", "unavailable": "UNAVAILABLE"}
STATE_REASON = {"ready": "", "unloaded": "not in memory: it loads on its next request",
                "loading": "a worker is loading it", "unloading": "a worker is unloading it"}


@dataclass
class VersionOnWorker:
    """One model version in one worker, as the worker last reported it."""

    model: str
    version: int
    state: str  # unloaded | loading | ready | unloading | failed
    reason: str = ""
    memory_bytes: int = 0
    policy: str = "eager"
    seq: int = 0  # the worker's change counter for this version


class ModelStates:
    """Model versions, their states per worker, and the scheduling and answers built on them."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.others: dict[str, dict[int, ModelConfig]] = {}  # model -> its non-default served versions
        self.failed_configs: dict[str, str] = {}  # model key -> why its config could not be built
        self.budget_bytes: dict[int, int] = {}  # worker index -> its --model-memory-budget
        self._pending_scan: RepositoryScan | None = None  # a reload's repository, until it applies

    # -- versions ----------------------------------------------------------------------------
    def add_repository(self, scan: RepositoryScan) -> None:
        """Serve every version of `scan` (the dispatcher already has the default ones)."""
        d = self.dispatcher
        self.failed_configs = dict(scan.failed)
        self.others = {}
        for config in scan.all_versions():
            if config.default_version:
                continue
            self.others.setdefault(config.name, {})[config.version] = config
            queue = d.queues.get(config.key)
            if queue is None or (queue.config != config and not (queue.depth or queue.requeued)):
                d.queues[config.key] = ModelQueue(config, d.segment.data_capacity)

    def on_repository_read(self, scan: RepositoryScan) -> dict[str, ModelConfig]:
        """A reload read the repository: its default versions now, the rest when it applies."""
        self._pending_scan = scan
        return scan.defaults()

    def apply_pending(self) -> None:
        if self._pending_scan is not None:
            scan, self._pending_scan = self._pending_scan, None
            self.add_repository(scan)

    def served_versions(self, name: str) -> list[ModelConfig]:
        default = self.dispatcher.configs.get(name)
        versions = dict(self.others.get(name, {}))
        if default is not None:
            versions[default.version] = default
        return [versions[v] for v in sorted(versions)]

    def version(self, default: ModelConfig, version: str) -> ModelConfig:
        """The config of `version` of the model whose default version is `default` (routes)."""
        found = self.others.get(default.name, {}).get(int(version)) if version.isdigit() else None
        if found is not None:
            return found
        why = self.failed_configs.get(f"{default.name}/{version}")
        if why is not None:
            raise Unavailable(f"model {default.name!r} version {version} cannot be served: {why}",
                              self.dispatcher.settings.retry_after_s)
        served = ", ".join(str(c.version) for c in self.served_versions(default.name))
        raise ModelVersionNotFound(default.name, version, served)

    def check_failed(self, name: str) -> None:
        """503 with the reason for a model whose config could not be built (else it is a 404)."""
        why = self.failed_configs.get(name)
        if why is not None:
            raise Unavailable(f"model {name!r} cannot be served: {why}", self.dispatcher.settings.retry_after_s)

    def key_of(self, model: str, version: int) -> str | None:
        default = self.dispatcher.configs.get(model)
        if default is not None and default.version == version:
            return model
        found = self.others.get(model, {}).get(version)
        return None if found is None else found.key

    def config_of(self, key: str) -> ModelConfig | None:
        queue = self.dispatcher.queues.get(key)
        return None if queue is None else queue.config

    # -- reports from workers ---------------------------------------------------------------------
    def on_ready(self, worker: WorkerHandle, body: dict[str, Any]) -> None:
        """READY: what the worker may serve, by the gateway's keys; its boot loads are counted."""
        states = body.get("model_states")
        if states is None:
            return  # a worker without lifecycle reports: `models` lists what it loaded
        worker.models, worker.failed_models, worker.model_states = {}, {}, {}
        for item in states:
            # A version the gateway does not know yet comes from a reload that applies after this READY.
            key = self.key_of(item["model"], item["version"]) or item.get("key")
            if key is None:
                continue
            self._record(worker, key, item)
            if item["state"] == "ready":
                self._count_load(item)
        self.budget_bytes[worker.index] = body.get("memory_budget_bytes", 0)

    def on_model_state(self, worker: WorkerHandle | None, body: dict[str, Any]) -> None:
        key = self.key_of(body["model"], body["version"]) or body.get("key")
        if worker is None or key is None or not self._record(worker, key, body):
            return
        cause, state = body.get("cause"), body["state"]
        if body.get("loaded"):
            self._count_load(body)
        if state == "unloaded" and cause in UNLOAD_REASONS:
            self.dispatcher.metrics.model_unloads.labels(body["model"], str(body["version"]), cause).inc()
        if cause == "budget" and body.get("reason"):
            self._refused(key, body["reason"])
        elif state == "failed":
            self._fail_if_unservable(key)
        self.dispatcher.pump()

    def _record(self, worker: WorkerHandle, key: str, item: dict[str, Any]) -> bool:
        """Keep the worker's report; False for one older than what we have (it came the other way)."""
        known = worker.model_states.get(key)
        if known is not None and item.get("seq", 0) < known.seq:
            return False
        state = item["state"]
        failed = state == "failed"
        worker.model_states[key] = VersionOnWorker(item["model"], item["version"], state,
                                                   item.get("reason", "") if failed else "",
                                                   item.get("memory_bytes", 0), item.get("policy", "eager"),
                                                   item.get("seq", 0))
        if failed:
            worker.models.pop(key, None)
            worker.failed_models[key] = item.get("reason", "")
        else:
            worker.models[key] = item.get("provider")
            worker.failed_models.pop(key, None)
        return True

    def _count_load(self, item: dict[str, Any]) -> None:
        metrics = self.dispatcher.metrics
        metrics.model_loads.labels(item["model"], str(item["version"]), item.get("policy", "eager")).inc()
        metrics.model_load_seconds.labels(item["model"]).observe(item.get("load_s", 0.0))

    def _fail_if_unservable(self, key: str) -> None:
        """Its load failed: if no worker can serve it now, the requests waiting for it get the error."""
        try:
            self.dispatcher.check_available(key)
        except Unavailable as exc:
            self.dispatcher.fail_queue(key, exc)

    def _refused(self, key: str, reason: str) -> None:
        """The memory budget refused its load: unless another worker holds it, its requests get 503."""
        if not self._holders(key):
            self.dispatcher.fail_queue(key, Unavailable(reason, self.dispatcher.settings.retry_after_s))

    # -- scheduling -------------------------------------------------------------------------------
    @staticmethod
    def state_on(worker: WorkerHandle, key: str) -> str:
        found = worker.model_states.get(key)
        return "ready" if found is None else found.state  # no report: a worker that loads everything

    def _serving(self) -> list[WorkerHandle]:
        return [w for w in self.dispatcher.workers.values() if w.state == "ready" and not w.standby]

    def _holders(self, key: str) -> list[WorkerHandle]:
        return [w for w in self._serving() if key in w.models and self.state_on(w, key) in ("ready", "loading")]

    def pick_worker(self, key: str, candidates: list[WorkerHandle]) -> WorkerHandle | None:
        """The idle worker for the next batch of `key`; None to wait (maybe after asking for a load)."""
        ready = [w for w in candidates if self.state_on(w, key) == "ready"]
        if ready:
            return min(ready, key=lambda w: len(w.in_flight))
        holders = self._holders(key)
        if any(self.state_on(w, key) == "loading" for w in holders):
            return None  # one load at a time; the requests wait for it in the queue
        config = self.config_of(key)
        count = config.lifecycle.instance_count if config is not None else 0
        if count and len(holders) >= count:
            return None  # as many workers as instance_group allows hold it: wait for one of them
        loadable = [w for w in candidates if self.state_on(w, key) == "unloaded"]
        if loadable and config is not None:
            self.request_load(min(loadable, key=lambda w: len(w.in_flight)), config, "lazy")
        return None

    def request_load(self, worker: WorkerHandle, config: ModelConfig, cause: str) -> None:
        d = self.dispatcher
        body = {"model": config.name, "version": config.version, "cause": cause}
        try:
            d.router.send_multipart([wire.control_identity(worker.index, worker.generation),
                                     *wire.encode("LOAD", body)])
        except zmq.ZMQError as exc:  # its loader's connection is not there (yet): ask again shortly
            log.info("cannot ask worker %d to load %s yet (%s); retrying", worker.index, config.key, exc)
            d.loop.call_later(LOAD_RETRY_S, d.pump)
            return
        log.info("asking worker %d to load model %s version %d (%s)", worker.index, config.name, config.version, cause)
        current = worker.model_states.get(config.key)
        worker.model_states[config.key] = VersionOnWorker(  # until the worker says otherwise
            config.name, config.version, "loading", policy=config.lifecycle.load_policy,
            memory_bytes=current.memory_bytes if current else 0, seq=current.seq if current else 0)
        d.loop.call_soon(d._readers[0].drain)  # the ZMQ fd is edge-triggered and fires on send too

    def on_batch_refused(self, batch: Any, body: dict[str, Any]) -> bool:
        """An ERROR for a batch that never ran (budget, failed load, version not served): 503 for
        its requests, no bisection. False for a model error, which the dispatcher handles."""
        if body.get("kind") not in ("budget", "load_failed", "not_served"):
            return False
        error = Unavailable(body.get("error", "the model could not be loaded"), self.dispatcher.settings.retry_after_s)
        for request in batch.requests:
            self.dispatcher._finish(request, error=error)
        self.dispatcher._end_batch(batch)
        return True

    # -- the repository API -------------------------------------------------------------------------
    def unload(self, name: str) -> None:
        """Every worker unloads every version of `name` (once idle); counted as reason api."""
        self._send_to_workers(name, "UNLOAD", lambda worker, config: True)

    def load(self, name: str) -> None:
        """Retry failed versions of `name` and load its eager ones again (after an API unload)."""
        def wanted(worker: WorkerHandle, config: ModelConfig) -> bool:
            state = self.state_on(worker, config.key)
            return state == "failed" or (state == "unloaded" and config.lifecycle.eager_on(worker.index))
        self._send_to_workers(name, "LOAD", wanted)

    def _send_to_workers(self, name: str, kind: wire.Kind, wanted) -> None:
        d = self.dispatcher
        for worker in [w for w in d.workers.values() if w.state == "ready"]:
            for config in self.served_versions(name):
                if config.key not in worker.model_states or not wanted(worker, config):
                    continue
                if kind == "LOAD":
                    self.request_load(worker, config, "api")
                    continue
                try:
                    d.router.send_multipart([wire.control_identity(worker.index, worker.generation),
                                             *wire.encode(kind, {"model": config.name, "version": config.version})])
                except zmq.ZMQError as exc:
                    log.warning("cannot send %s to worker %d: %s", kind, worker.index, exc)
        d.loop.call_soon(d._readers[0].drain)

    # -- answers ------------------------------------------------------------------------------------
    def state_of(self, key: str) -> tuple[str, str]:
        """(state, reason) of one version across the serving workers."""
        d = self.dispatcher
        try:
            d.check_available(key)
        except Unavailable as exc:
            if key in d.quarantined:
                return "quarantined", str(exc)
            failed = any(key in w.failed_models for w in self._serving())
            return ("failed" if failed else "unavailable"), str(exc)
        states = {self.state_on(w, key) for w in self._serving() if key in w.models}
        for state in ("ready", "loading", "unloading", "unloaded"):
            if state in states:
                return state, STATE_REASON[state]
        return "unavailable", "no serving worker has it"

    def memory_of(self, key: str) -> int:
        return sum(w.model_states[key].memory_bytes for w in self._serving() if key in w.model_states)

    def index_entries(self, name: str, unloaded_why: str | None) -> list[dict[str, Any]] | None:
        """Index entries of every version of `name`; None for a model this view does not know."""
        failed = {k: why for k, why in self.failed_configs.items() if k == name or k.startswith(name + "/")}
        versions = self.served_versions(name)
        if not versions and not failed:
            return None
        entries = []
        for config in versions:
            state, reason = self.state_of(config.key)
            if unloaded_why is not None:
                state, reason = "unavailable", unloaded_why
            entries.append({"name": name, "version": str(config.version), "state": TRITON_STATE[state],
                            "reason": reason, "model_state": state, "memory_bytes": self.memory_of(config.key),
                            "load_policy": config.lifecycle.load_policy})
        for key, why in failed.items():
            entries.append({"name": name, "version": key.partition("/")[2], "state": "UNAVAILABLE",
                            "reason": f"its config cannot be built: {why}", "model_state": "failed"})
        return sorted(entries, key=lambda e: int(e["version"] or 0))
