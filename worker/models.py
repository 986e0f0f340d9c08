"""The worker's model lifecycle: every (model, version) it may serve, loaded when needed.

States of one version in one worker:

    unloaded --load--> loading --ok--> ready --unload (ttl | lru | api)--> unloading --> unloaded
                          '--runtime error--> failed   (kept until a LOAD from the repository API)

- References: `acquire` (the batch loop, before it runs a batch) holds one until `release`.
  A version with a reference is never unloaded, whatever the pressure.
- Memory budget (bytes, 0 = none): before a load, unreferenced versions are evicted until
  the load fits: the highest `eviction_priority` first (config.json; lower = evicted
  later), least recently used first among equals; if it cannot fit even then, BudgetExhausted and nothing
  is evicted. A first load is estimated from the size of its files; the footprint measured
  right after the load replaces the estimate, and if it overshoots, more idle versions go
  (or this one does, with BudgetExhausted).
- Threads: the batch loop (acquire/release) and the loader thread (LOAD and UNLOAD from the
  gateway, and TTL reaping: worker/threads.py). One load or unload at a time (`_memory_lock`),
  so the memory measured around a load is that load's; state and references change under
  `_lock`. `notify` is called in the thread that made the change. Code run by a load (a BLS
  request in initialize) gets only ready versions (ModelNotReady otherwise): never a nested load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ringserve.common import messages
from ringserve.common.repository.config import ModelConfig
from ringserve.common.vocabulary import CAUSE_PEAK, ChangeCause, LoadCause, ModelVersionState

from .errors import BudgetExhausted, ModelLoadFailed, ModelNotReady, ModelNotServed
from .footprint import MemoryMeter, trim
from .progress import CALLS
from .runner import Runner
from .warmup import WarmupFailed, warm_up

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ModelEntry:
    config: ModelConfig
    state: ModelVersionState = "unloaded"
    session: Any = None
    refs: int = 0
    peak_refs: int = 0  # the most references it ever had at once
    last_used: float = 0.0
    memory_bytes: int = 0  # measured while loaded; the reservation (estimate) while loading
    measured_bytes: int = 0  # the last measured footprint: the next load's estimate
    reason: str = ""  # failed: the runtime's error
    unload_requested: bool = False  # an API unload, carried out once the version is idle
    load_s: float = 0.0  # how long its last load (and warmup) took
    seq: int = 0  # counts its state changes: the gateway ignores a report older than one it has

    @property
    def label(self) -> str:
        return f"{self.config.name} version {self.config.version}"

    def describe(self) -> messages.ModelStateReport:
        """What the gateway is told of it (Ready's model_states, ModelState's report)."""
        return messages.ModelStateReport(
            model=self.config.name,
            version=self.config.version,
            key=self.config.key,
            state=self.state,
            reason=self.reason,
            memory_bytes=self.memory_bytes,
            load_s=self.load_s,
            seq=self.seq,
            policy=self.config.lifecycle.load_policy,
            provider=getattr(self.session, "provider", None),
            peak_refs=self.peak_refs,
        )


def files_bytes(config: ModelConfig) -> int:
    """Size of the version's directory (model.onnx and any external weights): a first-load estimate."""
    directory = Path(config.model_path).parent
    try:
        return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    except OSError:
        return 0


def eviction_order(entry: ModelEntry) -> tuple[int, float]:
    """Sort key of idle versions: the first is evicted first (highest priority number, then LRU)."""
    return -entry.config.lifecycle.eviction_priority, entry.last_used


class ModelRegistry:
    """Owns the sessions of one worker by (model, version): states, references, budget, TTL."""

    def __init__(
        self,
        configs: Iterable[ModelConfig],
        *,
        open_session: Callable[[ModelConfig], Runner],
        warm: Callable[[ModelConfig, Runner], None] = warm_up,
        budget_bytes: int = 0,
        meter: MemoryMeter | None = None,
        marker: Path | None = None,
        notify: Callable[[messages.ModelState], None] = lambda event: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entries = {(c.name, c.version): ModelEntry(c) for c in configs}
        self._defaults = {c.name: c.version for c in self.entries_configs() if c.default_version}
        self.open_session = open_session
        self.warm = warm  # worker/warmup.py: runs inside the load, before the version is ready
        self.budget_bytes = budget_bytes
        self.meter = meter or MemoryMeter()
        self.marker = marker  # names the version loading now, for the supervisor's blame after a crash
        self.notify = notify
        self.clock = clock
        self._lock = threading.Condition()
        self._memory_lock = threading.Lock()
        self._loading_thread: int | None = None  # the thread that holds _memory_lock for a load

    def entries_configs(self) -> list[ModelConfig]:
        return [e.config for e in self.entries.values()]

    def entry(self, model: str, version: int | None = None) -> ModelEntry:
        """The version `version` of `model` (None: its default version); ModelNotServed if absent."""
        found = self.entries.get((model, self._defaults.get(model, -1) if version is None else version))
        if found is None:
            raise ModelNotServed(model, version)
        return found

    def used_bytes(self) -> int:
        return sum(e.memory_bytes for e in self.entries.values())

    def describe(self) -> list[messages.ModelStateReport]:
        with self._lock:
            return [e.describe() for e in self.entries.values()]

    # -- the batch loop --------------------------------------------------------------------
    def acquire(self, model: str, version: int | None = None) -> ModelEntry:
        """A ready version with one more reference; loads it here if it is not loaded (lazy)."""
        entry = self.entry(model, version)
        if self._loading_thread == threading.get_ident():
            return self._acquire_in_load(entry)
        while True:
            with self._lock:
                while entry.state in ("loading", "unloading"):
                    self._lock.wait()  # the loader thread is on it; it notifies every change
                if entry.state == "ready":
                    self._hold(entry)
                    return entry
                if entry.state == "failed":
                    raise ModelLoadFailed(entry.config.name, entry.config.version, entry.reason)
            if self.load(model, entry.config.version, cause="lazy", hold=True):
                return entry

    def _acquire_in_load(self, entry: ModelEntry) -> ModelEntry:
        """From inside a load (a BLS request in initialize): only a ready version. Loading another here
        would take _memory_lock again, and waiting for one loading would wait for this very load."""
        with self._lock:
            if entry.state == "ready":
                self._hold(entry)
                return entry
            if entry.state == "failed":
                raise ModelLoadFailed(entry.config.name, entry.config.version, entry.reason)
            raise ModelNotReady(entry.config.name, entry.config.version, entry.state)

    def release(self, entry: ModelEntry) -> None:
        with self._lock:
            entry.refs -= 1
            entry.last_used = self.clock()

    def _hold(self, entry: ModelEntry) -> None:
        entry.refs += 1
        entry.last_used = self.clock()
        if entry.refs > entry.peak_refs:  # rare: a few times per version and process
            entry.peak_refs = entry.refs
            if entry.state == "ready":  # while loading, the READY report to come carries it
                self._set(entry, "ready", cause=CAUSE_PEAK)

    # -- loading ---------------------------------------------------------------------------
    def load(self, model: str, version: int, cause: LoadCause, *, hold: bool = False, may_evict: bool = True) -> bool:
        """Load one version (a no-op when ready); True when it is ready (and held, with `hold`).

        Raises ModelLoadFailed (the version is `failed` until an `api` load retries it) or
        BudgetExhausted (it stays `unloaded` and nothing was evicted for it).
        """
        entry = self.entry(model, version)
        with self._memory_lock:
            with self._lock:
                if cause == "api":
                    entry.unload_requested = False  # a repository load overrides an earlier unload
                if entry.state == "ready":
                    if hold:
                        self._hold(entry)
                    else:
                        self._set(entry, "ready", cause=cause)  # a LOAD for a loaded version: say so
                    return True
                if entry.state == "failed" and cause != "api":
                    self._set(entry, "failed", cause=cause)
                    raise ModelLoadFailed(model, version, entry.reason)
                if entry.state in ("loading", "unloading"):
                    return False  # cannot happen under _memory_lock; the caller looks again
                estimate = entry.measured_bytes or files_bytes(entry.config)
                victims = self._victims(entry, estimate, may_evict)
                if victims is None:
                    raise self._refuse(entry, estimate, may_evict)
                for victim in victims:
                    self._set(victim, "unloading", cause="lru")
                entry.memory_bytes, entry.reason = estimate, ""
                self._set(entry, "loading", cause=cause)
            for victim in victims:
                self._close(victim, "lru")
            self._loading_thread = threading.get_ident()
            try:
                session, load_s = self._open(entry, cause)
            finally:
                self._loading_thread = None
            with self._lock:
                entry.session, entry.memory_bytes = session, entry.measured_bytes
                victims = self._victims(entry, entry.measured_bytes, may_evict)
                if victims is None:  # it measured bigger than it looked, and nothing can make room
                    refusal = self._refusal(entry, entry.measured_bytes, may_evict)
                    entry.state = "unloading"
                else:
                    for victim in victims:
                        self._set(victim, "unloading", cause="lru")
                    entry.last_used = self.clock()
                    if hold:
                        self._hold(entry)
                    entry.load_s = round(load_s, 6)
                    self._set(entry, "ready", cause=cause, loaded=True)
            if victims is None:
                self._close(entry, "budget", reason=str(refusal))
                log.warning("%s", refusal)
                raise refusal
            for victim in victims:
                self._close(victim, "lru")
            log.info(
                "loaded model %s (%s) in %.3f s: %d bytes; %d of %s bytes in use",
                entry.label,
                cause,
                load_s,
                entry.measured_bytes,
                self.used_bytes(),
                self.budget_bytes or "unlimited",
            )
            return True

    def _open(self, entry: ModelEntry, cause: LoadCause) -> tuple[Runner, float]:
        """Create the session and warm it up (worker/warmup.py), measuring the memory it took; under
        _memory_lock. The loading marker names the version through both: a crash in either, or a call past
        its bound (each is a call with its bound: worker/progress.py), counts against it."""
        if self.marker is not None:
            self.marker.write_text(entry.config.key)
        trim()
        before = self.meter.sample()
        started = time.perf_counter()
        try:
            with CALLS.call(entry.config, "load"):
                session = self.open_session(entry.config)
            try:
                with CALLS.call(entry.config, "warmup"):
                    self.warm(entry.config, session)
            except WarmupFailed:
                close = getattr(session, "close", None)  # a Python model's finalize()
                if close is not None:
                    with CALLS.call(entry.config, "finalize"):
                        close()
                raise
        except Exception as exc:  # noqa: BLE001 - a load that fails for any reason is that model's failure, reported with the reason
            reason = str(exc) if isinstance(exc, WarmupFailed) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                entry.memory_bytes, entry.reason = 0, reason
                self._set(entry, "failed", cause=cause)
            log.error("model %s failed to load: %s", entry.label, reason)
            raise ModelLoadFailed(entry.config.name, entry.config.version, reason) from None
        finally:
            if self.marker is not None:
                self.marker.unlink(missing_ok=True)
        load_s = time.perf_counter() - started
        trim()
        entry.measured_bytes = max(0, self.meter.sample() - before)
        return session, load_s

    def _victims(self, entry: ModelEntry, need_bytes: int, may_evict: bool) -> list[ModelEntry] | None:
        """The idle versions to evict, so that `need_bytes` fits the budget: the highest
        eviction_priority first, least recently used first among equals; None when even evicting
        every idle one would not make room. Under _lock."""
        if not self.budget_bytes:
            return []
        used = sum(e.memory_bytes for e in self.entries.values() if e is not entry)
        idle = (
            sorted(
                (e for e in self.entries.values() if e is not entry and e.state == "ready" and not e.refs),
                key=eviction_order,
            )
            if may_evict
            else []
        )
        victims = []
        for victim in idle:
            if used + need_bytes <= self.budget_bytes:
                break
            victims.append(victim)
            used -= victim.memory_bytes
        return victims if used + need_bytes <= self.budget_bytes else None

    def _refusal(self, entry: ModelEntry, need_bytes: int, may_evict: bool) -> BudgetExhausted:
        """Why `entry` does not fit: the numbers, and which versions hold what cannot be evicted."""
        held = [
            e
            for e in self.entries.values()
            if e is not entry and e.memory_bytes and (e.refs or e.state != "ready" or not may_evict)
        ]
        return BudgetExhausted(
            entry.config.name,
            entry.config.version,
            need_bytes,
            self.budget_bytes,
            sum(e.memory_bytes for e in held),
            [e.label for e in held],
        )

    def _refuse(self, entry: ModelEntry, need_bytes: int, may_evict: bool) -> BudgetExhausted:
        """A load refused before it started: the version stays as it was; the gateway is told why."""
        refusal = self._refusal(entry, need_bytes, may_evict)
        self._set(entry, entry.state, cause="budget", reason=str(refusal))
        log.warning("%s", refusal)
        return refusal

    # -- unloading -------------------------------------------------------------------------
    def unload(self, model: str, version: int, cause: LoadCause) -> bool:
        """Unload one idle version now (True), or mark an API unload for when it is idle (False)."""
        entry = self.entry(model, version)
        with self._lock:
            if entry.state != "ready":
                if entry.state == "failed" and cause == "api":
                    entry.reason = ""
                    self._set(entry, "unloaded", cause="api")
                elif entry.state == "loading" and cause == "api":
                    entry.unload_requested = True  # unloaded by `reap` once the load is done
                return entry.state == "unloaded"
            if entry.refs or not self._memory_lock.acquire(blocking=False):
                entry.unload_requested = entry.unload_requested or cause == "api"
                return False
            entry.unload_requested = False
            self._set(entry, "unloading", cause=cause)
        try:
            self._close(entry, cause)
        finally:
            self._memory_lock.release()
        return True

    def reap(self) -> None:
        """Between batches: unload versions idle past their ttl_s, and API unloads that had to wait."""
        now = self.clock()
        with self._lock:
            due = [
                (e, "api" if e.unload_requested else "ttl")
                for e in self.entries.values()
                if e.state == "ready"
                and not e.refs
                and (e.unload_requested or (e.config.lifecycle.ttl_s and now - e.last_used >= e.config.lifecycle.ttl_s))
            ]
        for entry, cause in due:
            self.unload(entry.config.name, entry.config.version, cause)

    def _close(self, entry: ModelEntry, cause: LoadCause, *, reason: str | None = None) -> None:
        """Drop the session of an `unloading` version and give its memory back; under _memory_lock."""
        with self._lock:
            session, entry.session = entry.session, None
        close = getattr(session, "close", None)  # a Python model's finalize() (worker/python/python_model.py)
        if close is not None:
            with CALLS.call(entry.config, "finalize"):
                close()
        del session  # the last reference: ORT frees the session's memory here
        trim()
        with self._lock:
            entry.memory_bytes = 0
            self._set(entry, "unloaded", cause=cause, reason=reason)
        log.info("unloaded model %s (%s)", entry.label, cause)

    def _set(
        self,
        entry: ModelEntry,
        state: ModelVersionState,
        *,
        cause: ChangeCause,
        loaded: bool = False,
        reason: str | None = None,
    ) -> None:
        """Change state (under _lock), wake waiters and tell the gateway.

        `reason` tells why this change happened (a budget refusal) without keeping it as the
        version's own reason, which only a failed load sets.
        """
        entry.state = state
        entry.seq += 1
        self._lock.notify_all()
        report = entry.describe()
        if reason is not None:
            report = replace(report, reason=reason)
        self.notify(
            messages.ModelState(
                report=report, cause=cause, loaded=loaded, budget_bytes=self.budget_bytes, used_bytes=self.used_bytes()
            )
        )

    def close_all(self) -> None:
        """At the worker's stop: every loaded version that has a close (a Python model's finalize())
        is unloaded; the others are left to the exit, which frees them faster."""
        for entry in list(self.entries.values()):
            if entry.state == "ready" and not entry.refs and hasattr(entry.session, "close"):
                self.unload(entry.config.name, entry.config.version, "api")

    # -- at start ---------------------------------------------------------------------------
    def load_eager(self, worker_index: int) -> None:
        """Eager versions, before READY. They never evict each other: what does not fit stays lazy."""
        for entry in list(self.entries.values()):
            if not entry.config.lifecycle.eager_on(worker_index):
                continue
            try:
                self.load(entry.config.name, entry.config.version, cause="eager", may_evict=False)
            except BudgetExhausted as exc:
                log.warning("eager model %s stays unloaded until its first request: %s", entry.label, exc)
            except ModelLoadFailed:
                pass  # logged, and reported as failed in READY
